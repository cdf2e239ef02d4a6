"""``strobeclient``: strobelight's client command line over the bpfprof daemon, in pure Python.

PyTorch's strobelight profilers (``torch._strobelight.cli_function_profiler``, and through it
``TORCH_COMPILE_STROBELIGHT=1``) run a command named ``strobeclient`` and read its **stderr**.
Installing this package (``pip install ./python``) puts this module on PATH under that name, so
they profile through the bpfprof daemon unchanged. The command lines and the lines written
are the same as the ``bpfprof`` binary's own ``strobeclient`` front end::

    strobeclient run --profiler pyperf --event cycles --async --sample-interval N \\
        --duration-ms MS --pid NS:PID [--sample-tags a,b]      -> INFO Run Id: 17
    strobeclient getRunStatus --run-id 17                     -> INFO ::1: Profile run status: RUNNING
    strobeclient stopRun --run-id 17                          -> INFO ::1: Success! ...
    strobeclient getRunStatus --run-id 17                     -> INFO ::1: Profile run finished with SUCCESS
                                                                 INFO Total samples: 435
                                                                 INFO GraphProfiler: <pprof> <pstats>
                                                                 INFO Icicle view (python stack): <svg>
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Optional, Sequence, TextIO

from .client import FINAL_STATES, BpfprofError, Client, Reply

__all__ = ["main"]

#: The only strobelight profiler bpfprof serves.
PYPERF = "pyperf"
#: Run length when ``--duration-ms`` is not given: the daemon's maximum.
DEFAULT_DURATION_MS = 600_000
#: How long a ``run`` without ``--async`` waits beyond its duration for the results.
RESULTS_GRACE_MS = 60_000
#: Longest ``stopRun`` waits for the run to end (results written) after asking it to stop.
STOP_WAIT_MS = 30_000
#: Where the kernel lists its PMUs; a hardware one is ``cpu`` (``cpu_core`` on hybrid x86,
#: ``armv8_pmuv3*`` on arm64).
_EVENT_SOURCES = "/sys/bus/event_source/devices"

# Exit codes, the same as the bpfprof binary's (its README lists them).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
_EXIT_BY_CODE = {
    "bad_request": 5,
    "not_found": 9,
    "permission_denied": 4,
    "no_such_process": 3,
    "too_many_runs": 11,
    "unsupported": 8,
    "unavailable": 10,
}


class _UsageError(Exception):
    """A command line asking for something this front end does not do."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strobeclient",
        description="strobelight's client command line over the bpfprof daemon "
        "(for PyTorch's strobelight profilers). Output goes to stderr.",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def socket_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--socket",
            help="the daemon's socket (default: $BPFPROF_SOCKET, else /run/bpfprof/bpfprof.sock)",
        )

    run = sub.add_parser("run", help="start profiling a process", allow_abbrev=False)
    run.add_argument("--profiler", required=True, help="only 'pyperf' (native stacks for now)")
    run.add_argument("--event", default="cycles", help="cycles (default), cpu-clock or auto")
    run.add_argument("--async", dest="run_async", action="store_true", help="return once sampling")
    run.add_argument("--sample-interval", type=int, help="period in cycles (ns for cpu-clock)")
    run.add_argument("--duration-ms", type=int, help="length of the run in milliseconds")
    run.add_argument("--pid", required=True, help="NS:PID (NS: inode of /proc/PID/ns/pid) or PID")
    run.add_argument("--sample-tags", help="tags for every sample, comma-separated")
    socket_arg(run)
    for name, what in (("getRunStatus", "print a run's state and results"), ("stopRun", "stop a run")):
        p = sub.add_parser(name, help=what, allow_abbrev=False)
        p.add_argument("--run-id", type=int, required=True)
        socket_arg(p)
    return parser


def _parse_target(spec: str) -> "tuple[int, Optional[int]]":
    ns, sep, pid = spec.rpartition(":")
    try:
        pid_value = int(pid)
        ns_value = int(ns) if sep else None
    except ValueError:
        raise _UsageError(f"invalid --pid {spec!r}: expected PID or NS:PID") from None
    if pid_value <= 0 or (ns_value is not None and ns_value <= 0):
        raise _UsageError(f"invalid --pid {spec!r}: PID and NS must be positive")
    return pid_value, ns_value


