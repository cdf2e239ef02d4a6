"""Profile one call of a Python function with the bpfprof daemon.

:class:`FunctionProfiler` asks the daemon to sample this process, calls the function while the
kernel samples it, stops the run and collects the results (files, top functions, summary)::

    profiler = FunctionProfiler(sample_tags=["training"])
    loss = profiler.profile(train_epoch, model, data)
    print(profiler.profile_result["files"]["svg"])

or, as a decorator::

    @bpfprof.profile()
    def train_epoch(model, data): ...
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TypeVar, Union, overload

from .client import (
    FINAL_STATES,
    BpfprofError,
    Client,
    PathLike,
    check_mode,
    check_python_frames,
    check_unwind,
    current_pid_namespace,
)

__all__ = ["FunctionProfiler", "profile"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: How often to poll a run that the daemon reported before it was RUNNING.
_POLL_INTERVAL_SEC = 0.05
#: A run created this long before its request was sent (clock skew) still counts as ours.
_ORPHAN_SLACK_MS = 2000

# One run at a time per process, whatever the profiler object.
_active_run_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    # A child forked while the parent was profiling is not being profiled.
    global _active_run_lock
    _active_run_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_in_child)


class FunctionProfiler:
    """Profiles calls of a Python function with the bpfprof daemon.

    Each :meth:`profile` call starts a run on this process (its pid and pid namespace), waits
    until the daemon reports it ``RUNNING``, calls the function, stops the run and collects its
    results into :attr:`profile_result`, and returns the function's result.

    Profiling never changes what the function does: its exceptions propagate unchanged (the
    run is then stopped and its results are not collected), and when the daemon is missing or
    refuses, the function still runs, unprofiled, with a warning logged, unless
    ``stop_at_error`` is set, which raises :class:`BpfprofError` with the daemon's reason
    instead. Only one run at a time is made per process: a call made while another is being
    profiled (in any thread, or nested) runs its function unprofiled, or raises with
    ``stop_at_error``.

    Args:
        stop_at_error: Raise :class:`BpfprofError` on any profiling failure instead of logging
            a warning and running (or having run) the function unprofiled. A failure after
            the function returned (stopping, collecting) then loses its return value.
        max_profile_duration_sec: Longest run, in seconds; the daemon ends it after that
            (``SUCCESS``) and the function carries on unprofiled.
        sample_each: Sampling period, in CPU cycles (``event`` auto: where there is no PMU the
            daemon samples on cpu-clock instead).
        timeout_wait_for_running_sec: The whole budget, in seconds, for starting a run before
            the function is called: connecting, the ``run`` request, waiting for ``RUNNING``
            and, when the daemon does not answer, looking for a run it made anyway. With a
            hung daemon the function starts at most this late, unprofiled (default 10 s).
        timeout_wait_for_finished_sec: How long to wait for the results after the stop.
        sample_tags: Bare tags stored with every sample and in the run's summary.
        stack_max_len: Deepest stack kept, in frames.
        tags: Key/value tags stored with every sample and in the run's summary.
        event: ``auto``, ``cycles`` or ``cpu-clock`` (``sample_each`` is in its units).
        formats: Result files to write (default: every format the daemon writes).
        unwind: How user stacks are walked: ``auto`` (CFI tables where an object has them,
            frame pointers elsewhere), ``fp`` (frame pointers only) or ``cfi`` (as ``auto``,
            but a process whose tables cannot be loaded fails the run). Other values raise
            :class:`ValueError` here.
        python_frames: ``auto`` (the daemon reads this interpreter's Python frames, so the
            profile names Python functions) or ``off`` (interpreter C functions only).
        socket_path: The daemon's socket; default ``$BPFPROF_SOCKET``, else the daemon's
            default path.
        follow_children: Also profile the children this process forks during the run, and
            theirs (subprocesses and worker pools the function starts).
        mode: ``cpu`` (CPU samples) or ``wall`` (CPU samples plus each thread's time off the
            CPU, waiting in sleeps, locks, queues, I/O or for a CPU: a function that waits
            half its time shows half). Other values raise :class:`ValueError` here.

    Attributes:
        profile_result: The last run's ``results`` reply: ``state``, ``reason``, ``samples``,
            ``files`` (format name -> path), ``top`` (top functions) and ``summary`` (the run's
            summary JSON); None if the last call was not profiled to the end.
        current_run_id: The last run's id, None if no run was started.
    """

    def __init__(
        self,
        stop_at_error: bool = False,
        max_profile_duration_sec: float = 600,
        sample_each: float = 1e7,
        timeout_wait_for_running_sec: float = 10,
        timeout_wait_for_finished_sec: float = 60,
        sample_tags: Optional[Sequence[str]] = None,
        stack_max_len: int = 127,
        *,
        tags: Optional[Mapping[str, str]] = None,
        event: str = "auto",
        formats: Optional[Sequence[str]] = None,
        unwind: str = "auto",
        python_frames: str = "auto",
        socket_path: Optional[PathLike] = None,
        follow_children: bool = False,
        mode: str = "cpu",
    ) -> None:
        check_unwind(unwind)
        check_mode(mode)
        self.mode: str = mode
        check_python_frames(python_frames)
        self.python_frames: str = python_frames
        self.stop_at_error: bool = stop_at_error
        self.max_profile_duration_sec: float = max_profile_duration_sec
        self.sample_each: float = sample_each
        self.timeout_wait_for_running_sec: float = timeout_wait_for_running_sec
        self.timeout_wait_for_finished_sec: float = timeout_wait_for_finished_sec
        self.sample_tags: List[str] = list(sample_tags) if sample_tags else []
        self.stack_max_len: int = stack_max_len
        self.tags: Dict[str, str] = dict(tags) if tags else {}
        self.event: str = event
        self.formats: Optional[List[str]] = None if formats is None else list(formats)
        self.unwind: str = unwind
        self.socket_path: Optional[PathLike] = socket_path
        self.follow_children: bool = bool(follow_children)
        self.profile_result: Optional[Dict[str, Any]] = None
        self.current_run_id: Optional[int] = None

    def __repr__(self) -> str:
        return (
            f"FunctionProfiler(stop_at_error={self.stop_at_error!r}, "
            f"sample_each={self.sample_each!r}, sample_tags={self.sample_tags!r}, "
            f"tags={self.tags!r}, current_run_id={self.current_run_id!r})"
        )

    def profile(self, work_function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Calls ``work_function(*args, **kwargs)`` while the daemon samples this process.

        Returns:
            What the function returns.

        Raises:
            Whatever the function raises, unchanged.
            BpfprofError: only with ``stop_at_error``, when profiling fails.
            TypeError: for a coroutine function (``async def``): calling it only creates the
                coroutine, so there would be nothing to profile; use :meth:`profile_async`.
        """
        if inspect.iscoroutinefunction(work_function):
            raise TypeError(
                f"{_name(work_function)} is a coroutine function: profile() would only time "
                "creating the coroutine; await profiler.profile_async(...) instead (the "
                "@bpfprof.profile decorator does this for async def functions)"
            )
        self.profile_result = None
        self.current_run_id = None
        lock = _active_run_lock
        if not lock.acquire(blocking=False):
            self._failed(
                BpfprofError("another bpfprof run is active in this process", "busy"),
                "not profiling %s",
                work_function,
            )
            return work_function(*args, **kwargs)
        try:
            return self._profile_locked(work_function, args, kwargs)
        finally:
            lock.release()

    def _profile_locked(
        self, work_function: Callable[..., T], args: Any, kwargs: Dict[str, Any]
    ) -> T:
        client = Client(self.socket_path, timeout=self.timeout_wait_for_finished_sec)
        trampolines = _PerfTrampolines()
        try:
            try:
                run_id = self._start(client)
            except BpfprofError as err:
                self._failed(err, "not profiling %s", work_function)
                return work_function(*args, **kwargs)
            self.current_run_id = run_id
            logger.info("bpfprof: run %d is profiling %s", run_id, _name(work_function))

            trampolines.activate()
            try:
                result = work_function(*args, **kwargs)
            except BaseException:
                trampolines.restore()
                self._stop_quietly(client, run_id)
                raise
            trampolines.restore()

            try:
                self.profile_result = self._finish(client, run_id)
            except BpfprofError as err:
                self._failed(err, "profiling %s failed", work_function)
            else:
                logger.info(
                    "bpfprof: run %d %s, %s samples; files: %s",
                    run_id,
                    self.profile_result.get("state"),
                    self.profile_result.get("samples"),
                    self.profile_result.get("files"),
                )
            return result
        finally:
            client.close()

    async def profile_async(
        self, work_function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Awaits ``work_function(*args, **kwargs)`` (an ``async def`` function) while the daemon
        samples this process.

        The run covers the whole await, so it also samples whatever else the event loop runs
        meanwhile; tag the run to tell it apart. Talking to the daemon happens on a worker
        thread, so a slow daemon never blocks the event loop.

        Returns:
            What the coroutine returns.

        Raises:
            Whatever the coroutine raises, unchanged.
            BpfprofError: only with ``stop_at_error``, when profiling fails.
        """
        self.profile_result = None
        self.current_run_id = None
        loop = asyncio.get_running_loop()
        lock = _active_run_lock
        if not lock.acquire(blocking=False):
            self._failed(
                BpfprofError("another bpfprof run is active in this process", "busy"),
                "not profiling %s",
                work_function,
            )
            return await work_function(*args, **kwargs)
        client = Client(self.socket_path, timeout=self.timeout_wait_for_finished_sec)
        try:
            try:
                run_id = await loop.run_in_executor(None, self._start, client)
            except BpfprofError as err:
                self._failed(err, "not profiling %s", work_function)
                return await work_function(*args, **kwargs)
            self.current_run_id = run_id
            trampolines = _PerfTrampolines()
            trampolines.activate()
            try:
                result = await work_function(*args, **kwargs)
            except BaseException:
                trampolines.restore()
                await loop.run_in_executor(None, self._stop_quietly, client, run_id)
                raise
            trampolines.restore()
            try:
                self.profile_result = await loop.run_in_executor(
                    None, self._finish, client, run_id
                )
            except BpfprofError as err:
                self._failed(err, "profiling %s failed", work_function)
            return result
        finally:
            client.close()
            lock.release()

    # -- steps --------------------------------------------------------------------------------

    def _start(self, client: Client) -> int:
        """Starts a run on this process and waits until it is RUNNING; returns its id."""
        deadline = time.monotonic() + self.timeout_wait_for_running_sec
        sent_unix_ms = int(time.time() * 1000)
        try:
            reply = client.run(
                os.getpid(),
                pid_ns=current_pid_namespace(),
                event=self.event,
                sample_interval=int(self.sample_each),
                duration_ms=int(self.max_profile_duration_sec * 1000),
                sample_tags=self.sample_tags,
                tags=self.tags,
                max_stack_length=self.stack_max_len,
                formats=self.formats,
                timeout=self.timeout_wait_for_running_sec,
                # "auto" is the daemon's default: not sent, so older daemons accept the run.
                unwind=None if self.unwind == "auto" else self.unwind,
                python_frames=None if self.python_frames == "auto" else self.python_frames,
                follow_children=self.follow_children,
                # "cpu" is the daemon's default: not sent, so older daemons accept the run.
                mode=None if self.mode == "cpu" else self.mode,
            )
        except BpfprofError as err:
            if err.code == "timeout":
                # The daemon may have made the run anyway: do not leave it sampling us. This
                # look is part of the same budget (at least a second, so it can happen).
                self._cancel_orphans(sent_unix_ms, max(1.0, deadline - time.monotonic()))
            raise
        run_id = reply.get("run_id")
        if not isinstance(run_id, int):
            raise BpfprofError("run reply without a run id", "protocol")
        state = reply.get("state")
        # The daemon replies once the run is RUNNING; poll in case it ever replies sooner.
        while state != "RUNNING":
            if state in FINAL_STATES:
                raise BpfprofError(
                    f"run {run_id} ended before it was running: {state}"
                    + (f" ({reply.get('reason')})" if reply.get("reason") else ""),
                    "run_failed",
                )
            if time.monotonic() >= deadline:
                self._stop_quietly(client, run_id)
                raise BpfprofError(
                    f"run {run_id} was not running after "
                    f"{self.timeout_wait_for_running_sec:g} s (state {state})",
                    "timeout",
                )
            time.sleep(_POLL_INTERVAL_SEC)
            reply = client.status(run_id)
            state = reply.get("state")
        return run_id

    def _finish(self, client: Client, run_id: int) -> Dict[str, Any]:
        """Stops the run and returns its results."""
        client.stop(run_id)
        wait_ms = int(self.timeout_wait_for_finished_sec * 1000)
        reply = client.results(run_id, wait_ms=wait_ms)
        result = {k: v for k, v in reply.items() if k not in ("version", "ok")}
        state = result.get("state")
        if state not in FINAL_STATES:
            raise BpfprofError(
                f"run {run_id} had not ended {self.timeout_wait_for_finished_sec:g} s "
                f"after the stop (state {state})",
                "timeout",
            )
        if state == "FAILED":
            raise BpfprofError(
                f"run {run_id} failed: {result.get('reason') or 'no reason given'}",
                "run_failed",
            )
        return result

    def _stop_quietly(self, client: Client, run_id: int) -> None:
        """Stops a run whose results are not wanted; failures are only logged."""
        try:
            client.stop(run_id)
        except BpfprofError as err:
            logger.warning("bpfprof: could not stop run %d: %s", run_id, err)
        else:
            logger.debug("bpfprof: stopped run %d without collecting its results", run_id)

    def _cancel_orphans(self, sent_unix_ms: int, timeout: float) -> None:
        """Stops runs on this process made from a `run` request whose reply never came."""
        pid, pid_ns = os.getpid(), current_pid_namespace()
        try:
            with Client(self.socket_path, timeout=timeout) as client:
                for run in client.list_runs():
                    if (
                        run.get("pid") == pid
                        and (pid_ns is None or run.get("pid_ns") == pid_ns)
                        and run.get("state") not in FINAL_STATES
                        and run.get("created_unix_ms", 0) >= sent_unix_ms - _ORPHAN_SLACK_MS
                        and list(run.get("sample_tags") or []) == self.sample_tags
                        and dict(run.get("tags") or {}) == self.tags
                    ):
                        logger.warning(
                            "bpfprof: stopping run %s, which started too late", run.get("run_id")
                        )
                        client.stop(run["run_id"])
        except (BpfprofError, KeyError, TypeError) as err:
            logger.debug("bpfprof: could not look for a late run: %s", err)

    def _failed(self, err: BpfprofError, what: str, work_function: Callable[..., Any]) -> None:
        """Raises ``err`` with stop_at_error, else logs it as a warning."""
        if self.stop_at_error:
            raise err
        logger.warning("bpfprof: " + what + ": %s", _name(work_function), err)


class _PerfTrampolines:
    """CPython's perf trampolines (3.12+), on while a run profiles: each Python function then
    runs through a small piece of code named ``py::function:file`` in ``/tmp/perf-PID.map``, so
    the daemon's stacks show Python functions, not only the interpreter. Left as they were
    found: a program that turned them on itself (``-X perf``) keeps them."""

    def __init__(self) -> None:
        self._activated = False

    def activate(self) -> None:
        activate = getattr(sys, "activate_stack_trampoline", None)
        if activate is None or sys.is_stack_trampoline_active():
            return
        try:
            activate("perf")
            self._activated = True
        except (ValueError, RuntimeError) as err:  # a build without trampoline support
            logger.debug("bpfprof: no perf trampolines: %s", err)

    def restore(self) -> None:
        if self._activated:
            sys.deactivate_stack_trampoline()
            self._activated = False


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


@overload
def profile(__function: F) -> F: ...


@overload
def profile(
    *, profiler: Optional[FunctionProfiler] = None, **options: Any
) -> Callable[[F], F]: ...


def profile(
    __function: Optional[F] = None,
    *,
    profiler: Optional[FunctionProfiler] = None,
    **options: Any,
) -> Union[F, Callable[[F], F]]:
    """Decorator: profile every call of the decorated function with a :class:`FunctionProfiler`.

    Forms::

        @bpfprof.profile()                                      # default options
        @bpfprof.profile(stop_at_error=True, sample_tags=["x"])  # FunctionProfiler options
        @bpfprof.profile(profiler=FunctionProfiler(...))        # a profiler of your own
        @bpfprof.profile                                        # same as profile()

    The wrapper's ``profiler`` attribute is the profiler; after each call its
    ``profile_result`` and ``current_run_id`` describe that call's run.

    Raises:
        TypeError: if both ``profiler`` and options are given.
    """
    if profiler is not None and options:
        raise TypeError("bpfprof.profile() takes either profiler= or options, not both")

    def decorate(function: F) -> F:
        chosen = profiler if profiler is not None else FunctionProfiler(**options)

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await chosen.profile_async(function, *args, **kwargs)

            async_wrapper.profiler = chosen  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return chosen.profile(function, *args, **kwargs)

        wrapper.profiler = chosen  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    if __function is not None:
        if not callable(__function):
            raise TypeError("bpfprof.profile() options are keyword-only")
        return decorate(__function)
    return decorate
