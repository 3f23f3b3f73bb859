"""How many cores this process may use: the ones it may run on, and no more than its CPU quota.

Every thread count the engine picks (the models' pools, the video encoders, the capacity estimate) starts
from here. ``os.cpu_count()`` is the machine's; what a process may use is less:

* its **affinity** (``taskset``, a pinned container): ``os.sched_getaffinity``;
* its **CPU quota** (a container's ``--cpus``, a Kubernetes CPU limit): the cgroup's ``cpu.max`` (v2) or
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1). A pod limited to 4 CPUs on a 64-core node sees all 64
  in its affinity; sizing pools by that makes 64 threads share 4 cores' worth of time, and the kernel then
  throttles the whole container for the rest of each period;
* its **share** (``server.cpus``): engines that share a box without container limits (replicas on one GPU
  box, ``idolcast bench --engines``) each see every core; without a share each sizes its pools and its
  capacity for the whole box, four replicas four times over.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
_share: float | None = None  # server.cpus, set once at start (set_share)


def set_share(cpus: float) -> None:
    """Cap what this process sizes itself by at ``cpus`` cores (``server.cpus``; 0 = no cap). Call it before
    any pool is sized: the models' runtimes read it when they load."""
    global _share
    _share = cpus if cpus > 0 else None


def affinity_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_quota(root: Path = CGROUP) -> float | None:
    """The cgroup's CPU limit in cores (``2.5`` for a quota of 250 ms per 100 ms), or None without one."""
    try:  # cgroup v2: "max 100000" (no limit) or "250000 100000"
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period) if int(period) > 0 else None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cpu(root: Path = CGROUP) -> float:
    """The CPU time this process may use, in cores: its affinity, capped by its quota and its share (may be
    fractional)."""
    limits = [float(affinity_cores())] + [c for c in (cpu_quota(root), _share) if c is not None]
    return max(min(limits), 0.01)


def usable_cores(root: Path = CGROUP) -> int:
    """Whole cores for sizing thread pools: :func:`usable_cpu` rounded up, at least 1."""
    return max(1, math.ceil(usable_cpu(root) - 1e-9))


CPU_TIME_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu_times(stat: Path = Path("/proc/stat")) -> dict[str, float] | None:
    """The whole machine's CPU seconds since boot by kind (all processes, all cores; the first line of
    ``/proc/stat``: :data:`CPU_TIME_KINDS`), or None where there is no such file."""
    try:
        with open(stat, "rb") as f:
            ticks = [int(x) for x in f.readline().split()[1 : 1 + len(CPU_TIME_KINDS)]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return {kind: t / hz for kind, t in zip(CPU_TIME_KINDS, ticks, strict=False)}


__all__ = [
    "CPU_TIME_KINDS",
    "affinity_cores",
    "cpu_quota",
    "machine_cpu_times",
    "set_share",
    "usable_cores",
    "usable_cpu",
]
