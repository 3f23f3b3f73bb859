"""Inline tags in LLM replies, and everything else TTS must not read aloud.

The persona prompt lets the model write stage directions inline: ``[happy]``, ``[wave]``,
``*waves*``, ``*tilts head*``. They are parsed out (case-insensitive, with aliases such as
``smile`` -> happy, ``tilt head`` -> tilt) and reported as expressions and gestures; a bracket
tag we do not know (``[laughs]``) is removed from the spoken text too and reported as unknown.
Also removed or rewritten: markdown emphasis/headings/bullets/code marks, markdown links
(their text is kept), emoji (a few map to expressions), and URLs (spoken as "a link").

Single asterisks are ambiguous: ``*waves*`` is an action, ``*really*`` is emphasis. A span is
an action when it names a known tag or starts with a common action verb (``*giggles*``);
otherwise the asterisks are dropped and the words are spoken.

:class:`TagStream` does the same on streamed pieces: it holds back an unfinished word,
an unclosed ``[`` or ``*`` span, so a tag split across tokens (``[hap`` + ``py]``) works.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# The expressions and gestures a reply may ask for; the avatar's parameters follow this order.
EXPRESSIONS: tuple[str, ...] = ("neutral", "happy", "sad", "angry", "surprised")
GESTURES: tuple[str, ...] = ("nod", "tilt", "wave")

TagKind = Literal["expression", "gesture", "unknown"]

ALIASES: dict[str, str] = {
    # expressions
    "smile": "happy", "smiles": "happy", "smiling": "happy", "joy": "happy", "excited": "happy",
    "laugh": "happy", "laughs": "happy", "laughing": "happy", "giggle": "happy", "giggles": "happy",
    "grin": "happy", "grins": "happy", "cheerful": "happy",
    "sadly": "sad", "cry": "sad", "cries": "sad", "crying": "sad", "sigh": "sad", "sighs": "sad", "pout": "sad",
    "pouts": "sad", "mad": "angry", "annoyed": "angry", "frown": "angry", "frowns": "angry", "angrily": "angry",
    "surprise": "surprised", "shocked": "surprised", "gasp": "surprised", "gasps": "surprised", "wow": "surprised",
    "calm": "neutral", "normal": "neutral",
    # gestures
    "waves": "wave", "waving": "wave", "wave hand": "wave", "waves hand": "wave", "waves hello": "wave",
    "nods": "nod", "nodding": "nod", "nod head": "nod", "nods head": "nod",
    "tilt head": "tilt", "tilts head": "tilt", "tilts": "tilt", "tilting head": "tilt", "head tilt": "tilt",
    "tilts her head": "tilt", "tilts his head": "tilt", "tilts their head": "tilt",
}  # fmt: skip

ACTION_VERBS = frozenset(
    [
        "laughs",
        "giggles",
        "sighs",
        "smiles",
        "grins",
        "waves",
        "nods",
        "winks",
        "blushes",
        "shrugs",
        "gasps",
        "chuckles",
        "tilts",
        "pouts",
        "claps",
        "bows",
        "hugs",
        "cries",
        "sniffles",
        "yawns",
        "hums",
        "beams",
        "frowns",
        "leans",
        "looks",
        "gestures",
        "jumps",
        "spins",
        "dances",
        "squeals",
        "groans",
        "whispers",
        "smirks",
        "stretches",
    ]
)

EMOJI_TAGS: dict[str, str] = {
    "😊": "happy", "😄": "happy", "😁": "happy", "😀": "happy", "😃": "happy", "🙂": "happy", "😆": "happy",
    "🥰": "happy", "😍": "happy", "😂": "happy", "🤣": "happy", "😢": "sad", "😭": "sad", "🙁": "sad",
    "☹": "sad", "😞": "sad", "😠": "angry", "😡": "angry", "😤": "angry", "😮": "surprised", "😲": "surprised",
    "😯": "surprised", "😱": "surprised", "👋": "wave",
}  # fmt: skip

_MAX_TAG = 40  # longest [tag] or *action* we wait for before treating the mark as stray
_MAX_LINK_TEXT = 2 * _MAX_TAG  # an unclosed "[" we wait for (link text may be longer than a tag)
_MAX_LINK = 300  # a [text](url) span we wait for

_EMOJI = "\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\u2300-\u23ff\ufe0f\u200d\u20e3\U000e0020-\U000e007f"
_PATTERN = (
    r"(?P<bullet>%s[ \t]*(?:#{1,6}|[-*+•]|\d{1,2}[.)])[ \t]+)"
    r"|(?P<link>\[(?P<ltext>[^\[\]\n]{0,%d})\]\((?P<lurl>[^()\s]*)\))"
    r"|(?P<tag>\[(?P<tname>[^\[\]\n]{0,%d})\])"
    r"|(?P<marks>\*\*|__|~~|`+)"
    r"|(?P<action>\*(?P<aname>[^*\n]{1,%d})\*)"
    r"|(?P<paren>\((?P<pname>[^()\n]{1,%d})\))"
    r"|(?P<url>(?:https?://|www\.)[^\s<>\[\]()\"']+)"
    r"|(?P<emoji>[%s]+)"
    r"|(?P<stray>[\[\]*])"
)
# a bullet or heading mark counts only at the start of a line (``\A``: the segment starts one)
_TOKEN_LINE_START = re.compile(
    _PATTERN % (r"(?:\A|(?<=\n))", _MAX_LINK_TEXT, _MAX_TAG, _MAX_TAG, _MAX_TAG, _EMOJI)
)
_TOKEN_MID_LINE = re.compile(_PATTERN % (r"(?<=\n)", _MAX_LINK_TEXT, _MAX_TAG, _MAX_TAG, _MAX_TAG, _EMOJI))
_TRAILING_URL_PUNCT = ".,;:!?"


@dataclass(frozen=True, slots=True)
class Tag:
    kind: TagKind
    name: str  # canonical expression/gesture name, or the tag's raw text when unknown


@dataclass(frozen=True, slots=True)
class ParsedText:
    text: str
    expressions: tuple[str, ...] = ()
    gestures: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


def lookup(name: str) -> Tag:
    """Classify a tag's text: ``'Happy'`` -> expression happy, ``'tilts head'`` -> gesture tilt."""
    key = " ".join(name.lower().replace("_", " ").replace("-", " ").split()).strip(" .!,:;")
    key = ALIASES.get(key, key)
    if key in EXPRESSIONS:
        return Tag("expression", key)
    if key in GESTURES:
        return Tag("gesture", key)
    return Tag("unknown", name.strip())


