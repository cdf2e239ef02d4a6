#!/bin/bash
# Timeline cost (docs/benchmarks-notes.md, "Timeline cost"), three arms: a bpfprof from before the
# timeline, this one without --timeline, and with it; bpfprof --bpf-stats on two hotcold processes at 999 Hz for 3 s,
# arms rotated, 5 rounds. Prints: arm, program run time T (ns), runs N, target samples S.
# MAIN: a bpfprof built before the timeline (e.g. from main before it was merged).
MAIN=${MAIN:?set MAIN to a bpfprof without the timeline}
BP=${BP:-./target/debug/bpfprof}
W=$(ls -d target/debug/build/bpfprof-tests-*/out/hotcold | head -1)
$W 300 & A=$!
$W 300 & B=$!
sleep 0.5
for r in 1 2 3 4 5; do
  for arm in main off on; do
    bin=$BP; extra=""
    [ $arm = main ] && bin=$MAIN
    [ $arm = on ] && extra="--timeline"
    $bin --pid $A --pid $B -F 999 -d 3s --bpf-stats -q $extra \
      -o ${TMPDIR:-/tmp}/timeline-cost-$arm.folded --summary-json ${TMPDIR:-/tmp}/timeline-cost-$arm.json
    python3 -c "
import json; d=json.load(open('${TMPDIR:-/tmp}/timeline-cost-$arm.json')); c=d['cost']
print('$arm', c['bpf_run_time_ns'], c['bpf_run_count'], d['samples_seen'])"
  done
done
kill $A $B
