"""pyhot: Python functions with known shares, for Python-frame tests.

parent_hot calls leaf_hot three times as often as parent_cold calls leaf_cold, with the same
work per call, so about 3/4 of the time is under parent_hot. With an argument "client", the
work runs inside bpfprof.FunctionProfiler (the Python client), which turns CPython's perf
trampolines on itself; otherwise run it with -X perf.

Usage: python3.12 [-X perf] pyhot.py SECONDS [client SOCKET]
"""

import sys
import time


def leaf_hot(n):
    s = 0
    for i in range(n):
        s += i
    return s


def parent_hot():
    return leaf_hot(100000)


def leaf_cold(n):
    s = 0
    for i in range(n):
        s += i
    return s


def parent_cold():
    return leaf_cold(100000)


def work(seconds):
    end = time.time() + seconds
    while time.time() < end:
        parent_hot()
        parent_hot()
        parent_hot()
        parent_cold()


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    if len(sys.argv) > 3 and sys.argv[2] == "client":
        import bpfprof

        # python_frames="off": the caller checks the trampolines, not the daemon's frame walk.
        profiler = bpfprof.FunctionProfiler(
            stop_at_error=True,
            sample_each=2_000_000,
            socket_path=sys.argv[3],
            python_frames="off",
        )
        profiler.profile(work, seconds)
        print(profiler.profile_result["files"]["folded"])
    else:
        work(seconds)
