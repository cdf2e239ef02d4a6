#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target under fuzz/corpus/TARGET/, from real inputs and
from the hostile cases of issue 23. Run once by hand (`python3 fuzz/seed.py` at the repository
root; it needs gcc, binutils and pyenv's CPythons 3.10 to 3.13 under /root/.pyenv); the corpus
it writes is committed, so CI does not run it. The fuzzer's own finds go into the same folders.

Seeds by target:
- unwind_elf: small real objects gcc builds from tests/workloads (a shared library with
  `.eh_frame_hdr` and `.plt`, relocatable objects with bare `.eh_frame`, gcc's stack
  realignment, `.debug_frame` only), the vDSO, and the hostile object of item 6: an
  `.eh_frame_hdr` whose entries all point at one large FDE.
- unwind_cfi: the same objects' CFI sections in `bpfprof_fuzz::CfiInput`'s layout.
- perf_map: a real perf map CPython 3.12 writes with `-X perf`, and hostile ones (one huge line,
  overflowing sizes, NULs and CRs, overlapping symbols).
- python_linetable: real `co_linetable`s of CPython 3.10 (PEP 626) and 3.11-3.13 (locations).
- python_layout: the real `_Py_DebugOffsets` of CPython 3.13.0, and broken ones.
- python_code: real code objects (with their type, names, file and line table) of CPython 3.10
  to 3.13 copied into an image of the target's memory, names of each `str` kind, and a cyclic
  one (every pointer back at the code object itself).
- protocol: the requests and replies of docs/protocol.md, and hostile lines.
- stripped_names: unwind_elf's shared objects, and a stripped library whose exported function
  GCC splits into a `.cold` part (`-freorder-blocks-and-partition`).
"""

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
PYENV = "/root/.pyenv/versions"
PYTHONS = {10: "3.10.13", 11: "3.11.7", 12: "3.12.1", 13: "3.13.0"}
# Where python_code maps its image (fuzz_targets/python_code.rs's IMAGE_BASE).
IMAGE_BASE = 0x2000_0000_0000


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, **kw).stdout


# ---------------------------------------------------------------- ELF objects and their CFI


def sections(path):
    """name -> (address, file offset, size) of an ELF file's sections, from readelf."""
    out = run("readelf", "-SW", path).decode()
    found = {}
    for m in re.finditer(
        r"\]\s+(\S+)\s+\S+\s+([0-9a-f]{16})\s+([0-9a-f]{6,})\s+([0-9a-f]{6,})", out
    ):
        found[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16))
    return found


def cfi_input(path):
    """The object's CFI in unwind_cfi's layout (see fuzz/src/lib.rs, CfiInput)."""
    data = open(path, "rb").read()
    secs = sections(path)
    text = secs.get(".text", (0, 0, 0))
    if ".eh_frame" in secs and secs[".eh_frame"][2]:
        cfi, flags = secs[".eh_frame"], 0
    else:
        cfi, flags = secs[".debug_frame"], 2
    hdr = secs.get(".eh_frame_hdr")
    if hdr and flags == 0:
        flags |= 1
    else:
        hdr = (0, 0, 0)
    body_hdr = data[hdr[1] : hdr[1] + hdr[2]]
    body_cfi = data[cfi[1] : cfi[1] + cfi[2]]
    header = struct.pack(
        "<BIIIIH", flags, text[0], text[2], cfi[0], hdr[0], len(body_hdr)
    )
    return header + body_hdr + body_cfi


BIG_FDE_ROWS = 1000
SMALL_FUNCTIONS = 600


