"""The cores a process may use: its affinity, capped by a container's CPU quota (cgroup v2 and v1)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.cores import affinity_cores, cpu_quota, set_share, usable_cores, usable_cpu
from engine.server.capacity import machine_cores
from engine.transport.encoders import EncoderPolicy

pytestmark = pytest.mark.unit


def _v2(root: Path, text: str) -> Path:
    (root / "cpu.max").write_text(text)
    return root


def _v1(root: Path, quota: str, period: str) -> Path:
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text(quota)
    (root / "cpu" / "cpu.cfs_period_us").write_text(period)
    return root


def test_a_cgroup_v2_quota_caps_the_cores(tmp_path: Path) -> None:
    root = _v2(tmp_path, "50000 100000\n")  # half a core, as `docker run --cpus 0.5` writes it
    assert cpu_quota(root) == 0.5
    assert usable_cpu(root) == 0.5
    assert usable_cores(root) == 1


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    assert cpu_quota(_v2(tmp_path, "max 100000\n")) is None
    assert usable_cores(tmp_path) == affinity_cores() == len(os.sched_getaffinity(0))
    assert cpu_quota(tmp_path / "absent") is None


def test_a_quota_above_the_affinity_changes_nothing(tmp_path: Path) -> None:
    root = _v2(tmp_path, f"{(affinity_cores() + 3) * 100000} 100000\n")
    assert usable_cores(root) == affinity_cores()


def test_cgroup_v1(tmp_path: Path) -> None:
    assert cpu_quota(_v1(tmp_path, "150000\n", "100000\n")) == 1.5
    assert usable_cores(tmp_path) == min(2, affinity_cores())


def test_cgroup_v1_without_a_limit(tmp_path: Path) -> None:
    assert cpu_quota(_v1(tmp_path, "-1\n", "100000\n")) is None


def test_unreadable_quota_files_are_no_quota(tmp_path: Path) -> None:
    assert cpu_quota(_v2(tmp_path, "garbage")) is None


@pytest.fixture
def share() -> Iterator[Callable[[float], None]]:
    yield set_share
    set_share(0)


def test_a_share_caps_the_cores_below_the_affinity_and_the_quota(
    tmp_path: Path, share: Callable[[float], None]
) -> None:
    share(0.5)  # server.cpus = 0.5: one of several engines on a box without container limits
    assert usable_cpu(tmp_path) == 0.5
    assert usable_cores(tmp_path) == 1
    share(0)  # no share: the affinity again
    assert usable_cpu(tmp_path) == affinity_cores()
    share(0.5)
    assert usable_cpu(_v2(tmp_path, "25000 100000\n")) == 0.25  # a quota below the share still wins


def test_the_engines_pools_and_capacity_are_sized_by_its_share(share: Callable[[float], None]) -> None:
    whole = usable_cpu()
    assert EncoderPolicy().cores == usable_cores()
    share(1)
    assert machine_cores() == min(1.0, whole)  # the capacity estimate counts the share
    assert EncoderPolicy().cores == 1  # the video encoders' thread budget
