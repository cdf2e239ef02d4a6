"""A client for the bpfprof daemon's JSON-lines protocol (``docs/protocol.md``, version 1).

The daemon (``bpfprof daemon``, run as root) listens on a Unix stream socket. Each request is
one JSON object on one line; the daemon answers each with one JSON object on one line, in
order, on the same connection. This module speaks that protocol directly: no subprocesses and
no parsing of human-readable output.

Example::

    from bpfprof.client import Client

    with Client() as client:
        run = client.run(os.getpid(), duration_ms=2000)
        reply = client.results(run["run_id"], wait_ms=10_000)
        print(reply["state"], reply["files"])
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

__all__ = [
    "BpfprofError",
    "Client",
    "DEFAULT_SOCKET",
    "FINAL_STATES",
    "PROTOCOL_VERSION",
    "SOCKET_ENV",
    "UNWIND_MODES",
    "MODES",
    "check_unwind",
    "check_mode",
    "check_python_frames",
    "current_pid_namespace",
    "socket_path",
]

logger = logging.getLogger(__name__)

#: Protocol version this client speaks.
PROTOCOL_VERSION = 1
#: The daemon's default socket path.
DEFAULT_SOCKET = "/run/bpfprof/bpfprof.sock"
#: Environment variable that overrides the socket path.
SOCKET_ENV = "BPFPROF_SOCKET"
#: States in which a run has ended for good.
FINAL_STATES = frozenset({"SUCCESS", "FAILED", "STOPPED"})
#: How the daemon may walk user stacks (``bpfprof --unwind``); ``auto`` is its default.
UNWIND_MODES = ("auto", "fp", "cfi")
#: What a profile measures (``bpfprof --mode``): ``cpu`` (the default) or ``wall`` (CPU
#: samples plus each thread's time off the CPU).
MODES = ("cpu", "wall")

#: The daemon closes connections idle for 60 s; a connection idle this long is reopened.
_RECONNECT_AFTER_IDLE_SEC = 45.0
#: Largest reply accepted (a results reply carries the run's summary JSON).
_MAX_REPLY_BYTES = 64 * 1024 * 1024
#: Operations that may be sent again if the connection turns out to have been closed.
_IDEMPOTENT_OPS = frozenset({"status", "stop", "results", "list", "read"})

PathLike = Union[str, "os.PathLike[str]"]
Reply = Dict[str, Any]


class BpfprofError(Exception):
    """An error from the daemon, or from talking to it.

    Attributes:
        code: The daemon's error code (``bad_request``, ``not_found``, ``permission_denied``,
            ``no_such_process``, ``too_many_runs``, ``unsupported``, ``internal``), or one of
            this client's own: ``unavailable`` (no daemon to talk to), ``timeout``,
            ``protocol`` (a reply this client does not understand), ``busy`` (another run
            is active in this process), ``run_failed`` (the run ended ``FAILED``).
        reason: The daemon's message (or this client's) for people.
    """

    def __init__(self, reason: str, code: Optional[str] = None) -> None:
        super().__init__(reason if code is None else f"{reason} [{code}]")
        self.reason: str = reason
        self.code: Optional[str] = code


def socket_path(explicit: Optional[PathLike] = None) -> str:
    """The daemon's socket path: ``explicit``, else ``$BPFPROF_SOCKET``, else the default."""
    if explicit is not None:
        return os.fspath(explicit)
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


_resolve_socket_path = socket_path


#: Whether the daemon reads a CPython target's Python frames (``bpfprof --python``).
PYTHON_FRAME_MODES = ("auto", "off")


def check_python_frames(mode: str) -> str:
    """Returns ``mode`` if it is one of :data:`PYTHON_FRAME_MODES`; raises :class:`ValueError`
    otherwise."""
    if mode not in PYTHON_FRAME_MODES:
        raise ValueError(f"unknown python_frames mode {mode!r}: expected auto or off")
    return mode


def check_mode(mode: str) -> str:
    """Returns ``mode`` if it is one of :data:`MODES`; raises :class:`ValueError` naming them
    otherwise (before any run is asked for)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: expected cpu or wall")
    return mode


def check_unwind(unwind: str) -> str:
    """Returns ``unwind`` if it is one of :data:`UNWIND_MODES`; raises :class:`ValueError`
    naming them otherwise (before any run is asked for)."""
    if unwind not in UNWIND_MODES:
        raise ValueError(f"unknown unwind mode {unwind!r}: expected auto, fp or cfi")
    return unwind


def current_pid_namespace() -> Optional[int]:
    """The inode of this process's pid namespace, or None if ``/proc`` cannot tell."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


class _ConnectionLost(Exception):
    """The daemon closed the connection; ``sent_nothing`` if no reply byte arrived."""



def parse_switch(value: Optional[str]) -> Optional[bool]:
    """An on/off environment value: ``1``/``true``/``yes`` or ``0``/``false``/``no`` (any case);
    None for anything else, unset or empty included."""
    raw = (value or "").strip().lower()
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no"):
        return False
    return None