def _has_hardware_pmu() -> Optional[bool]:
    try:
        names = os.listdir(_EVENT_SOURCES)
    except OSError:
        return None
    return any(n in ("cpu", "cpu_core", "cpu_atom") or n.startswith("armv") for n in names)


def _run(args: argparse.Namespace, err: TextIO) -> int:
    if args.profiler != PYPERF:
        raise _UsageError(
            f"unknown --profiler {args.profiler!r}: bpfprof serves only --profiler {PYPERF} "
            "(a CPU profile of the process)"
        )
    if args.event not in ("cycles", "cpu-cycles", "cpu-clock", "auto"):
        # Invalid sampling settings: exit 5, as the bpfprof binary.
        raise BpfprofError(
            f"unknown --event {args.event!r}: expected cycles, cpu-clock or auto", "bad_request"
        )
    pid, pid_ns = _parse_target(args.pid)
    event = args.event
    if event in ("cycles", "cpu-cycles"):
        # PyTorch always asks for cycles; the daemon's `auto` is "cycles where there is a PMU,
        # else cpu-clock at the same rate".
        event = "auto"
        if _has_hardware_pmu() is False:
            print(
                "INFO --event cycles: this machine has no hardware PMU; the daemon samples "
                "with cpu-clock at the equivalent rate",
                file=err,
            )
    print(
        f"INFO --profiler {PYPERF}: Python functions are read from the interpreter's frames "
        "(CPython 3.10 to 3.13, no restart or -X perf needed); other Pythons show the "
        "interpreter's C frames",
        file=err,
    )
    duration_ms = DEFAULT_DURATION_MS if args.duration_ms is None else args.duration_ms
    tags = [t for t in (args.sample_tags or "").split(",") if t]
    with Client(args.socket) as client:

        def start(duration: Optional[int]) -> Reply:
            return client.run(
                pid,
                pid_ns=pid_ns,
                event=event,
                sample_interval=args.sample_interval,
                duration_ms=duration,
                sample_tags=tags or None,
                # strobelight's command line has no unwinder choice: the environment gives
                # it, as for phase profilers; the daemon refuses unknown modes.
                unwind=os.environ.get("BPFPROF_UNWIND", "").strip() or None,
            )

        try:
            started = start(duration_ms)
        except BpfprofError as e:
            # PyTorch's compile-time profiler asks for 30 minutes, longer than the daemon's
            # longest run: take the longest the daemon allows (no duration) instead of failing.
            if e.code != "bad_request" or duration_ms <= 0 or "duration_ms" not in e.reason:
                raise
            print(
                f"INFO --duration-ms {duration_ms} is longer than the daemon allows ({e.reason}); "
                "the run lasts the daemon's longest unless stopped first",
                file=err,
            )
            started = start(None)
        run_id = int(started["run_id"])
        print(f"INFO Run Id: {run_id}", file=err)
        if args.run_async:
            return EXIT_OK
        reply = client.results(run_id, wait_ms=duration_ms + RESULTS_GRACE_MS)
        return _report(client, reply, err)


def _get_run_status(args: argparse.Namespace, err: TextIO) -> int:
    with Client(args.socket) as client:
        run_id = _run_id(args.run_id)
        status = client.status(run_id)
        if status.get("state") in FINAL_STATES:
            return _report(client, client.results(run_id), err)
        print(f"INFO ::1: Profile run status: {status.get('state')}", file=err)
        print(f"INFO Samples so far: {status.get('samples', 0)}", file=err)
        return EXIT_OK


def _stop_run(args: argparse.Namespace, err: TextIO) -> int:
    run_id = _run_id(args.run_id)
    with Client(args.socket) as client:
        reply = client.stop(run_id)
        # The daemon takes the stop asynchronously. Waiting here for the run to end (results
        # written) means PyTorch's next getRunStatus sees SUCCESS at once instead of
        # PROCESSING and a 10 s sleep; a run still processing after the wait is retried there.
        if reply.get("state") not in FINAL_STATES:
            reply = client.results(run_id, wait_ms=STOP_WAIT_MS)
    if reply.get("state") == "FAILED":
        print(f"INFO ::1: Run {run_id} had failed: {reply.get('reason')}", file=err)
        return EXIT_FAILURE
    print(f"INFO ::1: Success! Run {run_id} stopped (state {reply.get('state')})", file=err)
    return EXIT_OK


