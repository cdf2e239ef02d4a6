"""pygil: one thread holds the GIL, one runs with it released, for the GIL-state test.

The main thread spins in Python (`spinning`, which always holds the GIL); a second thread hashes
8 MiB buffers (`hashing`: hashlib releases the GIL while it hashes large buffers).

Usage: python3 pygil.py SECONDS
"""

import hashlib, sys, threading, time
data = b"x" * (8 << 20)
def hashing(end):
    while time.time() < end:
        hashlib.sha256(data).digest()
def spinning(end):
    s = 0
    while time.time() < end:
        for i in range(10000):
            s += i
end = time.time() + float(sys.argv[1])
t = threading.Thread(target=hashing, args=(end,))
t.start()
spinning(end)
t.join()