class Client:
    """A connection to the bpfprof daemon.

    The connection is opened on first use and reopened when the daemon has closed it (the
    daemon closes connections idle for 60 s). Requests are serialized: a client may be shared
    between threads.

    Args:
        socket_path: The daemon's socket; default ``$BPFPROF_SOCKET``, else
            ``/run/bpfprof/bpfprof.sock``.
        timeout: Default time to wait for a reply, in seconds (None: forever).
    """

    def __init__(self, socket_path: Optional[PathLike] = None, timeout: Optional[float] = 30.0):
        self.socket_path: str = _resolve_socket_path(socket_path)
        self.timeout: Optional[float] = timeout
        self._sock: Optional[socket.socket] = None
        self._buffer = b""
        self._last_used = 0.0
        self._lock = threading.Lock()

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> None:
        """Opens the connection now (it is otherwise opened on first use).

        Raises:
            BpfprofError: with code ``unavailable`` if the daemon cannot be reached.
        """
        with self._lock:
            self._connect()

    def _connect(self) -> None:
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError as err:
            sock.close()
            raise BpfprofError(
                f"cannot connect to the bpfprof daemon at {self.socket_path}: {err}",
                "unavailable",
            ) from err
        self._sock = sock
        self._buffer = b""
        self._last_used = time.monotonic()

    def close(self) -> None:
        """Closes the connection (a later request opens a new one)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buffer = b""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------------

    def request(
        self, op: str, fields: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None
    ) -> Reply:
        """Sends one request and returns its (successful) reply.

        Args:
            op: The operation (``run``, ``status``, ``stop``, ``results``, ``list``).
            fields: The operation's fields; None values are left out.
            timeout: Time to wait for the reply, in seconds; default the client's timeout.

        Raises:
            BpfprofError: the daemon's error (its ``code`` and message), or ``unavailable``,
                ``timeout``, ``protocol``.
        """
        message: Dict[str, Any] = {"version": PROTOCOL_VERSION, "op": op}
        for key, value in (fields or {}).items():
            if value is not None:
                message[key] = value
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            # The daemon closes idle connections; do not race it.
            if self._sock is not None and time.monotonic() - self._last_used > _RECONNECT_AFTER_IDLE_SEC:
                self._close()
            try:
                reply = self._exchange_retrying(op, line, wait)
            except BaseException:
                # A half-read reply would desynchronize the connection: start afresh.
                self._close()
                raise
            self._last_used = time.monotonic()
        return _check_reply(reply)

    def _exchange_retrying(self, op: str, line: bytes, timeout: Optional[float]) -> Reply:
        reused = self._sock is not None
        try:
            return self._exchange(line, timeout)
        except _ConnectionLost as lost:
            self._close()
            # A reused connection the daemon had closed before reading the request: send it
            # again on a new one, if it is safe to repeat.
            if not (reused and lost.args[0] and op in _IDEMPOTENT_OPS):
                raise self._closed_error() from None
        logger.debug("bpfprof: connection closed by the daemon, reconnecting")
        try:
            return self._exchange(line, timeout)
        except _ConnectionLost:
            raise self._closed_error() from None

    def _closed_error(self) -> BpfprofError:
        return BpfprofError(
            f"the bpfprof daemon at {self.socket_path} closed the connection", "unavailable"
        )

    def _exchange(self, line: bytes, timeout: Optional[float]) -> Reply:
        self._connect()
        sock = self._sock
        assert sock is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            sock.settimeout(timeout)
            sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            raise _ConnectionLost(True) from None
        except socket.timeout:
            raise BpfprofError("timed out sending a request to the bpfprof daemon", "timeout")
        except OSError as err:
            raise BpfprofError(f"cannot talk to the bpfprof daemon: {err}", "unavailable") from err
        while b"\n" not in self._buffer:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BpfprofError(
                        f"no reply from the bpfprof daemon within {timeout:g} s", "timeout"
                    )
                sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                raise BpfprofError(
                    f"no reply from the bpfprof daemon within {timeout:g} s", "timeout"
                ) from None
            except ConnectionResetError:
                raise _ConnectionLost(not self._buffer) from None
            except OSError as err:
                raise BpfprofError(
                    f"cannot talk to the bpfprof daemon: {err}", "unavailable"
                ) from err
            if not chunk:
                raise _ConnectionLost(not self._buffer)
            self._buffer += chunk
            if len(self._buffer) > _MAX_REPLY_BYTES:
                raise BpfprofError("reply from the bpfprof daemon is too long", "protocol")
        raw, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(raw)
        except ValueError as err:
            raise BpfprofError(f"malformed reply from the bpfprof daemon: {err}", "protocol")
        if not isinstance(reply, dict):
            raise BpfprofError("malformed reply from the bpfprof daemon: not an object", "protocol")
        return reply

    # -- operations ---------------------------------------------------------------------------

    def run(
        self,
        pid: int,
        *,
        pid_ns: Optional[int] = None,
        event: Optional[str] = None,
        sample_interval: Optional[int] = None,
        frequency: Optional[int] = None,
        duration_ms: Optional[int] = None,
        sample_tags: Optional[Sequence[str]] = None,
        tags: Optional[Mapping[str, str]] = None,
        max_stack_length: Optional[int] = None,
        formats: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
        unwind: Optional[str] = None,
        python_frames: Optional[str] = None,
        follow_children: bool = False,
        mode: Optional[str] = None,
    ) -> Reply:
        """Starts profiling process ``pid`` (as seen in pid namespace ``pid_ns``).

        The daemon replies once the run is ``RUNNING``; ``timeout`` bounds that wait.
        Returns the reply (``run_id``, ``state``). None arguments take the daemon's defaults.
        ``unwind`` is how user stacks are walked: ``auto``, ``fp`` or ``cfi`` (as
        ``bpfprof --unwind``); the daemon refuses other values (``bad_request``).
        ``python_frames`` is ``auto`` (the daemon reads a CPython target's Python frames) or
        ``off`` (as ``bpfprof --python``). ``follow_children`` also profiles the children
        the process forks during the run, and theirs. ``mode`` is ``cpu`` or ``wall`` (as
        ``bpfprof --mode``: CPU samples plus each thread's time off the CPU).
        """
        fields: Dict[str, Any] = {
            "pid": int(pid),
            "pid_ns": pid_ns,
            "event": event,
            "sample_interval": None if sample_interval is None else int(sample_interval),
            "frequency": None if frequency is None else int(frequency),
            "duration_ms": None if duration_ms is None else int(duration_ms),
            "sample_tags": list(sample_tags) if sample_tags else None,
            "tags": dict(tags) if tags else None,
            "max_stack_length": None if max_stack_length is None else int(max_stack_length),
            "formats": None if formats is None else list(formats),
            "unwind": unwind,
            "python": python_frames,
            # Sent only when set, so that daemons without it accept the usual runs.
            "follow_children": True if follow_children else None,
            "mode": mode,
        }
        return self.request("run", fields, timeout)

    def status(self, run_id: int, timeout: Optional[float] = None) -> Reply:
        """Where run ``run_id`` stands: ``state``, ``samples``, ``reason``."""
        return self.request("status", {"run_id": run_id}, timeout)

    def stop(self, run_id: int, timeout: Optional[float] = None) -> Reply:
        """Ends run ``run_id`` early; returns the state after the stop (its results are kept)."""
        return self.request("stop", {"run_id": run_id}, timeout)

    def results(self, run_id: int, wait_ms: int = 0, timeout: Optional[float] = None) -> Reply:
        """Run ``run_id``'s results, waiting up to ``wait_ms`` for it to end.

        The reply has ``state``, ``reason``, ``samples`` and, once the run has ended,
        ``files``, ``top`` and ``summary``. The socket wait is ``wait_ms`` plus the client's
        timeout unless ``timeout`` is given.
        """
        if timeout is None and self.timeout is not None:
            timeout = wait_ms / 1000.0 + self.timeout
        return self.request("results", {"run_id": run_id, "wait_ms": int(wait_ms)}, timeout)

    def read_result(self, run_id: int, fmt: str, timeout: Optional[float] = None) -> bytes:
        """The whole of result file ``fmt`` (a key of the results' ``files``) of an ended run,
        read through the socket in chunks (for when the daemon's state folder is out of reach).
        """
        data = b""
        while True:
            reply = self.request(
                "read", {"run_id": run_id, "format": fmt, "offset": len(data)}, timeout
            )
            chunk, size = reply.get("data"), reply.get("size")
            if not isinstance(chunk, str) or not isinstance(size, int):
                raise BpfprofError("malformed read reply from the bpfprof daemon", "protocol")
            try:
                piece = base64.b64decode(chunk, validate=True)
            except ValueError as err:
                raise BpfprofError(f"malformed read reply: {err}", "protocol") from err
            data += piece
            if not piece or len(data) >= size:
                return data

    def list_runs(self, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """The caller's runs (every run for root)."""
        runs = self.request("list", None, timeout).get("runs")
        if not isinstance(runs, list):
            raise BpfprofError("malformed list reply from the bpfprof daemon", "protocol")
        return runs


def _check_reply(reply: Reply) -> Reply:
    """Returns a successful reply; raises the daemon's error for a failed one."""
    version = reply.get("version")
    if version != PROTOCOL_VERSION:
        raise BpfprofError(
            f"the bpfprof daemon speaks protocol version {version!r}, "
            f"this client {PROTOCOL_VERSION}",
            "protocol",
        )
    if reply.get("ok") is True:
        return reply
    error = reply.get("error")
    if isinstance(error, dict):
        raise BpfprofError(str(error.get("message", "unknown error")), str(error.get("code")))
    raise BpfprofError("malformed error reply from the bpfprof daemon", "protocol")
