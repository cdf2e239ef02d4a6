"""A Python process with known stacks for the python_layout test: the main thread blocks in
inner_日本() under middlé() and outer(); a second thread blocks in Worker.spin_𠀀() under
Worker.run(); a third recurses DEPTH times, then calls leaf() through C (map), which blocks; a
fourth runs Python without a pause (holding the GIL) when the second argument is "spin", else
sleeps.
The names cover CPython's three string kinds (1, 2 and 4 bytes a character). Each marked line
is where its frame waits; the test finds the markers in this text."""

import os
import sys
import threading
import time


class Worker:
    def run(self, ready):
        ready.set()
        self.spin_𠀀()  # MARK worker-call

    def spin_𠀀(self):
        while True:
            time.sleep(0.05)  # MARK worker-leaf


def inner_日本():
    while True:
        time.sleep(0.05)  # MARK main-leaf


def middlé():
    inner_日本()  # MARK middle-call


def outer():
    middlé()  # MARK outer-call


# Deeper than the kernel walk's bound (MAX_STACK_DEPTH, 512), so that the cut is tested.
DEPTH = 600
deep_ready = threading.Event()


def leaf(_):
    deep_ready.set()
    while True:
        time.sleep(0.05)  # MARK deep-leaf


def recurse(n):
    if n == 0:
        return list(map(leaf, [0]))  # MARK deep-through-c
    return recurse(n - 1)  # MARK deep-recurse


def hot():
    spin = len(sys.argv) > 2 and sys.argv[2] == "spin"
    n = 0
    while True:
        if spin:
            n += 1
        else:
            time.sleep(0.05)


ready = threading.Event()
worker = threading.Thread(target=Worker().run, args=(ready,), name="worker", daemon=True)
worker.start()
deep = threading.Thread(target=recurse, args=(DEPTH,), name="deep", daemon=True)
deep.start()
spinner = threading.Thread(target=hot, name="spinner", daemon=True)
spinner.start()
ready.wait()
deep_ready.wait()
# The threads' ids (in this process's pid namespace), then the ready file appears.
report = sys.argv[1]
with open(report + ".tmp", "w") as f:
    f.write(f"{threading.get_native_id()} {worker.native_id} {deep.native_id} {spinner.native_id}\n")
os.rename(report + ".tmp", report)
outer()  # MARK module-call
