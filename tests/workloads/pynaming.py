"""pynaming: Python code that makes naming its frames as costly as it can for a profiler.

It runs chains of DEPTH distinct functions, each calling the next, the last spinning for about
one sample; each chain is made of new code objects (a template's code with a new name, a new
file name and a long line table), kept alive so that no two have one address, and each chain is
run once. So nearly every Python frame sampled is a code object never named before, whose
name and file are strings of NAME_CHARS characters outside the Basic Multilingual Plane (4
bytes each in memory). It forks CHILDREN copies of itself after DELAY seconds (so that a run
following children takes them in) and stops after SECONDS.

Usage: python3 pynaming.py CHILDREN SECONDS DELAY NAME_CHARS
"""

import os
import sys
import time
import types

# Functions in a chain: each sample's stack holds this many code objects never seen before.
DEPTH = 100
# Code objects one process keeps alive at most (then it starts again with new ones; older
# ones are freed, and their addresses may be reused).
MAX_LIVE_CODES = 60000
# A character outside the BMP that Python accepts in identifiers unchanged (CJK Extension B).
WIDE = "\U00020000"


def template(n, chain):
    # Many lines make a long line table.
    x = 0
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    x += 1
    if n + 1 < len(chain):
        return chain[n + 1](n + 1, chain)
    end = time.perf_counter() + 0.003
    while time.perf_counter() < end:
        x += 1
    return x


def make_chain(generation, name_chars):
    code = template.__code__
    prefix = WIDE * name_chars
    file = "/" + prefix + "/%d/%d.py" % (os.getpid(), generation)
    chain = []
    for d in range(DEPTH):
        name = prefix + "_%d_%d" % (generation, d)
        c = code.replace(co_name=name, co_qualname=name, co_filename=file)
        chain.append(types.FunctionType(c, template.__globals__, name))
    return chain


def work(seconds, name_chars):
    end = time.time() + seconds
    live = []
    generation = 0
    while time.time() < end:
        chain = make_chain(generation, name_chars)
        chain[0](0, chain)
        live.append(chain)
        generation += 1
        if len(live) * DEPTH >= MAX_LIVE_CODES:
            live = []


def main():
    children, seconds, delay, name_chars = (
        int(sys.argv[1]),
        float(sys.argv[2]),
        float(sys.argv[3]),
        int(sys.argv[4]),
    )
    start = time.time()
    time.sleep(delay)
    for _ in range(children):
        if os.fork() == 0:
            work(seconds - (time.time() - start), name_chars)
            os._exit(0)
    work(seconds - (time.time() - start), name_chars)
    for _ in range(children):
        os.wait()


if __name__ == "__main__":
    main()
