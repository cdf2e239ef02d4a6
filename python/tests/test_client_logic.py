"""Client logic against a fake daemon: what happens on refusals, absence, errors, nesting."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict

import pytest

import bpfprof
from bpfprof import BpfprofError, FunctionProfiler, PhaseProfiler


def test_function_runs_profiled_and_results_are_collected(fake_daemon) -> None:
    daemon = fake_daemon()
    profiler = FunctionProfiler(sample_tags=["a"], socket_path=daemon.path)
    assert profiler.profile(lambda x, y=1: x + y, 2, y=3) == 5
    assert profiler.current_run_id == 7
    assert profiler.profile_result["samples"] == 42
    assert daemon.ops() == ["run", "stop", "results"]
    run = daemon.requests[0]
    assert run["pid"] > 0 and run["sample_tags"] == ["a"] and run["max_stack_length"] == 127
    assert run["sample_interval"] == 10_000_000 and run["duration_ms"] == 600_000
    # auto is the daemon's default: not sent, so a daemon without the field accepts the run.
    assert "unwind" not in run
    assert "follow_children" not in run


def test_children_are_followed_when_asked(fake_daemon, caplog) -> None:
    daemon = fake_daemon()
    FunctionProfiler(follow_children=True, socket_path=daemon.path).profile(lambda: None)
    PhaseProfiler.enable(
        socket_path=daemon.path, env={"BPFPROF_FOLLOW_CHILDREN": "1"}
    ).profile_phase(lambda: None, "p1")
    with caplog.at_level(logging.WARNING):
        PhaseProfiler.enable(
            socket_path=daemon.path, env={"BPFPROF_FOLLOW_CHILDREN": "often"}
        ).profile_phase(lambda: None, "p2")
    runs = [r for r in daemon.requests if r["op"] == "run"]
    assert [r.get("follow_children") for r in runs] == [True, True, None]
    assert "BPFPROF_FOLLOW_CHILDREN" in caplog.text


def test_the_unwind_mode_is_sent_by_profilers_decorators_and_phases(fake_daemon, caplog) -> None:
    daemon = fake_daemon()
    FunctionProfiler(unwind="fp", socket_path=daemon.path).profile(lambda: None)

    @bpfprof.profile(unwind="cfi", socket_path=daemon.path)
    def work() -> int:
        return 1

    assert work() == 1
    PhaseProfiler.enable(socket_path=daemon.path, env={"BPFPROF_UNWIND": "fp"}).profile_phase(
        lambda: None, "p1"
    )
    PhaseProfiler.enable(socket_path=daemon.path, env={}, unwind="cfi").profile_phase(
        lambda: None, "p2"
    )
    with caplog.at_level(logging.WARNING):
        PhaseProfiler.enable(socket_path=daemon.path, env={"BPFPROF_UNWIND": "dwarf"}).profile_phase(
            lambda: None, "p3"
        )
    assert "BPFPROF_UNWIND" in caplog.text
    runs = [r for r in daemon.requests if r["op"] == "run"]
    assert [r.get("unwind") for r in runs] == ["fp", "cfi", "fp", "cfi", None]
    for bad in (lambda: FunctionProfiler(unwind="dwarf"), lambda: PhaseProfiler("s", unwind="x")):
        with pytest.raises(ValueError, match="expected auto, fp or cfi"):
            bad()


def test_the_python_frames_mode_is_sent_only_when_off(fake_daemon) -> None:
    daemon = fake_daemon()
    FunctionProfiler(python_frames="off", socket_path=daemon.path).profile(lambda: None)
    FunctionProfiler(socket_path=daemon.path).profile(lambda: None)

    @bpfprof.profile(python_frames="off", socket_path=daemon.path)
    def work() -> int:
        return 1

    assert work() == 1
    runs = [r for r in daemon.requests if r["op"] == "run"]
    assert [r.get("python") for r in runs] == ["off", None, "off"]
    with pytest.raises(ValueError, match="expected auto or off"):
        FunctionProfiler(python_frames="no")


def test_refusal_still_runs_the_function_with_a_warning(fake_daemon, caplog) -> None:
    daemon = fake_daemon(
        lambda r: {"ok": False, "error": {"code": "permission_denied", "message": "not yours"}}
    )
    profiler = FunctionProfiler(socket_path=daemon.path)
    with caplog.at_level(logging.WARNING):
        assert profiler.profile(lambda: "done") == "done"
    assert "not yours" in caplog.text
    assert profiler.profile_result is None


def test_refusal_with_stop_at_error_raises_the_daemons_reason(fake_daemon) -> None:
    daemon = fake_daemon(
        lambda r: {"ok": False, "error": {"code": "no_such_process", "message": "gone"}}
    )
    ran = []
    with pytest.raises(BpfprofError, match="gone"):
        FunctionProfiler(stop_at_error=True, socket_path=daemon.path).profile(ran.append, 1)
    assert ran == []


def test_absent_daemon_runs_the_function(tmp_path, caplog) -> None:
    profiler = FunctionProfiler(socket_path=str(tmp_path / "nobody-home.sock"))
    with caplog.at_level(logging.WARNING):
        assert profiler.profile(lambda: 3) == 3
    assert "bpfprof" in caplog.text
    with pytest.raises(BpfprofError):
        FunctionProfiler(stop_at_error=True, socket_path=str(tmp_path / "x.sock")).profile(int)


def test_exceptions_propagate_unchanged_and_stop_the_run(fake_daemon) -> None:
    daemon = fake_daemon()

    class Boom(Exception):
        pass

    boom = Boom("original")
    with pytest.raises(Boom) as raised:
        FunctionProfiler(socket_path=daemon.path).profile(lambda: (_ for _ in ()).throw(boom))
    assert raised.value is boom
    assert daemon.ops() == ["run", "stop"]


def test_concurrent_calls_run_unprofiled_or_raise(fake_daemon) -> None:
    daemon = fake_daemon()
    inside = threading.Event()
    release = threading.Event()

    def slow() -> str:
        inside.set()
        release.wait(10)
        return "slow"

    results: Dict[str, Any] = {}
    first = threading.Thread(
        target=lambda: results.update(first=FunctionProfiler(socket_path=daemon.path).profile(slow))
    )
    first.start()
    assert inside.wait(10)
    second = FunctionProfiler(socket_path=daemon.path)
    assert second.profile(lambda: "second") == "second"
    assert second.current_run_id is None
    with pytest.raises(BpfprofError):
        FunctionProfiler(stop_at_error=True, socket_path=daemon.path).profile(lambda: None)
    release.set()
    first.join(10)
    assert results["first"] == "slow"
    assert daemon.ops().count("run") == 1


def test_decorator_forms(fake_daemon) -> None:
    daemon = fake_daemon()

    @bpfprof.profile(socket_path=daemon.path, sample_tags=["deco"])
    def double(x: int) -> int:
        return 2 * x

    assert double(4) == 8
    assert double.profiler.current_run_id == 7
    mine = FunctionProfiler(socket_path=daemon.path)

    @bpfprof.profile(profiler=mine)
    def triple(x: int) -> int:
        return 3 * x

    assert triple(2) == 6 and mine.profile_result is not None
    with pytest.raises(TypeError):
        bpfprof.profile(profiler=mine, stop_at_error=True)


def test_phases_are_tagged_nested_skipped_and_counted(fake_daemon) -> None:
    daemon = fake_daemon()
    phases = PhaseProfiler.enable(socket_path=daemon.path, env={})

    def outer() -> int:
        return phases.profile_phase(lambda: 1, "inner") + 1

    assert phases.profile_phase(outer, "outer phase!") == 2
    runs = [r for r in daemon.requests if r["op"] == "run"]
    assert len(runs) == 1
    assert runs[0]["tags"] == {"session": phases.session, "phase": "outer_phase_"}
    assert str(__import__("os").getpid()) in phases.session
    assert phases.stats.succeeded == 1 and phases.stats.skipped_nested == 1


def test_phase_filter_and_environment_defaults(fake_daemon, caplog) -> None:
    daemon = fake_daemon()
    env = {
        "BPFPROF_PHASE_FILTER": "^comp",
        "BPFPROF_SAMPLE_INTERVAL": "2000000",
        "BPFPROF_MAX_STACK_LENGTH": "64",
        "BPFPROF_MAX_PROFILE_TIME": "30",
    }
    phases = PhaseProfiler.enable(socket_path=daemon.path, env=env)
    assert phases.profile_phase(lambda: "t", "trace") == "t"
    assert phases.profile_phase(lambda: "c", "compile") == "c"
    runs = [r for r in daemon.requests if r["op"] == "run"]
    assert len(runs) == 1 and runs[0]["tags"]["phase"] == "compile"
    assert runs[0]["sample_interval"] == 2_000_000
    assert runs[0]["max_stack_length"] == 64 and runs[0]["duration_ms"] == 30_000
    assert phases.stats.filtered_out == 1
    with caplog.at_level(logging.WARNING):
        broken = PhaseProfiler.enable(socket_path=daemon.path, env={"BPFPROF_PHASE_FILTER": "("})
    assert broken.profile_phase(lambda: 5, "anything") == 5
    assert broken.stats.filtered_out == 1 and "BPFPROF_PHASE_FILTER" in caplog.text


def test_a_hung_daemon_delays_the_function_by_the_start_budget_only(tmp_path) -> None:
    """A daemon that accepts and never answers: the function still runs, within the budget."""
    import socket
    import time

    path = str(tmp_path / "hung.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)  # connections queue up and are never answered
    try:
        assert FunctionProfiler().timeout_wait_for_running_sec <= 10
        profiler = FunctionProfiler(socket_path=path, timeout_wait_for_running_sec=1)
        started = time.monotonic()
        assert profiler.profile(lambda: time.sleep(0.2) or "ran") == "ran"
        elapsed = time.monotonic() - started
        # One second of budget plus the function; before, the orphan check added 10 s more.
        assert elapsed < 3.5, f"took {elapsed:.1f} s"
        assert profiler.profile_result is None
    finally:
        server.close()


def test_async_functions_are_profiled_around_the_await(fake_daemon) -> None:
    import asyncio

    daemon = fake_daemon()

    @bpfprof.profile(socket_path=daemon.path)
    async def work(x: int) -> int:
        await asyncio.sleep(0.05)
        assert daemon.ops() == ["run"], "the run must be going while the coroutine runs"
        return x * 2

    assert asyncio.run(work(21)) == 42
    assert daemon.ops() == ["run", "stop", "results"]
    assert work.profiler.profile_result["samples"] == 42

    async def bare() -> None:
        return None

    with pytest.raises(TypeError, match="coroutine function"):
        FunctionProfiler(socket_path=daemon.path).profile(bare)


def test_the_mode_is_sent_by_profilers_decorators_and_phases(fake_daemon, caplog) -> None:
    daemon = fake_daemon()
    FunctionProfiler(mode="wall", socket_path=daemon.path).profile(lambda: None)

    @bpfprof.profile(mode="wall", socket_path=daemon.path)
    def work() -> int:
        return 1

    assert work() == 1
    FunctionProfiler(socket_path=daemon.path).profile(lambda: None)
    PhaseProfiler.enable(socket_path=daemon.path, env={"BPFPROF_MODE": "wall"}).profile_phase(
        lambda: None, "p1"
    )
    PhaseProfiler.enable(socket_path=daemon.path, env={}, mode="wall").profile_phase(
        lambda: None, "p2"
    )
    PhaseProfiler.enable(socket_path=daemon.path, env={}).profile_phase(lambda: None, "p3")
    with caplog.at_level(logging.WARNING):
        PhaseProfiler.enable(socket_path=daemon.path, env={"BPFPROF_MODE": "idle"}).profile_phase(
            lambda: None, "p4"
        )
    assert "BPFPROF_MODE" in caplog.text
    runs = [r for r in daemon.requests if r["op"] == "run"]
    # "cpu", the daemon's default, is not sent.
    assert [r.get("mode") for r in runs] == ["wall", "wall", None, "wall", "wall", None, None]
    for bad in (lambda: FunctionProfiler(mode="idle"), lambda: PhaseProfiler("s", mode="idle")):
        with pytest.raises(ValueError, match="expected cpu or wall"):
            bad()
