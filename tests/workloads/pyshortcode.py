"""pyshortcode: Python functions that live a fraction of a second each.

Usage: python3 pyshortcode.py ROUNDS IDLE

Sleeps IDLE seconds without using CPU (so that a profiler launching it has read the
interpreter), then, ROUNDS times, compiles a new function `work_N` and runs it hot for RUN_SECS;
the process exits right after the last one. A profiler that reads code objects from the live
process names the last functions only if it reads them within RUN_SECS of their first sample.
The functions are kept alive, so that no two code objects share an address (a freed one's
address is soon reused, and a profiler that names frames by code address would give the new
function the old one's name).
"""

import sys
import time

RUN_SECS = 0.15
SOURCE = """
def work_{n}(end):
    spins = 0
    while time.monotonic() < end:
        spins += 1
    return spins
"""


def main(rounds):
    kept = []
    for n in range(rounds):
        scope = {"time": time}
        exec(SOURCE.format(n=n), scope)
        scope["work_%d" % n](time.monotonic() + RUN_SECS)
        kept.append(scope)


if __name__ == "__main__":
    time.sleep(float(sys.argv[2]))
    main(int(sys.argv[1]))
