"""pyhot: Python functions with known shares, for Python-frame tests.

parent_hot calls leaf_hot three times as often as parent_cold calls leaf_cold, with the same
work per call, so about 3/4 of the time is under parent_hot. With an argument "client", the
work runs inside bpfprof.FunctionProfiler (the Python client), which turns CPython's perf
trampolines on itself; otherwise run it with -X perf.

With PYHOT_TRUTH=FILE in its environment it also measures the truth: the CPU time its thread
spent in parent_hot and in parent_cold, written to FILE as "HOT_NS COLD_NS" (cumulative, about
every 50 ms, replaced atomically), so that a test compares a profile's shares with what the
process really did over the same window, not with the 3:1 of the construction.

Usage: python3.12 [-X perf] pyhot.py SECONDS [client SOCKET]
"""

import os
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
    truth = os.environ.get("PYHOT_TRUTH")
    if truth:
        return work_measured(seconds, truth)
    end = time.time() + seconds
    while time.time() < end:
        parent_hot()
        parent_hot()
        parent_hot()
        parent_cold()


def work_measured(seconds, path):
    clock = time.thread_time_ns
    hot = cold = 0
    end = time.time() + seconds
    written = 0.0
    while time.time() < end:
        t0 = clock()
        parent_hot()
        parent_hot()
        parent_hot()
        t1 = clock()
        parent_cold()
        t2 = clock()
        hot += t1 - t0
        cold += t2 - t1
        now = time.monotonic()
        if now - written >= 0.05:
            write_truth(path, hot, cold)
            written = now
    write_truth(path, hot, cold)


def write_truth(path, hot, cold):
    with open(path + ".tmp", "w") as f:
        f.write("%d %d\n" % (hot, cold))
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    if len(sys.argv) > 3 and sys.argv[2] == "client":
        import bpfprof

        profiler = bpfprof.FunctionProfiler(
            stop_at_error=True, sample_each=2_000_000, socket_path=sys.argv[3]
        )
        profiler.profile(work, seconds)
        print(profiler.profile_result["files"]["folded"])
    else:
        work(seconds)