def hostile_eh_frame_hdr(workdir):
    """Issue 23 item 6: a shared object whose `.eh_frame_hdr` lists many functions, every entry
    pointing at one FDE of many rows (the builder once evaluated that FDE once per entry)."""
    src = os.path.join(workdir, "hdr.c")
    with open(src, "w") as f:
        body = "".join(
            "nop\\n.cfi_adjust_cfa_offset 8\\nnop\\n.cfi_adjust_cfa_offset -8\\n"
            for _ in range(BIG_FDE_ROWS // 2)
        )
        f.write(
            f'__asm__(".globl big\\nbig:\\n.cfi_startproc\\n{body}ret\\n.cfi_endproc\\n");\n'
        )
        for i in range(SMALL_FUNCTIONS):
            f.write(f"int f{i}(int x) {{ return x + {i}; }}\n")
    so = os.path.join(workdir, "hdr.so")
    run("gcc", "-O1", "-shared", "-fPIC", "-nostdlib", "-o", so, src)
    run("strip", "-s", so)
    data = bytearray(open(so, "rb").read())
    addr, off, size = sections(so)[".eh_frame_hdr"]
    version, ptr_enc, count_enc, table_enc = data[off : off + 4]
    assert (version, table_enc) == (1, 0x3B), "datarel sdata4 search table"
    (count,) = struct.unpack_from("<I", data, off + 8)
    entries = off + 12
    # The FDE with the most rows is the largest: `big`.
    sizes = []
    eh_addr, eh_off, _ = sections(so)[".eh_frame"]
    for i in range(count):
        (fde,) = struct.unpack_from("<i", data, entries + 8 * i + 4)
        (length,) = struct.unpack_from("<I", data, eh_off + (addr + fde - eh_addr))
        sizes.append((length, fde))
    _, big = max(sizes)
    for i in range(count):
        struct.pack_into("<i", data, entries + 8 * i + 4, big)
    hostile = os.path.join(workdir, "hdr-hostile.so")
    open(hostile, "wb").write(data)
    return hostile, count


def elf_seeds(workdir):
    w = os.path.join(ROOT, "tests", "workloads")
    builds = {
        # A shared library: .eh_frame_hdr, .plt (GNU ld's PLT CFA expression).
        "libhot.so": ["-O2", "-shared", "-fPIC", f"{w}/libhot.c", "-lc"],
        # Relocatable objects: bare .eh_frame.
        "nofp.o": ["-O2", "-fomit-frame-pointer", "-c", f"{w}/nofp.c"],
        "nofp_realign.o": ["-O2", "-fomit-frame-pointer", "-c", f"{w}/nofp_realign.c"],
        # .debug_frame only.
        "nofp-debug-frame.o": [
            "-O2", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-c",
            f"{w}/nofp.c",
        ],
        # IBT: .plt.sec.
        "nofp_ibt.so": ["-O2", "-shared", "-fPIC", "-fcf-protection=full", f"{w}/nofp_ibt.c"],
    }
    objects = []
    for name, args in builds.items():
        out = os.path.join(workdir, name)
        run("gcc", *args, "-o", out)
        if "debug-frame" in name:
            run("objcopy", "--strip-debug", "--keep-section=.debug_frame", out)
        else:
            run("strip", "-s", out) if name.endswith(".so") else run("strip", "-g", out)
        objects.append((name, out))
    vdso = os.path.join(workdir, "vdso.so")
    code = (
        "import re\n"
        "for l in open('/proc/self/maps'):\n"
        "    if l.strip().endswith('[vdso]'):\n"
        "        a, b = (int(x, 16) for x in l.split()[0].split('-'))\n"
        "        m = open('/proc/self/mem', 'rb'); m.seek(a)\n"
        f"        open({vdso!r}, 'wb').write(m.read(b - a))\n"
    )
    run(sys.executable, "-c", code)
    objects.append(("vdso.so", vdso))
    hostile, count = hostile_eh_frame_hdr(workdir)
    objects.append((f"hostile-eh-frame-hdr-{count}-entries-one-fde.so", hostile))
    for name, path in objects:
        write("unwind_elf", name, open(path, "rb").read())
        write("unwind_cfi", name, cfi_input(path))
        if name.endswith(".so"):
            write("stripped_names", name, open(path, "rb").read())
    stripped_seeds(workdir)


COLD = r'''
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline, cold)) void report(int v) { fprintf(stderr, "bad %d\n", v); }
int checked_sum(const int *v, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] < 0) {
            report(v[i]);
            abort();
        }
        s += v[i];
    }
    return s;
}
'''


def stripped_seeds(workdir):
    src = os.path.join(workdir, "cold.c")
    open(src, "w").write(COLD)
    out = os.path.join(workdir, "libcold.so")
    run("gcc", "-O2", "-shared", "-fPIC", "-freorder-blocks-and-partition", src, "-o", out)
    symbols = run("nm", out).decode()
    assert "checked_sum.cold" in symbols, "gcc split no .cold part off checked_sum"
    run("strip", "-s", out)
    write("stripped_names", "libcold-split-part.so", open(out, "rb").read())


# ---------------------------------------------------------------- CPython


DUMPER = r'''
import ctypes, json, struct, sys

BASE = %d

def raw(o, n):
    return ctypes.string_at(id(o), n)

def align(b):
    return b + b"\0" * (-len(b) %% 16)

def image(code, cyclic=False):
    """The code object and what it points to, copied into one image at BASE, its pointers to
    them rewritten to the copies."""
    header = bytearray(raw(code, type(code).__basicsize__))
    out = bytearray(align(bytes(header)))
    where = {}
    def place(b):
        nonlocal out
        at = len(out)
        out += align(b)
        return BASE + at
    name_at = place(b"code\0")
    ty = bytearray(raw(type(code), 32))
    struct.pack_into("<Q", ty, 24, name_at)
    where[id(type(code))] = place(bytes(ty))
    names = [code.co_name, code.co_filename, getattr(code, "co_qualname", code.co_name)]
    for s in names:
        where.setdefault(id(s), None)
    for s in names:
        if where[id(s)] is None:
            where[id(s)] = place(raw(s, sys.getsizeof(s)))
    table = code.co_linetable
    where[id(table)] = place(raw(table, sys.getsizeof(table)))
    for at in range(0, len(header) - 7, 8):
        (word,) = struct.unpack_from("<Q", header, at)
        if word in where:
            struct.pack_into("<Q", out, at, BASE if cyclic else where[word])
    return bytes(out)

src = """
def busy(n):
    total = 0
    for i in range(n):
        if i %% 3:
            total += i
        else:
            total -= 1
    return total

class Outer:
    def method(self, x):
        return [y * 2 for y in range(x)]

def caf\u00e9(x):
    return x

def \u51fd\u6570(x):
    return x + 1
"""
ns = {}
exec(compile(src, "/srv/app/\U0001F4C1/module.py", "exec"), ns)
functions = [ns["busy"], ns["Outer"].method, ns["caf\u00e9"], ns["\u51fd\u6570"]]
print(json.dumps({
    "tables": [(f.__code__.co_firstlineno, f.__code__.co_linetable.hex()) for f in functions],
    "images": [image(f.__code__).hex() for f in functions],
    "cyclic": image(functions[0].__code__, cyclic=True).hex(),
}))
'''


def python_seeds():
    for minor, version in PYTHONS.items():
        python = os.path.join(PYENV, version, "bin", f"python3.{minor}")
        dump = json.loads(run(python, "-c", DUMPER % IMAGE_BASE))
        fmt = 0 if minor == 10 else 1
        for i, (first, table) in enumerate(dump["tables"]):
            seed = struct.pack("<BI", fmt, first) + bytes.fromhex(table)
            write("python_linetable", f"cpython-3.{minor}-function{i}", seed)
        selector = minor - 10
        for i, img in enumerate(dump["images"]):
            write("python_code", f"cpython-3.{minor}-code{i}", bytes([selector]) + bytes.fromhex(img))
        write("python_code", f"cpython-3.{minor}-cyclic", bytes([selector]) + bytes.fromhex(dump["cyclic"]))
        if minor == 13:
            code = (
                "import ctypes, sys\n"
                "r = ctypes.c_char.in_dll(ctypes.pythonapi, '_PyRuntime')\n"
                "sys.stdout.buffer.write(ctypes.string_at(ctypes.addressof(r), 584))\n"
            )
            offsets = run(python, "-c", code)
            assert offsets[:8] == b"xdebugpy"
            write("python_layout", "cpython-3.13.0", offsets)
            # Hostile: every offset huge; a 3.12 version; cut short.
            huge = offsets[:16] + b"\xff" * (len(offsets) - 16)
            write("python_layout", "hostile-huge-offsets", huge)
            other = bytearray(offsets)
            struct.pack_into("<Q", other, 8, 0x030C00F0)
            write("python_layout", "hostile-version-3.12", bytes(other))
            write("python_layout", "hostile-cut-short", offsets[:300])
    # A line table of long-form entries with huge deltas (saturating arithmetic), and one that
    # is all continuation bytes.
    write("python_linetable", "hostile-long-deltas", struct.pack("<BI", 1, 2**31) + b"\xf0\x7f\x7f\x7f\x7f\x7f\x3f" * 8)
    write("python_linetable", "hostile-no-entry-start", struct.pack("<BI", 1, 1) + b"\x7f" * 64)


# ---------------------------------------------------------------- perf maps


def perf_map_seeds():
    python = os.path.join(PYENV, PYTHONS[12], "bin", "python3.12")
    code = (
        "import os\n"
        "def work(n):\n    return sum(i * i for i in range(n))\n"
        "class K:\n    def m(self):\n        return work(100)\n"
        "K().m()\n"
        "print(os.getpid())\n"
    )
    pid = run(python, "-X", "perf", "-c", code).decode().strip()
    path = f"/tmp/perf-{pid}.map"
    lines = open(path).read().splitlines()
    os.unlink(path)
    write("perf_map", "cpython-3.12-perf", "\n".join(lines[:40]) + "\n")
    write("perf_map", "node-style", "7f0000001000 40 LazyCompile:*foo app.js:3\n0x7f0000000000 0x100 Builtin:ArrayPush\n")
    write("perf_map", "hostile-huge-line", "7f0000001000 40 " + "A" * 60000 + "\n")
    write("perf_map", "hostile-overflow", "ffffffffffffffff ffffffffffffffff wrap\n0 1 zero\n10 0 empty\n")
    write("perf_map", "hostile-control-bytes", b"7f00 10 a\x00b\r\n7f10 10 \xff\xfe\r\n\r\n  7f20   10   spaced  \n")
    write("perf_map", "hostile-overlapping", "".join(f"1000 {n:x} nested{n}\n" for n in range(1, 200)))


# ---------------------------------------------------------------- protocol


def protocol_seeds():
    requests = [
        '{"version":1,"op":"run","pid":1234,"pid_ns":4026531836,"event":"auto","sample_interval":10000000,'
        '"frequency":null,"duration_ms":600000,"sample_tags":["a","b"],"tags":{"phase":"fwd"},'
        '"max_stack_length":127,"formats":["svg","folded","pprof","speedscope","pstats"],'
        '"follow_children":false,"unwind":"auto","python":"auto"}',
        '{"version":1,"op":"run","pid":42,"frequency":99,"duration_ms":2000,"unwind":"cfi","python":"off"}',
        '{"version":1,"op":"status","run_id":17}',
        '{"version":1,"op":"stop","run_id":17}',
        '{"version":1,"op":"results","run_id":17,"wait_ms":60000}',
        '{"version":1,"op":"read","run_id":17,"format":"svg","offset":0}',
        '{"version":1,"op":"list"}',
    ]
    replies = [
        '{"version":1,"ok":true,"run_id":17,"state":"RUNNING"}',
        '{"version":1,"ok":false,"error":{"code":"not_found","message":"no run 17"}}',
        '{"version":1,"ok":true,"run_id":17,"state":"SUCCESS","reason":null,"samples":2997,'
        '"files":{"svg":"/var/lib/bpfprof/runs/17/profile.svg"},'
        '"top":[{"name":"leaf_hot","self_samples":2100,"total_samples":2100}],"summary":{"samples":2997}}',
        '{"version":1,"ok":true,"data":"PHN2Zz4=","size":123456}',
        '{"version":1,"ok":true,"runs":[{"run_id":17,"state":"SUCCESS","pid":1234,"pid_ns":4026531836,'
        '"owner_uid":1000,"tags":{},"sample_tags":[],"created_unix_ms":1}]}',
    ]
    for i, line in enumerate(requests):
        write("protocol", f"request{i}", line + "\n")
    for i, line in enumerate(replies):
        write("protocol", f"reply{i}", line + "\n")
    write("protocol", "session", "\n".join(requests) + "\n")
    write("protocol", "hostile-nested", '{"version":1,"op":"list","x":' + "[" * 4000 + "]" * 4000 + "}\n")
    write("protocol", "hostile-many-tags", '{"version":1,"op":"run","pid":1,"sample_tags":[' + ",".join('"t"' for _ in range(5000)) + "]}\n")
    write("protocol", "hostile-numbers", '{"version":1e999,"op":"run","pid":-1,"duration_ms":18446744073709551616,"sample_interval":-9223372036854775808}\n')
    write("protocol", "hostile-unknown", '{"version":2,"op":"run","pid":1,"evil":1}\n{"version":1,"op":"results","run_id":1,"wait_ms":18446744073709551615}\n')


# Offsets of the thread-state lists (profiler-user/src/python/layout.rs's tables, 3.10 to
# 3.12): _PyRuntime.interpreters.head, interp.next, interp.threads.head, tstate.next,
# tstate.thread_id.
THREAD_LISTS = {
    10: (32, 0, 8, 8, 176),
    11: (40, 0, 16, 8, 152),
    12: (40, 0, 72, 8, 136),
}


def python_thread_seeds():
    """Images for python_threads: _PyRuntime at the image's start, two interpreters and two
    thread states; a proper list, one that loops within and across interpreters (issue 23 item
    8), and one whose next pointer is wild."""
    for minor, (head, inext, threads, tnext, tid) in THREAD_LISTS.items():
        def image(links, t2_next):
            words = bytearray(0x600)
            def put(at, value):
                words[at:at + 8] = struct.pack("<Q", value)
            interp_a, interp_b, t1, t2 = 0x200, 0x300, 0x400, 0x500
            put(head, IMAGE_BASE + interp_a)
            put(interp_a + threads, IMAGE_BASE + t1)
            put(interp_a + inext, IMAGE_BASE + interp_b if links else 0)
            put(interp_b + threads, IMAGE_BASE + t2)
            put(interp_b + inext, IMAGE_BASE + interp_a if links else 0)
            put(t1 + tnext, IMAGE_BASE + t2 if links else 0)
            put(t2 + tnext, t2_next)
            put(t1 + tid, 11)
            put(t2 + tid, 22)
            return bytes([minor - 10]) + bytes(words)
        write("python_threads", f"cpython-3.{minor}-two", image(False, 0))
        write("python_threads", f"cpython-3.{minor}-looping", image(True, IMAGE_BASE + 0x400))
        write("python_threads", f"cpython-3.{minor}-wild", image(True, 0xdead_beef_0000))


def main():
    with tempfile.TemporaryDirectory() as workdir:
        elf_seeds(workdir)
    python_seeds()
    python_thread_seeds()
    perf_map_seeds()
    protocol_seeds()
    total = 0
    for target in sorted(os.listdir(CORPUS)):
        folder = os.path.join(CORPUS, target)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        total += size
        print(f"{target}: {len(os.listdir(folder))} files, {size} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
