#!/bin/bash
# A real PyTorch process (docs/benchmarks-notes.md, section 8, "A real PyTorch process"; issue 21, item 7).
# Needs root and the torch venv that `cargo xtask setup` makes. Against the training loop of
# tests/workloads/pytorch_train.py (a small CNN on 2 threads), attached once it has trained:
#  1. `bpfprof --pid P -d 8s` twice: tables built, rows, table memory, build time on the build
#     threads, bpfprof's peak RSS, main-thread stacks that do not reach `_start`;
#  2. a fresh daemon, three runs (`run --async`, `stop` after 4 s, `results --wait`): the time
#     `stop` takes to answer, results ready from the stop, and the daemon's peak RSS (VmHWM)
#     and resident size after the runs.
# BP: the bpfprof to measure (default: the release build).
set -u
BP=${BP:-./target/release/bpfprof}
PY=${PY:-/opt/bpfprof/torch-venv/bin/python}
D=$(mktemp -d /tmp/bpfprof-pytorch-bench.XXXXXX)
trap 'kill $P $DP 2>/dev/null; rm -rf $D' EXIT
ms() { echo $(( $(date +%s%N) / 1000000 )); }

$PY tests/workloads/pytorch_train.py loop 120 $D/ready >/dev/null 2>&1 & P=$!
while [ ! -f $D/ready ]; do sleep 1; done; sleep 2
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

for run in 1 2; do
  $BP --pid $P -d 8s --per-thread -q -o $D/cli.folded --summary-json $D/cli.json
  python3 - "$D" "$run" <<'EOF'
import json, sys
d, run = sys.argv[1], sys.argv[2]
s = json.load(open(f"{d}/cli.json")); c = s["cost"]
main = to_start = 0
for line in open(f"{d}/cli.folded"):
    stack, _, n = line.rstrip("\n").rpartition(" ")
    frames = stack.split(";")
    if "clone3" in frames or not frames:
        continue
    main += int(n)
    if any(f == "_start" or f.startswith("_start ") for f in frames):
        to_start += int(n)
print(f"cli run {run}: tables {c['unwind_tables_built']}, rows {c['unwind_rows_built']}, "
      f"{c['unwind_resident_bytes']/2**20:.1f} MiB, built in {c['unwind_build_secs']*1e3:.0f} ms, "
      f"peak RSS {c['profiler_peak_rss_bytes']/2**20:.1f} MiB, CPU {c['profiler_cpu_secs']:.2f} s; "
      f"main-thread stacks {main}, not reaching _start {main-to_start} "
      f"({100*(main-to_start)/max(main,1):.1f}%)")
EOF
done

$BP daemon --socket $D/sock --state-dir $D/state >/dev/null 2>&1 & DP=$!
while [ ! -S $D/sock ]; do sleep 0.1; done
for run in 1 2 3; do
  id=$($BP run --socket $D/sock --pid $P --async --duration-ms 20000 | sed -n 's/.*Run Id: *//p')
  sleep 4
  t0=$(ms); $BP stop --socket $D/sock --run-id $id >/dev/null; t1=$(ms)
  $BP results --socket $D/sock --run-id $id --wait 30s >$D/results.txt; t2=$(ms)
  samples=$(sed -n 's/^Total samples: *//p' $D/results.txt)
  echo "daemon run $run: samples $samples, stop answered in $((t1-t0)) ms, results ready $((t2-t1)) ms after it"
done
echo "daemon: $(grep VmHWM /proc/$DP/status | tr -s ' '), $(grep VmRSS /proc/$DP/status | tr -s ' ')"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
