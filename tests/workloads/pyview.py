"""pyview: a Python program whose hot function spends its time in the interpreter's own C code
(allocating and freeing small objects: pymalloc, the eval loop), beside one that calls into an
extension (zlib's deflate), for the tests of the Python view.

alloc_hot builds and drops lists of small tuples and strings three times for each call of
compress_leaf, which compresses random bytes with zlib; each call costs about the same, so
about 3/4 of the CPU time is under alloc_hot and 1/4 under compress_leaf.

Usage: python3 pyview.py SECONDS
"""

import random
import sys
import time
import zlib

# Random bytes zlib must work at (a repeating pattern compresses too fast to be seen).
DATA = random.Random(7).randbytes(1 << 18)


def alloc_hot():
    # A loop, not a list comprehension: before 3.12 a comprehension is a function of its own.
    rows = []
    for i in range(6000):
        rows.append((i, str(i), [i]))
    n = len(rows)
    # Freed here, not as the caller pops this frame: the freeing is this function's work.
    del rows
    return n


def compress_leaf():
    return len(zlib.compress(DATA, 6))


def calibrate():
    """How many alloc_hot calls take as long as one compress_leaf call."""
    t0 = time.thread_time()
    for _ in range(5):
        compress_leaf()
    t1 = time.thread_time()
    for _ in range(5):
        alloc_hot()
    t2 = time.thread_time()
    return max(1, round((t1 - t0) / max(t2 - t1, 1e-6)))


def work(seconds):
    per_compress = calibrate()
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(3 * per_compress):
            alloc_hot()
        compress_leaf()


if __name__ == "__main__":
    work(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
