"""A Python thread that gets the thread id of another process's ended thread (the kernel's
pids wrap at pid_max, 32768 on many machines, in minutes on a busy one).

A starts thread TA (a_thread_work, busy) and is sampled for 3 s, then forks B, a copy of its
memory (TA's thread state among it, freed by the child's after-fork clean-up); TA ends. B
starts TC (c_thread_idle, sleeping), which takes that freed memory back (malloc's last freed
chunk of its size), then TB (b_thread_work, busy) with TA's thread id, by writing the id
before it to /proc/sys/kernel/ns_last_pid (root). A profiler that keeps TA's entry for B's
thread walks TC's thread state and names TB's samples c_thread_idle.

Usage: pythread_reuse.py DIR: writes DIR/b, "B_PID TID ATTEMPT" or "none".
"""
import os, sys, threading, time
out = sys.argv[1]
def a_thread_work(stop):
    n = 0
    while not stop.is_set():
        n += 1
def c_thread_idle():
    time.sleep(30)
def b_thread_work(until):
    n = 0
    while time.monotonic() < until:
        n += 1
stop = threading.Event()
t = threading.Thread(target=a_thread_work, args=(stop,))
t.start()
x = t.native_id
time.sleep(3)            # A sampled, its threads listed
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    # B: a copy of A's memory, TA's thread state and frames among it.
    os.close(w)
    end = time.monotonic() + 0.5
    while time.monotonic() < end:   # sampled: B taken in and listed
        pass
    os.read(r, 1)                    # TA has ended in A
    # A thread that takes the freed copy of TA's thread state (malloc's last freed chunk of
    # its size), so that the one TB gets is another.
    tc = threading.Thread(target=c_thread_idle, daemon=True)
    tc.start()
    time.sleep(1)
    for attempt in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(x - 1))
        until = [time.monotonic() + 6]
        tb = threading.Thread(target=lambda: b_thread_work(until[0]))
        tb.start()
        if tb.native_id == x:
            open(out + "/b", "w").write(f"{os.getpid()} {x} {attempt}")
            tb.join()
            break
        until[0] = 0
        tb.join()
    os._exit(0)
os.close(r)
time.sleep(1)
stop.set()
t.join()
os.write(w, b"x")
os.waitpid(pid, 0)
