"""The CPU image, for real: built from docker/Dockerfile, run with host networking, it answers
one spoken question at the bench (``idolcast bench --url``), reports healthy, and stops on
SIGTERM with exit code 0 (the drain).

Opt-in (IDOLCAST_TEST_DOCKER=1): the first build compiles llama.cpp and installs torch and
the models, far longer than the rest of ``make test`` on a small machine. Later builds reuse
the cached layers. The base image: IDOLCAST_DOCKER_BASE (default idolcast-base:bookworm,
made by scripts/docker_base.sh where no registry is reachable)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.surfaces.harness import free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("IDOLCAST_DOCKER_IMAGE", "idolcast:cpu")
BASE = os.environ.get("IDOLCAST_DOCKER_BASE", "idolcast-base:bookworm")
TOKEN = "docker-test-host-token-0123456789abcdef"


def docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image() -> str:
    if os.environ.get("IDOLCAST_TEST_DOCKER") != "1":
        pytest.skip("opt-in: IDOLCAST_TEST_DOCKER=1 builds and runs the image (see docs/deploy.md)")
    if shutil.which("docker") is None:
        pytest.skip("no docker client (apt-get install docker.io)")
    info = docker("info", check=False)
    if info.returncode != 0:
        pytest.skip(f"dockerd is not running or not reachable: {info.stderr.strip().splitlines()[-1:]}")
    if docker("image", "inspect", BASE, check=False).returncode != 0:
        pytest.skip(
            f"no base image {BASE}: make one with scripts/docker_base.sh (or set IDOLCAST_DOCKER_BASE)"
        )
    build = subprocess.run(
        [
            "docker",
            "build",
            "--network",
            "host",
            "-f",
            "docker/Dockerfile",
            "--build-arg",
            f"BASE={BASE}",
            "-t",
            IMAGE,
            ".",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3 * 3600,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    return IMAGE


def health(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"{url}/api/health?ready=1", timeout=3) as r:
            return dict(json.loads(r.read()))
    except OSError:
        return None


@pytest.mark.timeout(1800)
def test_the_image_answers_a_spoken_question_and_drains(image: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "IDOLCAST_SERVER__HOST": "127.0.0.1",
        "IDOLCAST_SERVER__PORT": str(port),
        "IDOLCAST_SERVER__HOST_TOKEN": TOKEN,
        "IDOLCAST_MQTT__ENABLED": "false",
        "IDOLCAST_AVATAR__ENABLED": "false",
    }
    run = (
        ["run", "-d", "--network", "host"] + [a for k, v in env.items() for a in ("-e", f"{k}={v}")] + [image]
    )
    cid = docker(*run).stdout.strip()
    try:
        deadline = time.monotonic() + 600
        while health(url) is None and time.monotonic() < deadline:
            assert docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip() == "true", docker(
                "logs", cid
            ).stderr
            time.sleep(2)
        assert health(url) is not None, docker("logs", cid, check=False).stderr[-3000:]
        bench = subprocess.run(
            [
                str(Path(sys.executable).parent / "idolcast"),
                "bench",
                "--url",
                url,
                "--turns",
                "1",
                "--barge-rounds",
                "0",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
            env={**os.environ, "IDOLCAST_TOKEN": TOKEN},
        )
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        report = json.loads(bench.stdout[bench.stdout.index("{") :])
        (turn,) = report["turns"]
        assert not turn.get("unanswered") and turn["voice_to_voice_ms"] is not None, turn
        deadline = time.monotonic() + 120
        status = ""
        while time.monotonic() < deadline:
            status = docker("inspect", "-f", "{{.State.Health.Status}}", cid).stdout.strip()
            if status == "healthy":
                break
            time.sleep(3)
        assert status == "healthy"
        docker("stop", "-t", "60", cid, timeout=90)
        assert docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip() == "0"
        assert "drained in" in docker("logs", cid).stderr + docker("logs", cid).stdout
    finally:
        docker("rm", "-f", cid, check=False)
