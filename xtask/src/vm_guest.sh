#!/bin/busybox sh
# The init of the vm-test guest (PID 1 in the initramfs `cargo xtask vm-test` builds): mounts
# what bpfprof needs, runs the smoke suite against this kernel and prints one line per test,
#   VMTEST <name> PASS|FAIL <detail>
# on the serial console, then `VMTEST-DONE` and powers off. The host reads those lines; a test
# it expects but does not see (a panic, a hang, a boot failure) is a failure there.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
ip link set lo up 2>/dev/null
ulimit -l unlimited 2>/dev/null

echo "VMTEST-KERNEL $(uname -r)"
cd /tmp

pass() { echo "VMTEST $1 PASS ${2:-}"; }
fail() { echo "VMTEST $1 FAIL ${2:-}"; }
# Shows a file on the console, so that a failure can be read in the host's output.
show() { sed "s/^/    | /" "$1" | head -n "${2:-40}"; }

# --- doctor: every check runs; no FAIL (exit 0), and the program loads and attaches -----------
bpfprof doctor > doctor.txt 2>&1
rc=$?
show doctor.txt 60
bpfprof doctor --json > doctor.json 2>/dev/null
if [ $rc -eq 0 ] && grep -q '"checks"' doctor.json; then pass doctor; else fail doctor "exit $rc"; fi
grep -q '^OK    program_load ' doctor.txt && pass program_load || fail program_load
grep -q '^OK    program_attach ' doctor.txt && pass program_attach || fail program_attach

# --- pid: a live process by pid; leaf_hot under parent_hot in the folded stacks -------------
hotcold 300 &
HOT=$!
sleep 0.3
bpfprof --pid $HOT -d 3s -F 499 -q -o pid.folded > pid.log 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q 'parent_hot;leaf_hot' pid.folded && grep -q 'parent_cold;leaf_cold' pid.folded; then
    pass pid "$(wc -l < pid.folded) stacks"
else
    fail pid "exit $rc"; show pid.log; show pid.folded 10
fi

# --- formats: every output format from one run, each holding the hot function -----------------
bpfprof --pid $HOT -d 2s -F 499 -q -o f.svg -o f.folded -o f.pb.gz -o f.speedscope.json \
    -o f.prof -o f.txt --summary-json f.summary.json > formats.log 2>&1
rc=$?
missing=""
for f in f.svg f.folded f.speedscope.json f.prof f.txt; do
    grep -q leaf_hot "$f" || missing="$missing $f"
done
gunzip -c f.pb.gz | grep -q leaf_hot || missing="$missing f.pb.gz"
grep -q '"samples"' f.summary.json || missing="$missing f.summary.json"
if [ $rc -eq 0 ] && [ -z "$missing" ]; then pass formats; else fail formats "exit $rc, lacking leaf_hot:$missing"; show formats.log; fi

# --- daemon: one run through the socket; the results name the hot function ----------------------
# The socket's and the state's folders must be root's and writable by root only (bpfprof
# refuses a world-writable folder such as /tmp itself for them).
mkdir -m 0700 -p /tmp/d
bpfprof daemon --socket /tmp/d/d.sock --state-dir /tmp/d/state > daemon.log 2>&1 &
DAEMON=$!
i=0
while [ ! -S /tmp/d/d.sock ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
bpfprof run --socket /tmp/d/d.sock --pid $HOT -F 499 --duration-ms 2000 > run.txt 2>&1
rc=$?
BPFPROF_SOCKET=/tmp/d/d.sock bpfprof doctor > doctor-daemon.txt 2>&1
if [ $rc -eq 0 ] && grep -q 'leaf_hot' run.txt && grep -q '^OK    daemon ' doctor-daemon.txt; then
    pass daemon
else
    fail daemon "exit $rc"; show run.txt; show daemon.log; grep daemon doctor-daemon.txt
fi
kill $DAEMON
wait $DAEMON 2>/dev/null
kill $HOT
wait $HOT 2>/dev/null

# --- nspid: PID 1 of a new pid namespace, addressed as NS:1 -------------------------------------
unshare -p -f hotcold 300 &
UNSHARE=$!
sleep 0.3
# The forked child of unshare (busybox here has no pgrep).
INNER=$(awk -v p=$UNSHARE '$1 == "PPid:" && $2 == p { split(FILENAME, f, "/"); print f[3] }' \
    /proc/[0-9]*/status 2>/dev/null)
NS=$(stat -L -c %i /proc/$INNER/ns/pid)
bpfprof --pid "$NS:1" -d 2s -F 499 -q -o ns.folded > ns.log 2>&1
rc=$?
if [ -n "$INNER" ] && [ "$NS" != "$(stat -L -c %i /proc/self/ns/pid)" ] && [ $rc -eq 0 ] \
    && grep -q 'parent_hot;leaf_hot' ns.folded; then
    pass nspid "ns $NS, host pid $INNER"
else
    fail nspid "exit $rc, inner '$INNER', ns '$NS'"; show ns.log
fi
kill $INNER $UNSHARE 2>/dev/null
wait $UNSHARE 2>/dev/null

# --- launch: a command profiled from its first instruction until it exits ----------------------
bpfprof -F 499 -q -o launch.folded -- shortlived 2 > launch.log 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q 'short_work' launch.folded; then
    pass launch
else
    fail launch "exit $rc"; show launch.log; show launch.folded 10
fi

# --- children: a command's children and grandchildren are followed (the fork tracepoint, whose
# record layout differs between kernels), and the command's exit status comes back -------------
bpfprof -F 499 -q -o children.folded -- sh -c 'sh -c "shortlived 2; true"; shortlived 2; exit 3' \
    > children.log 2>&1
rc=$?
if [ $rc -eq 3 ] && grep -q 'short_work' children.folded; then
    pass children
else
    fail children "exit $rc (want the command's 3)"; show children.log; show children.folded 10
fi

# --- cfi: the kernel's CFI walk (the walker program this kernel verified) unwinds a program
# built without frame pointers: burn's two callers to main, and a recursion 100 deep whole ------
nofp parents 60 &
NOFP=$!
sleep 0.3
RUST_LOG=info bpfprof --pid $NOFP -d 2s -F 499 --unwind cfi -o cfi.folded > cfi.log 2>&1
rc=$?
kill $NOFP 2>/dev/null
nofp recurse 60 &
NOFP=$!
sleep 0.3
bpfprof --pid $NOFP -d 2s -F 499 -q --unwind cfi -o cfi-deep.folded > cfi-deep.log 2>&1
rc2=$?
kill $NOFP 2>/dev/null
DEPTH=$(awk -F';' '{n = 0; for (i = 1; i <= NF; i++) if ($i == "recurse") n++; if (n > m) m = n} END {print m + 0}' cfi-deep.folded)
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && grep -q 'main;parent_a;burn ' cfi.folded \
    && grep -q 'main;parent_b;burn ' cfi.folded && [ "$DEPTH" -ge 100 ]; then
    pass cfi "recursion $DEPTH deep"
else
    fail cfi "exit $rc/$rc2, recursion $DEPTH deep"; show cfi.log 60; show cfi.folded 10; show cfi-deep.log
fi

echo VMTEST-DONE
poweroff -f