def _action(content: str) -> Tag | None:
    """A ``*...*`` span: a Tag when it is a stage direction, None when it is emphasis."""
    tag = lookup(content)
    if tag.kind != "unknown":
        return tag
    words = content.lower().split()
    if words and words[0].strip(".,!") in ACTION_VERBS:
        first = lookup(words[0])
        return first if first.kind != "unknown" else tag
    return None


Piece = str | Tag


def scan(text: str, at_line_start: bool = True) -> list[Piece]:
    """Split complete text into spoken text and tags (whitespace not yet normalised)."""
    out: list[Piece] = []
    pos = 0
    pattern = _TOKEN_LINE_START if at_line_start else _TOKEN_MID_LINE
    for m in pattern.finditer(text):
        out.append(text[pos : m.start()])
        pos = m.end()
        kind = m.lastgroup
        if kind == "link":
            out.append(m["ltext"])
        elif kind == "tag":
            if m["tname"].strip():
                out.append(lookup(m["tname"]))
        elif kind == "action":
            tag = _action(m["aname"])
            out.append(tag if tag is not None else m["aname"])
        elif kind == "paren":  # "(smiling)" is a stage direction; "(or so)" is spoken
            tag = _action(m["pname"])
            out.append(tag if tag is not None else m["paren"])
        elif kind == "url":
            url = m["url"]
            stripped = url.rstrip(_TRAILING_URL_PUNCT)
            out.append("a link" + url[len(stripped) :])
        elif kind == "emoji":
            for ch in m["emoji"]:
                if ch in EMOJI_TAGS:
                    out.append(lookup(EMOJI_TAGS[ch]))
            out.append(" ")
    out.append(text[pos:])
    return [p for p in out if p != ""]


_URL_STARTS = ("https://", "http://", "www.")
_EMOJI_END = re.compile(f"[{_EMOJI}]$")
_LIST_MARK = re.compile(r"#{1,6}|[-*+•]|\d{1,2}[.)]?")