def _run_id(value: int) -> int:
    if value < 0:
        raise BpfprofError(f"no run {value}", "not_found")
    return value


def _report(client: Client, reply: Reply, err: TextIO) -> int:
    run_id = reply.get("run_id")
    state = reply.get("state")
    if state not in FINAL_STATES:
        print(f"INFO ::1: Profile run status: {state}", file=err)
        return EXIT_OK
    if state == "FAILED":
        print(f"INFO ::1: Profile run finished with FAILED: {reply.get('reason')}", file=err)
        return EXIT_FAILURE
    print("INFO ::1: Profile run finished with SUCCESS", file=err)
    if state == "STOPPED":
        print(f"INFO run {run_id} was stopped by stopRun; it holds what was sampled until then", file=err)
    summary = reply.get("summary") or {}
    if summary.get("event_fallback") is True:
        print(
            f"INFO sampled with {summary.get('event', 'cpu-clock')} "
            "(no hardware PMU: fell back from cycles)",
            file=err,
        )
    files = _readable_files(client, int(run_id), dict(reply.get("files") or {}))
    path = lambda fmt: files.get(fmt, "(not written)")  # noqa: E731
    print(f"INFO Total samples: {reply.get('samples', 0)}", file=err)
    print(f"INFO GraphProfiler: {path('pprof')} {path('pstats')}", file=err)
    print(f"INFO Icicle view (python stack): {path('svg')}", file=err)
    for fmt, file in sorted(files.items()):
        if fmt not in ("pprof", "pstats", "svg"):
            print(f"INFO {fmt}: {file}", file=err)
    for top in (reply.get("top") or [])[:5]:
        print(
            f"INFO top: {top['name']} ({top['self_samples']} samples, "
            f"{top['total_samples']} with callees)",
            file=err,
        )
    return EXIT_OK


def _readable_files(client: Client, run_id: int, files: Dict[str, str]) -> Dict[str, str]:
    """The daemon's paths where this user can open them (they belong to the run's owner),
    else copies fetched through the socket into the user's cache folder."""

    def readable(p: str) -> bool:
        try:
            with open(p, "rb"):
                return True
        except OSError:
            return False

    if all(readable(p) for p in files.values()):
        return files
    base = os.environ.get("XDG_CACHE_HOME") or (
        os.path.join(os.environ["HOME"], ".cache") if os.environ.get("HOME") else None
    )
    if base is None:
        raise _UsageError(
            "the result files are not readable here and neither $XDG_CACHE_HOME nor $HOME is "
            "set to copy them into; use `bpfprof results --run-id N --copy-to DIR`"
        )
    folder = os.path.join(base, "bpfprof", "runs", str(run_id))
    os.makedirs(folder, exist_ok=True)
    copied = {}
    for fmt, daemon_path in files.items():
        target = os.path.join(folder, os.path.basename(daemon_path) or fmt)
        with open(target, "wb") as f:
            f.write(client.read_result(run_id, fmt))
        copied[fmt] = target
    return copied


def main(argv: Optional[Sequence[str]] = None, err: Optional[TextIO] = None) -> int:
    """Runs the strobelight client with ``argv`` (default ``sys.argv[1:]``); returns the exit
    code. Everything goes to ``err`` (default stderr), as strobelight's client does."""
    stream = sys.stderr if err is None else err
    args = _parser().parse_args(argv)
    commands = {"run": _run, "getRunStatus": _get_run_status, "stopRun": _stop_run}
    try:
        return commands[args.command](args, stream)
    except _UsageError as e:
        print(f"ERROR {e}", file=stream)
        return EXIT_USAGE
    except BpfprofError as e:
        print(f"ERROR {e}", file=stream)
        return _EXIT_BY_CODE.get(e.code or "", EXIT_FAILURE)
    except OSError as e:
        print(f"ERROR {e}", file=stream)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
