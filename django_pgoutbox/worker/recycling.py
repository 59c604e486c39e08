"""Recycling: when a worker process should finish its running jobs and start afresh.

A handler that leaks memory, or that outlives its timeout again and again (each time leaving a
thread behind that no one can stop), grows its process without bound. ``runworkers
--max-jobs``, ``--max-memory`` and ``--max-abandoned-threads`` bound it: past a limit, the
worker stops claiming, lets its running jobs finish within the grace period (as at SIGTERM),
and ``runworkers`` starts the same command again in the same process (``exec``): its memory and
its abandoned threads are gone, its pid stays (docs/workers.md, "Recycling").
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass

#: ``--max-abandoned-threads``'s default. A thread whose handler outlived its timeout is
#: abandoned (Python cannot stop it); it holds whatever the handler holds until it returns.
DEFAULT_MAX_ABANDONED = 16

#: How often (seconds) the worker compares itself with its limits.
CHECK_INTERVAL = 0.25


@dataclass(frozen=True)
class Recycling:
    """The limits past which a worker process recycles itself; None: no limit."""

    #: Outcomes written (jobs run to an outcome) by this process.
    max_jobs: int | None = None
    #: Resident memory, in bytes.
    max_memory: int | None = None
    #: Handler threads abandoned at their timeout and still running.
    max_abandoned: int | None = DEFAULT_MAX_ABANDONED

    def __post_init__(self) -> None:
        for name in ("max_jobs", "max_memory", "max_abandoned"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be a whole number or None, not {value!r}")
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (None: no limit), not {value}")

    @property
    def limited(self) -> bool:
        return (self.max_jobs, self.max_memory, self.max_abandoned) != (None, None, None)

    def reason(self, *, jobs: int, memory: int | None, abandoned: int) -> str | None:
        """Why the process should recycle now (the limit it reached), or None."""
        if self.max_jobs is not None and jobs >= self.max_jobs:
            return f"{jobs} jobs run (--max-jobs {self.max_jobs})"
        if self.max_memory is not None and memory is not None and memory >= self.max_memory:
            return (
                f"resident memory {memory / 2**20:.0f} MiB "
                f"(--max-memory {self.max_memory / 2**20:.0f})"
            )
        if self.max_abandoned is not None and abandoned >= self.max_abandoned:
            return (
                f"{abandoned} handler threads abandoned at their timeout and still running "
                f"(--max-abandoned-threads {self.max_abandoned})"
            )
        return None


def resident_memory() -> int | None:
    """This process's resident memory now, in bytes: ``/proc/self/statm`` on Linux; elsewhere
    its peak (``getrusage``), which can only be as large or larger; None if neither answers."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere
