"""bpfprof: profile Python functions and phases with the bpfprof eBPF sampling profiler.

The package speaks the bpfprof daemon's protocol over its Unix socket (``BPFPROF_SOCKET``, else
``/run/bpfprof/bpfprof.sock``); the daemon samples this process's native stacks in the kernel.
"""

from .client import BpfprofError, Client, socket_path
from .phase import PhaseProfiler, PhaseStats
from .profiler import FunctionProfiler, profile

__all__ = [
    "BpfprofError",
    "Client",
    "FunctionProfiler",
    "PhaseProfiler",
    "PhaseStats",
    "profile",
    "socket_path",
]
__version__ = "0.1.0"
