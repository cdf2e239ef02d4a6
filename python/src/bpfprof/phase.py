"""Profile the phases of a long program, each as its own tagged run.

A phase profiler tags every run with a session (unique per :meth:`PhaseProfiler.enable`) and
the phase's name, so that all runs of one program execution can be found and compared::

    phases = PhaseProfiler.enable()
    graph = phases.profile_phase(trace_model, "trace", model)
    code = phases.profile_phase(compile_graph, "compile", graph)

Defaults come from the environment: ``BPFPROF_SAMPLE_INTERVAL`` (event units, default 1e7),
``BPFPROF_MAX_STACK_LENGTH`` (default 127), ``BPFPROF_MAX_PROFILE_TIME`` (seconds, default
600), ``BPFPROF_UNWIND`` (``auto``, ``fp`` or ``cfi``, as ``bpfprof --unwind``; default
``auto``), ``BPFPROF_MODE`` (``cpu`` or ``wall``, as ``bpfprof --mode``; default ``cpu``),
and ``BPFPROF_PHASE_FILTER``, a regular expression: phases whose name it does not
match run unprofiled. An invalid filter is reported and profiles nothing, since whoever set it meant
to narrow profiling down.
"""

from __future__ import annotations

import logging
import os
import re
import socket as _socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, TypeVar

from .client import (
    MODES,
    UNWIND_MODES,
    BpfprofError,
    PathLike,
    check_mode,
    check_unwind,
    parse_switch,
)
from .client import socket_path as resolve_socket_path
from .profiler import FunctionProfiler

