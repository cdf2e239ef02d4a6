"""pyoffcpu: a worker thread that waits in queue.get() and time.sleep() under known callers.

The worker loops: `wait_for_item` blocks in `queue.get()` until the producer's next item (the
producer puts one every 20 ms), then `nap` sleeps 10 ms in `time.sleep()`. Its waits are about
half and half; the producer's own sleep is under `produce`.

Usage: python3 pyoffcpu.py SECONDS
"""

import queue, sys, threading, time

items = queue.Queue()


def produce(end):
    while time.time() < end:
        time.sleep(0.02)
        items.put(1)
    items.put(None)


def wait_for_item():
    return items.get()


def nap():
    time.sleep(0.01)


def work():
    while wait_for_item() is not None:
        nap()


end = time.time() + float(sys.argv[1])
threads = [threading.Thread(target=produce, args=(end,)), threading.Thread(target=work)]
for t in threads:
    t.start()
for t in threads:
    t.join()
