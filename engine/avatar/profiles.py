"""Output profiles: the frame sizes the avatar renders at (names match ``AvatarConfig.profile``)."""

from __future__ import annotations

PROFILES: dict[str, tuple[int, int]] = {
    "720p": (1280, 720),
    "1080p": (1920, 1080),
    "portrait": (1080, 1920),
    "square": (720, 720),
    "360p": (640, 360),
}


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
