#!/bin/bash
# How long `bpfprof dump` stops its target (docs/benchmarks-notes.md, "bpfprof dump: how long the target
# is stopped"): N dumps (default 20) of the nofp_dump workload (4 threads: one spinning, three
# blocked) and of tests/workloads/pydump.py under CPython 3.12 (2 threads: one spinning with the
# GIL, one blocked on a lock), as each dump's --json reports it. Prints per target the whole
# process's stop (first interrupt to last release), each thread's (its interrupt to its
# release), the part of it spent waiting for every thread to reach the stop, and the Python
# reads made while stopped, in microseconds; then the load average.
# Run from the checkout's root after `cargo build -p bpfprof-tests` (which builds nofp_dump).
N=${N:-20}
BP=${BP:-./target/debug/bpfprof}
PY=${PY:-$(ls -d ~/.pyenv/versions/3.12.*/bin/python3 | tail -1)}
W=$(ls -d target/debug/build/bpfprof-tests-*/out/nofp_dump | head -1)
$W 300 & C=$!
$PY tests/workloads/pydump.py 300 & P=$!
sleep 2
for pid in $C $P; do
  for i in $(seq "$N"); do $BP dump --pid $pid --json; done | python3 -c '
import json, sys, statistics as st
dec = json.JSONDecoder(); s = sys.stdin.read(); i = 0; total = []; per = []; py = []; reach = []
while True:
    while i < len(s) and s[i].isspace(): i += 1
    if i >= len(s): break
    d, i = dec.raw_decode(s, i)
    total.append(d["stopped_us"]); py.append(d["python_read_us"]); reach.append(d["reaching_stop_us"])
    per += [t["stopped_us"] for t in d["threads"]]
q = lambda v: "median %d, p90 %d, max %d" % (st.median(v), sorted(v)[max(0, int(len(v) * 0.9) - 1)], max(v))
print("%s (%d threads, %d dumps): process %s; of which reaching the stop %s; per thread %s; Python reads %s"
      % (d["comm"], len(d["threads"]), len(total), q(total), q(reach), q(per), q(py)))'
done
kill $C $P
cat /proc/loadavg
