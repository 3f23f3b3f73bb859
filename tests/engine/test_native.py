"""The native libraries' OpenMP workers sleep when idle (engine/native.py), unless the user says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine import quiet_thread_pools


def _omp_settings(**env: str) -> str:
    """What the OpenMP runtimes of llama.cpp and CTranslate2 report at start, in a fresh process."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME")}
    environ.update(OMP_DISPLAY_ENV="TRUE", **env)
    run = subprocess.run(
        [sys.executable, "-c", "import engine, ctranslate2, llama_cpp"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return run.stderr


@pytest.mark.unit
def test_idle_openmp_workers_sleep_in_every_runtime_the_engine_loads() -> None:
    report = _omp_settings()
    assert report.count("OPENMP DISPLAY ENVIRONMENT BEGIN") >= 2  # llama.cpp's libgomp and CTranslate2's
    assert report.count("OMP_WAIT_POLICY = 'PASSIVE'") == report.count("OPENMP DISPLAY ENVIRONMENT BEGIN")


@pytest.mark.unit
def test_a_users_own_wait_policy_is_kept() -> None:
    report = _omp_settings(OMP_WAIT_POLICY="ACTIVE")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in report and "'PASSIVE'" not in report
    environ = {"KMP_BLOCKTIME": "200"}
    quiet_thread_pools(environ)
    assert environ == {"KMP_BLOCKTIME": "200", "OMP_WAIT_POLICY": "PASSIVE"}
