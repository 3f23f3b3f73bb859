"""``idolcast doctor``: what will be used, and does it load."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

from engine.config import Settings
from engine.progress import ConsoleProgress


def _row(name: str, status: str, detail: str) -> None:
    print(f"  {name:<10} {status:<6} {detail}")


def _devices() -> list[str]:
    out = []
    try:
        import torch

        out.append(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
        if torch.cuda.is_available():
            out.extend(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count()))
        else:
            out.append("no CUDA device")
    except Exception as e:  # pragma: no cover - environment specific
        out.append(f"torch unavailable: {e}")
    try:
        import ctranslate2

        out.append(
            f"ctranslate2 {ctranslate2.__version__}, CUDA devices: {ctranslate2.get_cuda_device_count()}"
        )
    except Exception as e:  # pragma: no cover
        out.append(f"ctranslate2 unavailable: {e}")
    return out


def describe_access(settings: Settings) -> list[str]:
    """Where the host credential is, and the token itself (the console of this machine needs none)."""
    from pathlib import Path

    from engine.server.credentials import HOST_TOKEN_FILE, read_host_token
    from engine.server.guard import is_loopback

    server = settings.server
    path = Path(server.secrets_dir) / HOST_TOKEN_FILE
    if server.host_token:
        lines = ["host token: set by server.host_token"]
    elif (token := read_host_token(server.secrets_dir)) is not None:
        lines = [f"host token: {token}  ({path}; send as Authorization: Bearer, or paste as #token=)"]
    else:
        lines = [f"host token: made on the first start, into {path}"]
    mqtt_users = Path(server.secrets_dir) / "mqtt_users.json"
    if settings.mqtt.enabled and settings.mqtt.url == "embedded":
        made = "made" if mqtt_users.exists() else "made on the first start"
        lines.append(f"MQTT users host and chat: passwords {made} in {mqtt_users}")
    where = "this machine only" if is_loopback(server.host) else "THE NETWORK: every request needs a token"
    lines.append(f"listening on {server.host}:{server.port} ({where})")
    return lines


def run_doctor(settings: Settings, load: bool = True) -> int:
    print(f"idolcast doctor — Python {platform.python_version()} on {platform.machine()}")
    print("devices:")
    for line in _devices():
        print(f"  {line}")
    print("stages:")
    progress = ConsoleProgress()
    failures = 0

    def check(name: str, describe: str, loader: Callable[[], object]) -> object | None:
        nonlocal failures
        if not load:
            _row(name, "-", describe)
            return None
        start = time.perf_counter()
        try:
            obj = loader()
        except Exception as e:
            failures += 1
            _row(name, "FAIL", f"{describe}: {type(e).__name__}: {e}")
            return None
        took = time.perf_counter() - start
        desc = getattr(obj, "describe", None)
        _row(name, "ok", f"{desc() if callable(desc) else describe} (loaded in {took:.1f}s)")
        return obj

    from engine.asr.factory import load_asr
    from engine.llm.factory import load_llm
    from engine.models import load_vad_factory
    from engine.tts.factory import load_tts

    check(
        "vad",
        f"silero (threshold {settings.vad.threshold})",
        lambda: load_vad_factory(settings.vad, progress),
    )
    check(
        "asr",
        f"{settings.asr.backend} {settings.asr.model} on {settings.asr.device}",
        lambda: load_asr(settings.asr, progress),
    )
    check("tts", f"{settings.tts.backend} {settings.tts.voice}", lambda: load_tts(settings.tts, progress))
    llm_desc = (
        f"openai-compatible {settings.llm.base_url} model {settings.llm.model}"
        if settings.llm.backend == "openai"
        else f"transformers {settings.llm.model} on {settings.llm.device}"
    )
    check("llm", llm_desc, lambda: load_llm(settings.llm, progress))
    print("access:")
    for line in describe_access(settings):
        print(f"  {line}")
    print("all stages load" if failures == 0 else f"{failures} stage(s) failed to load")
    return 0 if failures == 0 else 1
