"""pyshortcode: Python functions that live a fraction of a second each.

Usage: python3 pyshortcode.py ROUNDS IDLE [keep|drop|hash-late]

Sleeps IDLE seconds without using CPU (so that a profiler launching it has read the
interpreter), then, ROUNDS times, compiles a new function `work_N` and runs it hot for RUN_SECS;
the process exits right after the last one. A profiler that reads code objects from the live
process names the last functions only if it reads them within RUN_SECS of their first sample.

`keep` (the default) keeps the functions alive, so that no two code objects share an address.
`drop` frees each function once it ran: CPython soon puts a later function's code object at a
freed one's address, and a profiler that names frames by code address alone gives the new
function the old one's name. With `drop` it prints, for each function once it ran, its code
object's address, the identity bits bpfprof's kernel program records for it (see
`PythonFrame::identity_of`) and the CPU time it took, one `work_N ADDRESS BITS CPU_NS` line
each.

`hash-late` keeps the functions, but gives each a name no one has hashed yet (a new `str`,
as Dynamo's generated code has) and hashes it HASH_AFTER seconds into its run: on 3.10 and 3.11
the kernel reads the name's cached hash, which changes then, so a profiler that named the
frames recorded before by that word would find them "replaced". It prints
`work_N UNHASHED`, UNHASHED 1 where the name's hash was indeed not computed at the start.
"""

import sys
import time
import types

RUN_SECS = 0.15
HASH_AFTER = 0.05
SOURCE = """
def work_{n}(end):
    spins = 0
    while time.monotonic() < end:
        spins += 1
    return spins
"""


def identity_bits(code):
    """What bpfprof's kernel program records of the code object: PythonFrame::identity_of
    the 8 bytes at co_nfreevars (with co_version) from 3.12, else the name's cached hash."""
    import ctypes

    if sys.version_info >= (3, 12):
        word = ctypes.c_uint64.from_address(id(code) + 88).value
    else:
        word = hash(code.co_name) % (1 << 64)
    # 0 means "unknown" to bpfprof: the hash's 0 is recorded as 1.
    return (fmix64(word) >> 57) or 1


def fmix64(x):
    """MurmurHash3's 64-bit finalizer."""
    mask = (1 << 64) - 1
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & mask
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & mask
    return x ^ (x >> 33)


def str_hash_computed(s):
    """Whether CPython has cached `s`'s hash (the field after the length: -1 until then)."""
    import ctypes

    return ctypes.c_int64.from_address(id(s) + 24).value != -1


def hash_late(rounds):
    kept = []
    for n in range(rounds):
        scope = {"time": time}
        exec(SOURCE.format(n=n), scope)
        name = "".join(["work_", str(n)])
        names = {"co_name": name}
        if sys.version_info >= (3, 11):
            names["co_qualname"] = name
        code = scope["work_%d" % n].__code__.replace(**names)
        work = types.FunctionType(code, scope)
        del code
        unhashed = not str_hash_computed(name)
        work(time.monotonic() + HASH_AFTER)
        hash(name)
        work(time.monotonic() + RUN_SECS - HASH_AFTER)
        print("work_%d %d" % (n, unhashed), flush=True)
        kept.append(work)
    # Idle before exiting, so that the last function is named while its process lives: what
    # this mode tests is which name its frames get, not how soon.
    time.sleep(0.5)


def main(rounds, keep):
    kept = []
    for n in range(rounds):
        scope = {"time": time}
        exec(SOURCE.format(n=n), scope)
        work = scope["work_%d" % n]
        code = work.__code__
        address, bits = id(code), identity_bits(code)
        del code
        cpu = time.thread_time_ns()
        work(time.monotonic() + RUN_SECS)
        cpu = time.thread_time_ns() - cpu
        if not keep:
            print("work_%d %d %d %d" % (n, address, bits, cpu), flush=True)
        if keep:
            kept.append(scope)
        else:
            # The function and its globals refer to each other: break the cycle so that its
            # code object is freed now, for the next function's to take its place.
            scope.clear()
        del work, scope


if __name__ == "__main__":
    time.sleep(float(sys.argv[2]))
    mode = sys.argv[3] if len(sys.argv) > 3 else "keep"
    if mode == "hash-late":
        hash_late(int(sys.argv[1]))
    else:
        main(int(sys.argv[1]), mode == "keep")
