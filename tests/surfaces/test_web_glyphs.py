"""The pages' own text renders everywhere: no symbol that needs a font a system may lack (an emoji font)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

WEB = Path(__file__).resolve().parents[2] / "web"


def _safe(ch: str) -> bool:
    """ASCII, Latin-1 and general punctuation (… – — · ×): in every text font, DejaVu and Liberation too."""
    return ord(ch) < 0x250 or 0x2000 <= ord(ch) <= 0x206F


@pytest.mark.parametrize("page", ["console", "obs", "overlay", "shared"])
def test_pages_use_only_common_glyphs(page: str) -> None:
    files = [p for p in (WEB / page).glob("*") if p.suffix in (".html", ".js", ".css")]
    assert files, page
    bad = [
        f"{p.name}:{n}: U+{ord(ch):04X} {unicodedata.name(ch, '?')}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        for ch in line
        if not _safe(ch)
    ]
    assert not bad, bad
