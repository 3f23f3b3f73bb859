"""Output profiles: the frame sizes the avatar renders at (names match ``AvatarConfig.profile``)."""

from __future__ import annotations

PROFILES: dict[str, tuple[int, int]] = {
    "720p": (1280, 720),
    "1080p": (1920, 1080),
    "portrait": (1080, 1920),
    "square": (720, 720),
    "360p": (640, 360),
}


AUTO_CPU_CORES = 8  # fewer cores and no GPU: 720p at 30 fps does not fit beside the voice pipeline


def resolve_profile(profile: str) -> str:
    """A concrete profile for ``avatar.profile``: 'auto' is 720p with a CUDA GPU or 8+ cores, else 360p
    (on 2 cores a 720p frame costs ~15-25 ms to render plus ~13 ms to encode: the idol would stutter)."""
    if profile != "auto":
        return profile
    import os

    import torch

    if torch.cuda.is_available() or (os.cpu_count() or 1) >= AUTO_CPU_CORES:
        return "720p"
    return "360p"


def profile_size(profile: str | tuple[int, int]) -> tuple[int, int]:
    """(width, height) of a named profile, or the pair itself."""
    if isinstance(profile, tuple):
        w, h = profile
    elif profile in PROFILES:
        w, h = PROFILES[profile]
    else:
        raise ValueError(f"unknown output profile {profile!r} (expected one of {', '.join(PROFILES)})")
    if not (16 <= w <= 8192 and 16 <= h <= 8192):
        raise ValueError(f"output size {w}x{h} is outside 16..8192")
    return int(w), int(h)


def profile_name(width: int, height: int) -> str:
    for name, size in PROFILES.items():
        if size == (width, height):
            return name
    return f"{width}x{height}"