def _may_grow(word: str) -> bool:
    """True when a trailing word may still turn into something we rewrite (a URL, an emoji sequence)."""
    low = word.lower()
    if any(s.startswith(low) or low.startswith(s) for s in _URL_STARTS) or "://" in low:
        return True
    return _EMOJI_END.search(word) is not None


def _hold_from(buf: str, at_line_start: bool) -> int:
    """Index from which ``buf`` must wait for more text (len(buf) when all of it is complete)."""
    hold = len(buf)
    # a trailing word that may still grow into a URL or an emoji sequence, or a list/heading mark
    if buf and not buf[-1].isspace():
        start = max(buf.rfind(" "), buf.rfind("\n"), buf.rfind("\t")) + 1
        before = buf[:start].rstrip(" \t")
        line_start = before.endswith("\n") or (not before and at_line_start)
        if _may_grow(buf[start:]) or (line_start and _LIST_MARK.fullmatch(buf[start:])):
            hold = start
    # an unclosed [tag or [text](url, or a closed [text] that a "(" may still follow
    open_ = buf.rfind("[")
    if open_ >= 0:
        tail = buf[open_:]
        close = tail.find("]")
        if close < 0:
            if len(tail) <= _MAX_LINK_TEXT + 1 and "\n" not in tail:
                hold = min(hold, open_)
        elif (close == len(tail) - 1 or (tail[close + 1 : close + 2] == "(" and ")" not in tail)) and len(
            tail
        ) <= _MAX_LINK:
            hold = min(hold, open_)
    # an unpaired single asterisk: an *action* in progress (or the first half of "**")
    singles = [m.start() for m in re.finditer(r"(?<!\*)\*(?!\*)", buf)]
    if len(singles) % 2 == 1:
        start = singles[-1]
        tail = buf[start:]
        if len(tail) <= _MAX_TAG + 1 and "\n" not in tail:
            hold = min(hold, start)
    # an unclosed "(": maybe a stage direction such as "(smiling)" in progress
    open_paren = buf.rfind("(")
    if open_paren >= 0 and ")" not in buf[open_paren:]:
        tail = buf[open_paren:]
        if len(tail) <= _MAX_TAG + 1 and "\n" not in tail:
            hold = min(hold, open_paren)
    return hold


class Normalizer:
    """Collapses whitespace across pieces: single spaces, single newlines, no space before , . ! ? ; :"""

    def __init__(self) -> None:
        self._pending = ""
        self._started = False

    def feed(self, text: str) -> str:
        out: list[str] = []
        for c in text:
            if c.isspace():
                self._pending = "\n" if (c == "\n" or self._pending == "\n") else " "
                continue
            if self._pending and self._started and not (self._pending == " " and c in ",.!?;:…"):
                out.append(self._pending)
            self._pending = ""
            self._started = True
            out.append(c)
        return "".join(out)


class TagStream:
    """Streaming tag parser: feed LLM pieces, get spoken text and tags in order."""

    def __init__(self) -> None:
        self._buf = ""
        self._norm = Normalizer()
        self._line_start = True

    def feed(self, piece: str) -> list[Piece]:
        self._buf += piece
        hold = _hold_from(self._buf, self._line_start)
        ready, self._buf = self._buf[:hold], self._buf[hold:]
        return self._emit(ready)

    def flush(self) -> list[Piece]:
        ready, self._buf = self._buf, ""
        return self._emit(ready)

    def _emit(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        if not text:
            return out
        pieces = scan(text, self._line_start)
        self._line_start = text.rstrip(" \t").endswith("\n")
        for p in pieces:
            if isinstance(p, Tag):
                out.append(p)
            else:
                clean = self._norm.feed(p)
                if clean:
                    out.append(clean)
        return out


def collect(pieces: list[Piece]) -> ParsedText:
    text = "".join(p for p in pieces if isinstance(p, str))
    tags = [p for p in pieces if isinstance(p, Tag)]
    return ParsedText(
        text=text,
        expressions=tuple(dict.fromkeys(t.name for t in tags if t.kind == "expression")),
        gestures=tuple(dict.fromkeys(t.name for t in tags if t.kind == "gesture")),
        unknown=tuple(dict.fromkeys(t.name for t in tags if t.kind == "unknown")),
    )


def parse_tags(text: str) -> ParsedText:
    """Parse a complete text: clean spoken text plus the expressions, gestures and unknown tags in it."""
    stream = TagStream()
    return collect(stream.feed(text) + stream.flush())
