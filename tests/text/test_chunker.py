"""ReplyChunker: streamed LLM text in, TTS chunks out."""

from __future__ import annotations

import re

import pytest

from engine.text.chunker import ReplyChunker, TextChunk
from engine.tts.config import TTSConfig

pytestmark = pytest.mark.unit


def tokens(text: str) -> list[str]:
    """Split like an LLM tokenizer: short pieces, spaces leading."""
    return re.findall(r"\s*\S{1,3}", text)


def run(text: str, **kw: int) -> list[TextChunk]:
    c = ReplyChunker(**kw)
    out: list[TextChunk] = []
    for piece in tokens(text):
        out += c.feed(piece)
    return out + c.flush()


def texts(chunks: list[TextChunk]) -> list[str]:
    return [c.text for c in chunks]


def test_first_chunk_at_first_clause_later_at_sentences() -> None:
    got = run("Oh wow, that is great. I love it, really! And then, well, we go.")
    assert texts(got) == ["Oh wow,", "that is great.", "I love it, really!", "And then, well, we go."]
    assert [c.index for c in got] == [0, 1, 2, 3]


def test_first_chunk_waits_for_min_words() -> None:
    assert texts(run("Hi, there you are. Yes.", first_chunk_min_words=3)) == ["Hi, there you are.", "Yes."]


def test_first_chunk_is_emitted_as_soon_as_its_boundary_is_certain() -> None:
    c = ReplyChunker()
    assert c.feed("Hello there") == []
    assert c.feed(",") == []
    assert texts(c.feed(" my")) == ["Hello there,"]


def test_decimals_abbreviations_initials_not_split() -> None:
    text = (
        "Well then. Sure thing. It costs 3.5 dollars, e.g. at Mr. Smith's shop. J. K. Rowling agrees. "
        "It is 10:30 now."
    )
    got = texts(run(text, first_chunk_min_words=2))
    assert got == [
        "Well then.",
        "Sure thing.",
        "It costs 3.5 dollars, e.g. at Mr. Smith's shop.",
        "J. K. Rowling agrees.",
        "It is 10:30 now.",
    ]


def test_the_second_chunk_is_short_too() -> None:
    """It must be ready before the first has played: a clause boundary (not after one word) or
    second_chunk_max_words end it; the chunks after it go by sentences again."""
    text = (
        "Oh hi there, well, I really love going to the beach with my friends every single summer. "
        "It is sunny, warm and fun."
    )
    got = texts(run(text, first_chunk_min_words=2, first_chunk_max_words=4, second_chunk_max_words=6))
    assert got == [
        "Oh hi there,",
        "well, I really love going to",
        "the beach with my friends every single summer.",
        "It is sunny, warm and fun.",
    ]
    assert texts(run("Yes, I do. Well, of course I do, always.", first_chunk_min_words=1))[:2] == [
        "Yes,",
        "I do.",
    ]


def test_ellipsis_splits_only_before_a_new_sentence() -> None:
    got = texts(run("So here we go. Well... maybe not... I think so."))
    assert got == ["So here we go.", "Well... maybe not...", "I think so."]


def test_newlines_and_quotes_end_sentences() -> None:
    got = texts(run('Okay, first one.\nSecond line here\nShe said "hi." Then left.'))
    assert got == ["Okay, first one.", "Second line here", 'She said "hi."', "Then left."]


def test_long_run_on_is_cut_at_max_words() -> None:
    text = " ".join(["word"] * 8) + ", " + " ".join(["more"] * 10) + "."
    got = run(text, first_chunk_min_words=20, max_chunk_words=10, first_chunk_max_words=10)
    assert got[0].text == " ".join(["word"] * 8) + ","
    assert all(len(c.text.split()) <= 10 for c in got)
    assert " ".join(texts(got)) == text


def test_tags_removed_and_attached_to_their_chunk() -> None:
    got = run("[happy] Hi there, everyone! [wave] Nice to *nods* see you. Bye! [sad]")
    assert texts(got) == ["Hi there,", "everyone!", "Nice to see you.", "Bye!"]
    assert got[0].expressions == ("happy",)
    assert got[2].gestures == ("wave", "nod")
    assert got[3].expressions == ("sad",)  # trailing tags go to the last chunk
    assert all("[" not in c.text and "*" not in c.text for c in got)


def test_tag_split_across_tokens() -> None:
    c = ReplyChunker()
    out = []
    for piece in ["[hap", "py]", " Hello", " there", ",", " friend", "[wa", "ve", "].", " Bye", "!"]:
        out += c.feed(piece)
    out += c.flush()
    assert texts(out) == ["Hello there,", "friend.", "Bye!"]
    assert out[0].expressions == ("happy",) and out[1].gestures == ("wave",)


def test_unknown_tags_reported_never_spoken() -> None:
    got = run("Hi there, [dramatic pause] you came.")
    assert texts(got) == ["Hi there,", "you came."]
    assert got[1].unknown_tags == ("dramatic pause",)


def test_tags_only_reply_gives_one_empty_chunk() -> None:
    got = run("[wave] [happy]")
    assert len(got) == 1 and got[0].text == "" and got[0].gestures == ("wave",)


def test_from_config_and_event() -> None:
    c = ReplyChunker.from_config(TTSConfig(first_chunk_min_words=1, max_chunk_words=12))
    assert (c.first_chunk_min_words, c.max_chunk_words) == (1, 12)
    chunk = (c.feed("Hi, you. ") + c.flush())[0]
    ev = chunk.to_event(t=1.5, turn_id=7)
    assert (ev.text, ev.index, ev.turn_id, ev.t) == ("Hi,", 0, 7, 1.5)


def test_reset_forgets_the_reply() -> None:
    c = ReplyChunker()
    c.feed("Half a sent")
    c.reset()
    assert texts(c.feed("New one. ") + c.flush()) == ["New one."]
