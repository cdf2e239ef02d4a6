"""pywalk: Python programs of known shape for the tests of the kernel's CPython walk.

Usage: python3 pywalk.py SECONDS [IDLE [DEPTH]]

Sleeps IDLE seconds (default 0) without using CPU, so that a profiler launching it has read
the interpreter before the work starts; then runs for SECONDS. The main thread calls recurse() DEPTH (default 50) levels deep; the deepest level calls
compress_leaf(), which spends its time in zlib's C code (deflate) under that Python frame.
Meanwhile a ThreadPoolExecutor of WORKERS threads each run pool_task(), a pure-Python loop,
so every worker thread's samples carry the frames pool_task <- the executor's _worker.
"""

import random
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

DEPTH = 50
WORKERS = 3
# 4 MiB that zlib must work at (a repeating pattern compresses too fast to be seen).
DATA = random.Random(7).randbytes(1 << 22)


def compress_leaf():
    return len(zlib.compress(DATA, 6))


def recurse(depth):
    if depth > 1:
        return recurse(depth - 1)
    return compress_leaf()


def pool_task(seconds):
    end = time.time() + seconds
    total = 0
    while time.time() < end:
        for i in range(10000):
            total += i
    return total


def main(seconds):
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = [pool.submit(pool_task, seconds) for _ in range(WORKERS)]
        end = time.time() + seconds
        while time.time() < end:
            recurse(DEPTH)
        for future in futures:
            future.result()


if __name__ == "__main__":
    if len(sys.argv) > 3:
        DEPTH = int(sys.argv[3])
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
