"""A hostile asyncio process (CPython 3.14+): while each of its tasks burns CPU, it corrupts
that task's own asyncio objects with ctypes, as a user may to the memory a profiler reads.

Usage: pyasync_hostile.py SECONDS READY_FILE [honest]

Every task is a child of `main` (one `gather`); each writes its attack once it runs and keeps
it for the whole run (the coroutine attack only while the task burns, restored before each
`await`, since the event loop steps the task through it), burning CPU in `hostile_burn` in
steps of STEP_S. Nothing in the event loop follows the corrupt links until a task completes,
and none does: the process leaves with `os._exit` at the end; the garbage collector, whose
traversal of a task follows the same pointers, is off.

The attacks, one task each:
  self      awaited_by -> the task itself (a one-task cycle)
  pair-a/b  awaited_by -> each other (a two-task cycle, written by pair-a)
  wild      awaited_by -> an unmapped address
  kernel    awaited_by -> a kernel address
  notatask  awaited_by -> a bytes object (not a task; its flag byte is whatever its data is)
  set       awaited_by -> a fake `set` whose mask says 2**62 slots and whose table repeats the
            task itself (every waiter is the task)
  name      task_name -> a fake `str` saying it is 2**62 characters long
  coro      task_coro -> an unmapped address
  deep      awaited_by -> a chain of 300 fake tasks (copies of this one, each awaited by the
            next)
  lattice   awaited_by -> 40 layers of two real (sleeping) tasks, each awaited by both of the
            next layer

With `honest`, the same tree with no attack: `hot_a` does three times `hot_b`'s work.

The offsets are found on the live objects with ctypes (and checked against each other), not
taken from CPython's headers: in a child of `gather`, the word equal to `id(parent)` is
`task_awaited_by` (gather records the awaiting task there), the words equal to `id(coro)` and
`id(name)` are `task_coro` and `task_name`. `FutureObj_HEAD` puts the state (an `int`), then the `char`s
`task_is_task` and `task_awaited_by_is_set` after `task_awaited_by` (as the `.AsyncioDebug`
section of `_asyncio` says: 96, 108 and 109 in sid's 3.14): `is_task` is the byte there that
reads 1 in a task and 0 in a plain future.
"""

import asyncio
import ctypes
import gc
import os
import sys
import time

SECONDS = float(sys.argv[1])
READY = sys.argv[2]
HONEST = len(sys.argv) > 3 and sys.argv[3] == "honest"
STEP_S = 0.02
WILD = 0x00007FF0DEAD0000
KERNEL = 0xFFFF_8880_0000_0000
DEEP = 300
LAYERS = 40

u64 = lambda addr: ctypes.c_uint64.from_address(addr)
u8 = lambda addr: ctypes.c_uint8.from_address(addr)
keep = []  # fake objects, alive until the end


