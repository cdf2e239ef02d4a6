"""pydump: Python threads in known places, for `bpfprof dump`.

The main thread spins in `spin_main` (holding the GIL: no other thread asks for it); the
thread named "worker-a" blocks in `blocked_in_lock`, acquiring a lock the main thread holds
(a wait that releases the GIL).

Usage: python3 pydump.py SECONDS
"""

import sys, threading, time

held = threading.Lock()
held.acquire()


def blocked_in_lock():
    held.acquire()


def spin_main(end):
    s = 0
    while time.time() < end:
        for i in range(10000):
            s += i


end = time.time() + float(sys.argv[1])
worker = threading.Thread(target=blocked_in_lock, name="worker-a", daemon=True)
worker.start()
spin_main(end)
