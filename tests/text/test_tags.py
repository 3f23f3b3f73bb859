"""Inline tag parsing and text cleaning."""

from __future__ import annotations

import pytest

from engine.text.tags import ParsedText, TagStream, collect, lookup, parse_tags

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "kind", "canonical"),
    [
        ("happy", "expression", "happy"),
        ("HAPPY", "expression", "happy"),
        ("smile", "expression", "happy"),
        ("Surprised", "expression", "surprised"),
        ("wave", "gesture", "wave"),
        ("tilt head", "gesture", "tilt"),
        ("Tilts  Head", "gesture", "tilt"),
        ("nods", "gesture", "nod"),
        ("dramatic pause", "unknown", "dramatic pause"),
    ],
)
def test_lookup_names_and_aliases(name: str, kind: str, canonical: str) -> None:
    tag = lookup(name)
    assert (tag.kind, tag.name) == (kind, canonical)


def test_bracket_tags_are_removed_and_reported() -> None:
    got = parse_tags("[Happy] Hi there [wave]! I [tilt head] love it [dramatic pause] [smile].")
    assert got == ParsedText(
        text="Hi there! I love it.",
        expressions=("happy",),
        gestures=("wave", "tilt"),
        unknown=("dramatic pause",),
    )


def test_asterisk_actions_versus_emphasis() -> None:
    got = parse_tags("That is *so* cool *waves excitedly* and **bold** *leans closer* ok")
    assert got.text == "That is so cool and bold ok"
    assert got.gestures == ("wave",)
    assert got.unknown == ("leans closer",)


def test_markdown_emoji_and_urls() -> None:
    got = parse_tags(
        "# Title\n- See [the docs](https://x.io/a) or https://example.com/page.\n`code` 😊👍 ~~no~~"
    )
    assert got.text == "Title\nSee the docs or a link.\ncode no"
    assert got.expressions == ("happy",)


def test_numbers_in_text_are_not_list_marks() -> None:
    assert parse_tags("I counted to 2. Then 3.\n1. First").text == "I counted to 2. Then 3.\nFirst"


def _stream(pieces: list[str]) -> ParsedText:
    s = TagStream()
    out = []
    for p in pieces:
        out += s.feed(p)
    return collect(out + s.flush())


@pytest.mark.parametrize(
    "pieces",
    [
        ["[hap", "py] Hi", " there"],
        ["[", "happy", "]", " Hi there"],
        ["*wa", "ves* Hi", " there"],
        ["[happy]", " Hi ther", "e [wa", "ve]"],
    ],
)
def test_tags_split_across_pieces(pieces: list[str]) -> None:
    whole = parse_tags("".join(pieces))
    got = _stream(pieces)
    assert got == whole
    assert got.text == "Hi there"
    assert got.expressions or got.gestures


def test_streamed_url_is_never_spoken_in_parts() -> None:
    got = _stream(["Go to ", "htt", "ps://exa", "mple.com", "/x now"])
    assert got.text == "Go to a link now"


def test_stray_bracket_is_released_after_a_while() -> None:
    s = TagStream()
    spoken = "".join(p for p in s.feed("[ " + "word " * 30) if isinstance(p, str))
    assert spoken.startswith("word word")