def hostile_burn(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(2000):
            x += i
    return x


def hot_a():
    x = 0
    for i in range(300_000):
        x += i
    return x


def hot_b():
    x = 0
    for i in range(100_000):
        x += i
    return x


def offset_of(obj, value, size):
    hits = [o for o in range(0, size, 8) if u64(id(obj) + o).value == value]
    assert len(hits) == 1, (hits, value)
    return hits[0]


class Offsets:
    pass


OFF = Offsets()


def find_offsets(task, parent):
    size = type(task).__basicsize__
    OFF.size = size
    OFF.awaited_by = offset_of(task, id(parent), size)
    # The byte after `task_awaited_by` (and its 4-byte state) that reads 1 in a task and 0 in
    # a plain future is `is_task`; `awaited_by_is_set` is the next `char`.
    future = asyncio.get_running_loop().create_future()
    flags = [o for o in range(OFF.awaited_by + 8, OFF.awaited_by + 16)
             if u8(id(task) + o).value == 1 and u8(id(future) + o).value == 0]
    assert len(flags) == 1, flags
    OFF.is_task = flags[0]
    OFF.is_set = OFF.is_task + 1
    OFF.coro = offset_of(task, id(task.get_coro()), size)
    OFF.name = offset_of(task, id(task.get_name()), size)


def fake_copy(obj, size, extra=0):
    """A buffer holding a copy of `obj`'s first `size` bytes: a fake object that reads as it."""
    buf = ctypes.create_string_buffer(size + extra)
    ctypes.memmove(buf, id(obj), size)
    keep.append(buf)
    return buf, ctypes.addressof(buf)


def fake_set(members, mask=7, used=None):
    """A fake `set` of `members` (addresses): a real set's header, then its fill, used, mask
    and table (16-byte entries: key, hash) after the 16-byte object header, as
    `PySetObject` has them; every slot past the members is empty (key 0)."""
    model = {1, 2}
    buf, addr = fake_copy(model, type(model).__basicsize__)
    slots = max(mask + 1, len(members))
    table = (ctypes.c_uint64 * (2 * min(slots, 4096)))()
    keep.append(table)
    for i, m in enumerate(members):
        table[2 * i] = m
        table[2 * i + 1] = 7
    u64(addr + 16).value = len(members) if used is None else used
    u64(addr + 24).value = len(members) if used is None else used
    u64(addr + 32).value = mask
    u64(addr + 40).value = ctypes.addressof(table)
    return addr


def attack(kind, me, partner):
    """Writes `kind`'s corruption; returns what to write back: (address, old value) words and
    bytes."""
    t = id(me)
    words = []
    bytes_ = [(t + OFF.is_set, u8(t + OFF.is_set).value)]
    for addr in (t + OFF.awaited_by, t + OFF.name, t + OFF.coro):
        words.append((addr, u64(addr).value))
    if kind == "self":
        u64(t + OFF.awaited_by).value = t
    elif kind == "pair-a":
        p = id(partner)
        words.append((p + OFF.awaited_by, u64(p + OFF.awaited_by).value))
        bytes_.append((p + OFF.is_set, u8(p + OFF.is_set).value))
        u64(t + OFF.awaited_by).value = p
        u64(p + OFF.awaited_by).value = t
        u8(p + OFF.is_set).value = 0
    elif kind == "wild":
        u64(t + OFF.awaited_by).value = WILD
    elif kind == "kernel":
        u64(t + OFF.awaited_by).value = KERNEL
    elif kind == "notatask":
        blob = bytes([1]) * 4096
        keep.append(blob)
        u64(t + OFF.awaited_by).value = id(blob)
    elif kind == "set":
        # A mask of 2**62 - 1 and a table of 1024 entries that all name this task.
        u64(t + OFF.awaited_by).value = fake_set([t] * 1024, mask=(1 << 62) - 1, used=1 << 40)
        u8(t + OFF.is_set).value = 1
    elif kind == "lattice":
        # `partner` is the lattice's layers of sleeping tasks, two a layer: each task is
        # awaited by both tasks of the next layer (a set of two, as when two tasks await the
        # same task), this one by the first layer. Drawn under every waiter, the tree would
        # have 2**LAYERS branches.
        for layer, above in zip(partner, partner[1:] + [None]):
            for task in layer:
                a = id(task)
                u64(a + OFF.awaited_by).value = fake_set([id(x) for x in above]) if above else 0
                u8(a + OFF.is_set).value = 1 if above else 0
        u64(t + OFF.awaited_by).value = fake_set([id(x) for x in partner[0]])
        u8(t + OFF.is_set).value = 1
    elif kind == "name":
        name = me.get_name()
        size = sys.getsizeof(name)
        buf, addr = fake_copy(name, size)
        # PyASCIIObject.length, right after the header.
        u64(addr + 16).value = 1 << 62
        u64(t + OFF.name).value = addr
    elif kind == "coro":
        u64(t + OFF.coro).value = WILD
    elif kind == "deep":
        fakes = [fake_copy(me, OFF.size)[1] for _ in range(DEEP)]
        for a, b in zip(fakes, fakes[1:]):
            u64(a + OFF.awaited_by).value = b
            u8(a + OFF.is_set).value = 0
        u64(fakes[-1] + OFF.awaited_by).value = 0
        u64(t + OFF.awaited_by).value = fakes[0]
    return words, bytes_


def restore(saved):
    words, bytes_ = saved
    for addr, value in reversed(words):
        u64(addr).value = value
    for addr, value in reversed(bytes_):
        u8(addr).value = value


async def attacker(kind, end, partners):
    me = asyncio.current_task()
    await asyncio.sleep(0)
    # The links and the name stay corrupt from here on (only a task's completion and the
    # garbage collector would follow them); the coroutine only while the task burns, since
    # the event loop steps the task through it.
    if kind != "coro":
        attack(kind, me, partners.get(kind))
    while time.monotonic() < end:
        saved = attack(kind, me, None) if kind == "coro" else None
        hostile_burn(STEP_S)
        if saved:
            restore(saved)
        await asyncio.sleep(0)
    # No task may complete (its gather would take it out of a corrupt `awaited_by`), nor
    # anything be freed through a corrupt pointer.
    os._exit(0)


async def honest(fn, end):
    while time.monotonic() < end:
        fn()
        await asyncio.sleep(0)


async def probe():
    await asyncio.sleep(3600)


async def main():
    gc.disable()
    asyncio.current_task().set_name("main")
    end = time.monotonic() + SECONDS
    # Find the offsets on a child of a gather, then start the real tasks.
    p = asyncio.create_task(probe(), name="probe")
    g = asyncio.gather(p)
    await asyncio.sleep(0)
    find_offsets(p, asyncio.current_task())
    p.cancel()
    try:
        await g
    except asyncio.CancelledError:
        pass
    if HONEST:
        tasks = [
            asyncio.create_task(honest(hot_a, end), name="honest-a"),
            asyncio.create_task(honest(hot_b, end), name="honest-b"),
        ]
    else:
        kinds = ["self", "pair-a", "pair-b", "wild", "kernel", "notatask", "set", "name",
                 "coro", "deep", "lattice"]
        partners = {
            "lattice": [
                [asyncio.create_task(probe(), name=f"lattice-{i}-{j}") for j in range(2)]
                for i in range(LAYERS)
            ]
        }
        tasks = [asyncio.create_task(attacker(k, end, partners), name=f"hostile-{k}")
                 for k in kinds]
        by_kind = dict(zip(kinds, tasks))
        partners["pair-a"] = by_kind["pair-b"]
        partners["pair-b"] = by_kind["pair-a"]
    with open(READY, "w") as f:
        f.write(f"{OFF.__dict__}\n")
    await asyncio.gather(*tasks)


asyncio.run(main())
sys.stdout.flush()
os._exit(0)
