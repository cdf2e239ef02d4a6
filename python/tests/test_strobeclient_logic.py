"""The strobeclient console script's logic against a fake daemon: what PyTorch parses from its
stderr, the duration fallback, the wait after a stop, and fetching unreadable results.
(The real daemon and PyTorch's exact flow are tested end to end in tests/tests/python/strobeclient.rs.)"""

from __future__ import annotations

import base64
import io
import re
from typing import Any, Dict, List

import pytest

from bpfprof.strobeclient import main

PYTORCH_RUN = [
    "run", "--profiler", "pyperf", "--event", "cycles", "--async", "--sample-interval",
    "10000000", "--duration-ms", "1800000", "--pid", "4026531836:42", "--sample-tags", "a,b",
]  # fmt: skip


def strobe(daemon: Any, argv: List[str]) -> "tuple[int, str]":
    err = io.StringIO()
    code = main(argv + ["--socket", daemon.path], err=err)
    return code, err.getvalue()


def test_a_too_long_run_takes_the_daemons_longest(fake_daemon) -> None:
    def handler(request: Dict[str, Any]) -> Dict[str, Any]:
        if request["op"] == "run" and "duration_ms" in request:
            return {
                "ok": False,
                "error": {"code": "bad_request", "message": "duration_ms must be between 1 and 600000"},
            }
        return {"run_id": 5, "state": "RUNNING"}

    daemon = fake_daemon(handler)
    code, err = strobe(daemon, PYTORCH_RUN)
    assert code == 0, err
    assert re.search(r"INFO Run Id: (-?\d+)", err).group(1) == "5"
    first, second = daemon.requests
    assert first["duration_ms"] == 1_800_000 and "duration_ms" not in second
    assert second["pid"] == 42 and second["pid_ns"] == 4026531836
    assert second["event"] == "auto" and second["sample_tags"] == ["a", "b"]
    assert "longer than the daemon allows" in err


def test_stop_run_returns_once_the_run_has_ended(fake_daemon) -> None:
    def handler(request: Dict[str, Any]) -> Dict[str, Any]:
        if request["op"] == "stop":
            return {"run_id": request["run_id"], "state": "RUNNING"}
        assert request["op"] == "results" and request["wait_ms"] > 0
        return {"run_id": request["run_id"], "state": "STOPPED", "files": {}}

    daemon = fake_daemon(handler)
    code, err = strobe(daemon, ["stopRun", "--run-id", "3"])
    assert code == 0, err
    assert "Success!" in re.search("INFO ::1:(.*)", err).group(1)
    assert daemon.ops() == ["stop", "results"]


