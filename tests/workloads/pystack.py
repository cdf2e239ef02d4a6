"""A Python process with known stacks for the Python layout test (tests/tests/python/layout.rs): the main thread blocks in
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


def report_when_waiting():
    """Writes the threads' ids (in this process's pid namespace) to the ready file once the
    other three are each in their marked wait: on a busy machine, a walk right after they were
    started found the main thread still on its way there, its stack `<module>` alone."""
    waits = {MAIN: "inner_日本", worker.ident: "spin_𠀀", deep.ident: "leaf"}
    while True:
        frames = sys._current_frames()
        if all(t in frames and frames[t].f_code.co_name == n for t, n in waits.items()):
            break
        time.sleep(0.005)
    report = sys.argv[1]
    ids = [threading.main_thread().native_id, worker.native_id, deep.native_id]
    with open(report + ".tmp", "w") as f:
        f.write(" ".join(str(i) for i in ids + [threading.get_native_id()]) + "\n")
    os.rename(report + ".tmp", report)


def hot():
    report_when_waiting()
    spin = len(sys.argv) > 2 and sys.argv[2] == "spin"
    n = 0
    while True:
        if spin:
            n += 1
        else:
            time.sleep(0.05)


MAIN = threading.get_ident()
ready = threading.Event()
worker = threading.Thread(target=Worker().run, args=(ready,), name="worker", daemon=True)
worker.start()
deep = threading.Thread(target=recurse, args=(DEPTH,), name="deep", daemon=True)
deep.start()
ready.wait()
deep_ready.wait()
# The spinner writes the ready file (the threads' ids) once this thread is in inner_日本.
spinner = threading.Thread(target=hot, name="spinner", daemon=True)
spinner.start()
outer()  # MARK module-call
