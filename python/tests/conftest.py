"""Fixtures: a fake daemon for client logic, and the real bpfprof daemon for end-to-end tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


class FakeDaemon:
    """Serves the protocol on a temp socket with scripted replies, recording every request."""

    def __init__(self, path: str, handler: Callable[[Dict[str, Any]], Dict[str, Any]]) -> None:
        self.path = path
        self.handler = handler
        self.requests: List[Dict[str, Any]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for line in f:
                request = json.loads(line)
                self.requests.append(request)
                reply = {"version": 1, "ok": True}
                reply.update(self.handler(request))
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    def ops(self) -> List[str]:
        return [r["op"] for r in self.requests]

    def close(self) -> None:
        self._server.close()


def well_behaved(request: Dict[str, Any]) -> Dict[str, Any]:
    """A daemon whose runs all succeed."""
    op = request["op"]
    if op == "run":
        return {"run_id": 7, "state": "RUNNING"}
    if op in ("status", "stop"):
        return {"run_id": request["run_id"], "state": "PROCESSING"}
    if op == "results":
        return {
            "run_id": request["run_id"],
            "state": "STOPPED",
            "samples": 42,
            "files": {"svg": "/x/profile.svg"},
            "top": [{"name": "work", "self_samples": 40, "total_samples": 42}],
            "summary": {"tags": []},
        }
    if op == "list":
        return {"runs": []}
    return {"ok": False, "error": {"code": "bad_request", "message": "?"}}


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[Callable[..., FakeDaemon]]:
    made: List[FakeDaemon] = []

    def make(handler: Callable[[Dict[str, Any]], Dict[str, Any]] = well_behaved) -> FakeDaemon:
        daemon = FakeDaemon(str(tmp_path / f"fake{len(made)}.sock"), handler)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.close()


def _bpfprof_bin() -> Path:
    explicit = os.environ.get("BPFPROF_BIN")
    if explicit:
        return Path(explicit)
    binary = REPO / "target" / "debug" / "bpfprof"
    if not binary.exists():
        subprocess.run(["cargo", "build", "-p", "profiler-user"], cwd=REPO, check=True)
    return binary


@pytest.fixture(scope="session")
def real_daemon() -> Iterator[str]:
    """Starts the real daemon (root) on a private socket; yields the socket path."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the end-to-end tests need root under CI")
        pytest.skip("needs root")
    state = tempfile.mkdtemp(prefix="bpfprof-py-")
    sock = os.path.join(state, "bpfprof.sock")
    proc = subprocess.Popen(
        [str(_bpfprof_bin()), "daemon", "--socket", sock, "--state-dir", os.path.join(state, "state")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 15
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode() if proc.stderr else ""
            proc.kill()
            pytest.fail(f"the daemon did not start: {err}")
        time.sleep(0.05)
    yield sock
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(state, ignore_errors=True)


def folded_text(result: Optional[Dict[str, Any]]) -> str:
    assert result is not None, "no profile result"
    return Path(result["files"]["folded"]).read_text()
