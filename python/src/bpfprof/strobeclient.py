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
from typing import Dict, List, Optional, Sequence, TextIO

from .client import FINAL_STATES, BpfprofError, Client, Reply, parse_switch

__all__ = ["main"]

#: The only strobelight profiler bpfprof serves.
PYPERF = "pyperf"
#: Run length when ``--duration-ms`` is not given: the daemon's maximum.
DEFAULT_DURATION_MS = 600_000
#: The stack depth PyTorch's compile-time profiler asks for, which strobelight's command line
#: cannot carry: read from the environment strobeclient inherits from PyTorch.
COMPILE_MAX_STACK_LENGTH_ENV = "COMPILE_STROBELIGHT_MAX_STACK_LENGTH"
#: Set (to anything non-empty, as PyTorch tests it) where PyTorch profiles compile phases.
TORCH_COMPILE_ENV = "TORCH_COMPILE_STROBELIGHT"
#: PyTorch's compile-time depth when ``COMPILE_STROBELIGHT_MAX_STACK_LENGTH`` is unset.
COMPILE_DEFAULT_MAX_STACK_LENGTH = 500
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


class _RunEnv:
    """What a ``run`` takes from its environment, which strobelight's flags cannot say: the
    stack depth (``BPFPROF_MAX_STACK_LENGTH``, else ``COMPILE_STROBELIGHT_MAX_STACK_LENGTH``,
    else PyTorch's compile default where compile phases are profiled), whether to follow
    children (``BPFPROF_FOLLOW_CHILDREN``; default on for compile phases, whose inductor
    workers are child processes) and the unwinder (``BPFPROF_UNWIND``)."""

    def __init__(self, env: "Dict[str, str] | os._Environ[str]") -> None:
        def get(key: str) -> Optional[str]:
            value = (env.get(key) or "").strip()
            return value or None

        self.notes: List[str] = []
        self.unwind = get("BPFPROF_UNWIND")
        compiling = get(TORCH_COMPILE_ENV) is not None
        self.max_stack_length: Optional[int] = None
        for key in ("BPFPROF_MAX_STACK_LENGTH", COMPILE_MAX_STACK_LENGTH_ENV):
            raw = get(key)
            if raw is None:
                continue
            try:
                depth = int(raw)
            except ValueError:
                depth = 0
            if depth > 0:
                self.max_stack_length = depth
                break
            self.notes.append(f"ignoring {key}={raw!r}: not a positive integer")
        if self.max_stack_length is None and compiling:
            self.max_stack_length = COMPILE_DEFAULT_MAX_STACK_LENGTH
        self.follow_children = compiling
        raw_follow = get("BPFPROF_FOLLOW_CHILDREN")
        if raw_follow is not None:
            follow = parse_switch(raw_follow)
            if follow is None:
                self.notes.append(f"ignoring BPFPROF_FOLLOW_CHILDREN={raw_follow!r}: expected 1 or 0")
            else:
                self.follow_children = follow
        if self.follow_children:
            why = (
                "TORCH_COMPILE_STROBELIGHT: inductor's compile workers"
                if compiling
                else "BPFPROF_FOLLOW_CHILDREN"
            )
            self.notes.append(
                f"following the children the process forks during the run ({why}; "
                "BPFPROF_FOLLOW_CHILDREN=0 turns it off)"
            )


def _is_stack_length_refusal(reason: str) -> bool:
    return "max-stack-length" in reason or "max_stack_length" in reason


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
    env = _RunEnv(os.environ)
    for note in env.notes:
        print(f"INFO {note}", file=err)
    with Client(args.socket) as client:
        duration: Optional[int] = duration_ms
        depth = env.max_stack_length
        # A refusal of what PyTorch asks for but strobelight's own client would have served (a
        # longer run, deeper stacks than the daemon records) takes the daemon's limit instead
        # of failing the profile; each field is dropped at most once, so this ends.
        while True:
            try:
                started = client.run(
                    pid,
                    pid_ns=pid_ns,
                    event=event,
                    sample_interval=args.sample_interval,
                    duration_ms=duration,
                    sample_tags=tags or None,
                    max_stack_length=depth,
                    follow_children=env.follow_children,
                    unwind=env.unwind,
                )
                break
            except BpfprofError as e:
                if e.code != "bad_request":
                    raise
                if duration is not None and "duration_ms" in e.reason:
                    # PyTorch's compile-time profiler asks for 30 minutes, longer than the
                    # daemon's longest run.
                    print(
                        f"INFO --duration-ms {duration_ms} is longer than the daemon allows "
                        f"({e.reason}); the run lasts the daemon's longest unless stopped first",
                        file=err,
                    )
                    duration = None
                elif depth is not None and _is_stack_length_refusal(e.reason):
                    print(
                        f"INFO a stack depth of {depth} frames is deeper than the daemon records "
                        f"({e.reason}); stacks keep their leaf-most frames up to the daemon's "
                        "deepest, under a [truncated] root frame",
                        file=err,
                    )
                    depth = None
                else:
                    raise
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