def test_unreadable_results_are_fetched_into_the_cache(fake_daemon, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    svg = b"<svg>leaf_hot</svg>"

    def handler(request: Dict[str, Any]) -> Dict[str, Any]:
        if request["op"] == "status":
            return {"run_id": 8, "state": "STOPPED"}
        if request["op"] == "results":
            return {"run_id": 8, "state": "STOPPED", "samples": 9,
                    "files": {"svg": "/nonexistent/runs/8/profile.svg"}}  # fmt: skip
        assert request["op"] == "read" and request["format"] == "svg"
        return {"data": base64.b64encode(svg).decode(), "size": len(svg)}

    daemon = fake_daemon(handler)
    code, err = strobe(daemon, ["getRunStatus", "--run-id", "8"])
    assert code == 0, err
    assert "Profile run finished with SUCCESS" in re.search("INFO ::1:(.*)", err).group(1)
    assert re.search("Total samples(.*)", err).group(1) == ": 9"
    icicle = re.search(r"Icicle view \(python stack\): (.*)", err).group(1)
    assert icicle == str(tmp_path / "bpfprof" / "runs" / "8" / "profile.svg")
    assert open(icicle, "rb").read() == svg


@pytest.mark.parametrize(
    "argv, code",
    [
        (["run", "--profiler", "jvm", "--pid", "1"], 2),
        (["getRunStatus", "--run-id", "-1"], 9),
    ],
)
def test_bad_requests_exit_non_zero_with_a_reason(fake_daemon, argv, code) -> None:
    daemon = fake_daemon()
    got, err = strobe(daemon, argv)
    assert got == code and err.startswith("ERROR "), err
    assert daemon.requests == []


def test_the_unwind_mode_comes_from_the_environment(fake_daemon, monkeypatch) -> None:
    daemon = fake_daemon(lambda r: {"run_id": 5, "state": "RUNNING"})
    code, err = strobe(daemon, PYTORCH_RUN)
    assert code == 0, err
    monkeypatch.setenv("BPFPROF_UNWIND", "fp")
    code, err = strobe(daemon, PYTORCH_RUN)
    assert code == 0, err
    runs = [r for r in daemon.requests if r["op"] == "run"]
    assert [r.get("unwind") for r in runs] == [None, "fp"]


def test_compile_phases_ask_for_pytorchs_depth_and_follow_children(fake_daemon, monkeypatch) -> None:
    # TORCH_COMPILE_STROBELIGHT's profiler asks for 500 frames (its default), which the command
    # line cannot carry; the daemon refuses more than it records: the run takes its deepest.
    monkeypatch.setenv("TORCH_COMPILE_STROBELIGHT", "1")
    monkeypatch.delenv("COMPILE_STROBELIGHT_MAX_STACK_LENGTH", raising=False)
    monkeypatch.delenv("BPFPROF_MAX_STACK_LENGTH", raising=False)
    monkeypatch.delenv("BPFPROF_FOLLOW_CHILDREN", raising=False)

    def handler(request: Dict[str, Any]) -> Dict[str, Any]:
        if "duration_ms" in request:
            return {"ok": False, "error": {"code": "bad_request", "message": "duration_ms must be between 1 and 600000"}}
        if "max_stack_length" in request:
            return {
                "ok": False,
                "error": {
                    "code": "bad_request",
                    "message": "--max-stack-length 500 is above the 127 frames bpfprof's kernel program collects",
                },
            }
        return {"run_id": 8, "state": "RUNNING"}

    daemon = fake_daemon(handler)
    code, err = strobe(daemon, PYTORCH_RUN)
    assert code == 0, err
    assert re.search(r"INFO Run Id: (-?\d+)", err).group(1) == "8"
    assert [r.get("max_stack_length") for r in daemon.requests] == [500, 500, None]
    assert all(r["follow_children"] is True for r in daemon.requests)
    assert "deeper than the daemon records" in err and "compile workers" in err


def test_the_environment_sets_depth_and_children(fake_daemon, monkeypatch) -> None:
    monkeypatch.delenv("TORCH_COMPILE_STROBELIGHT", raising=False)
    monkeypatch.setenv("COMPILE_STROBELIGHT_MAX_STACK_LENGTH", "300")
    monkeypatch.setenv("BPFPROF_MAX_STACK_LENGTH", "64")
    monkeypatch.setenv("BPFPROF_FOLLOW_CHILDREN", "yes")
    daemon = fake_daemon(lambda request: {"run_id": 2, "state": "RUNNING"})
    code, err = strobe(daemon, PYTORCH_RUN)
    assert code == 0, err
    (run,) = daemon.requests
    assert run["max_stack_length"] == 64 and run["follow_children"] is True
    # Without either variable, nothing is sent: the daemon's defaults (127, no children).
    for name in ("COMPILE_STROBELIGHT_MAX_STACK_LENGTH", "BPFPROF_MAX_STACK_LENGTH", "BPFPROF_FOLLOW_CHILDREN"):
        monkeypatch.delenv(name)
    daemon = fake_daemon(lambda request: {"run_id": 3, "state": "RUNNING"})
    code, err = strobe(daemon, PYTORCH_RUN)
    assert code == 0, err
    (run,) = daemon.requests
    assert "max_stack_length" not in run and "follow_children" not in run
