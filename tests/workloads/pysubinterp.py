"""A CPython 3.13 process with a thread running in a subinterpreter, for the Python layout test (tests/tests/python/layout.rs): the
thread's state in the subinterpreter (where it runs now) holds sub_leaf() under the
subinterpreter's <module>; the main thread waits in main_wait()."""

import os
import sys
import threading
import time

import _interpreters as interpreters  # 3.13

report = sys.argv[1]
# The subinterpreter's code; it signals that it runs by creating a file.
SUB = f"""import time
open({report + ".sub"!r}, "w").close()
def sub_leaf():
    while True:
        time.sleep(0.05)  # MARK sub-leaf
sub_leaf()  # MARK sub-module
"""
interp = interpreters.create()


def in_sub():
    interpreters.run_string(interp, SUB)


def main_wait():
    while True:
        time.sleep(0.05)  # MARK main-wait


sub = threading.Thread(target=in_sub, name="sub", daemon=True)
sub.start()
while not os.path.exists(report + ".sub"):
    time.sleep(0.01)
with open(report + ".tmp", "w") as f:
    f.write(f"{threading.get_native_id()} {sub.native_id}\n")
os.rename(report + ".tmp", report)
main_wait()  # MARK main-module