__all__ = ["PhaseProfiler", "PhaseStats"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_TAG_CHARS = re.compile(r"[^A-Za-z0-9_.:/@+-]")
_MAX_TAG_LEN = 128


def sanitize_tag(value: str) -> str:
    """Makes ``value`` a valid tag value: allowed characters only, 1 to 128 long."""
    cleaned = _TAG_CHARS.sub("_", value)[:_MAX_TAG_LEN]
    return cleaned or "_"


@dataclass
class PhaseStats:
    """Counts of what happened to the phases of a session."""

    succeeded: int = 0
    failed: int = 0
    skipped_nested: int = 0
    filtered_out: int = 0


def _env_number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        logger.warning("bpfprof: ignoring %s=%r: not a number", name, raw)
        return default
    if value <= 0:
        logger.warning("bpfprof: ignoring %s=%r: must be positive", name, raw)
        return default
    return value


def _env_unwind(env: Mapping[str, str]) -> str:
    raw = env.get("BPFPROF_UNWIND", "").strip()
    if raw == "":
        return "auto"
    if raw not in UNWIND_MODES:
        logger.warning("bpfprof: ignoring BPFPROF_UNWIND=%r: expected auto, fp or cfi", raw)
        return "auto"
    return raw


def _env_mode(env: Mapping[str, str]) -> str:
    raw = env.get("BPFPROF_MODE", "").strip()
    if raw == "":
        return "cpu"
    if raw not in MODES:
        logger.warning("bpfprof: ignoring BPFPROF_MODE=%r: expected cpu or wall", raw)
        return "cpu"
    return raw


class PhaseProfiler:
    """Profiles named phases of one program execution, tagging runs with session and phase.

    Use :meth:`enable` to create one. Nested phases (a phase started while another one of this
    profiler runs on the same thread) run unprofiled and are counted in :attr:`stats`.
    """

    def __init__(
        self,
        session: str,
        *,
        stop_at_error: bool = False,
        socket_path: Optional[PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        unwind: Optional[str] = None,
        mode: Optional[str] = None,
    ) -> None:  # noqa: D107
        env = os.environ if env is None else env
        self.session: str = sanitize_tag(session)
        self.stop_at_error: bool = stop_at_error
        self.socket_path: Optional[PathLike] = socket_path
        self.sample_interval: float = _env_number(env, "BPFPROF_SAMPLE_INTERVAL", 1e7)
        self.max_stack_length: int = int(_env_number(env, "BPFPROF_MAX_STACK_LENGTH", 127))
        self.max_profile_time_sec: float = _env_number(env, "BPFPROF_MAX_PROFILE_TIME", 600)
        self.unwind: str = check_unwind(unwind) if unwind is not None else _env_unwind(env)
        # ``wall`` adds each thread's time off the CPU to the phase's profile (as
        # FunctionProfiler's ``mode``).
        self.mode: str = check_mode(mode) if mode is not None else _env_mode(env)
        raw_follow = env.get("BPFPROF_FOLLOW_CHILDREN", "")
        follow = parse_switch(raw_follow)
        if follow is None and raw_follow.strip():
            logger.warning("bpfprof: ignoring BPFPROF_FOLLOW_CHILDREN=%r: expected 1 or 0", raw_follow)
        self.follow_children: bool = bool(follow)
        self._filter: Optional[re.Pattern[str]] = None
        self._filter_invalid = False
        raw_filter = env.get("BPFPROF_PHASE_FILTER")
        if raw_filter:
            try:
                self._filter = re.compile(raw_filter)
            except re.error as err:
                logger.warning(
                    "bpfprof: invalid BPFPROF_PHASE_FILTER %r (%s): profiling no phase",
                    raw_filter,
                    err,
                )
                self._filter_invalid = True
        self.stats: PhaseStats = PhaseStats()
        self.results: Dict[str, Dict[str, Any]] = {}
        self._local = threading.local()
        self._stats_lock = threading.Lock()

    @classmethod
    def enable(
        cls,
        *,
        stop_at_error: bool = False,
        socket_path: Optional[PathLike] = None,
        env: Optional[Mapping[str, str]] = None,
        unwind: Optional[str] = None,
        mode: Optional[str] = None,
    ) -> "PhaseProfiler":
        """Starts a session with a unique tag made of the time, the pid and the hostname."""
        session = f"{int(time.time())}-{os.getpid()}-{_socket.gethostname()}"
        profiler = cls(
            session,
            stop_at_error=stop_at_error,
            socket_path=socket_path,
            env=env,
            unwind=unwind,
            mode=mode,
        )
        logger.info(
            "bpfprof: phase session %s; results are kept by the daemon at %s "
            "(list them with `bpfprof list`, tags session=%s)",
            profiler.session,
            resolve_socket_path(socket_path),
            profiler.session,
        )
        return profiler

    def profile_phase(
        self, func: Callable[..., T], phase_name: str, *args: Any, **kwargs: Any
    ) -> T:
        """Calls ``func(*args, **kwargs)`` as phase ``phase_name``, profiled unless nested or
        filtered out; returns what it returns and lets its exceptions through unchanged."""
        if getattr(self._local, "depth", 0) > 0:
            self._count("skipped_nested")
            logger.debug("bpfprof: phase %s is nested: not profiled", phase_name)
            return func(*args, **kwargs)
        if self._filter_invalid or (self._filter and not self._filter.search(phase_name)):
            self._count("filtered_out")
            logger.debug("bpfprof: phase %s does not match the filter: not profiled", phase_name)
            return func(*args, **kwargs)
        profiler = FunctionProfiler(
            stop_at_error=self.stop_at_error,
            max_profile_duration_sec=self.max_profile_time_sec,
            sample_each=self.sample_interval,
            stack_max_len=self.max_stack_length,
            unwind=self.unwind,
            mode=self.mode,
            follow_children=self.follow_children,
            tags={"session": self.session, "phase": sanitize_tag(phase_name)},
            socket_path=self.socket_path,
        )
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            result = profiler.profile(func, *args, **kwargs)
        except BpfprofError:
            self._count("failed")
            raise
        finally:
            self._local.depth -= 1
        if profiler.profile_result is not None and profiler.profile_result.get("state") in (
            "SUCCESS",
            "STOPPED",
        ):
            self._count("succeeded")
            self.results[phase_name] = profiler.profile_result
        else:
            self._count("failed")
        self.log_summary()
        return result

    def _count(self, what: str) -> None:
        with self._stats_lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)

    def log_summary(self) -> None:
        """Logs how many phases succeeded, failed, were nested or filtered out."""
        s = self.stats
        logger.info(
            "bpfprof: session %s: %d phases profiled, %d failed, %d nested skipped, "
            "%d filtered out",
            self.session,
            s.succeeded,
            s.failed,
            s.skipped_nested,
            s.filtered_out,
        )
