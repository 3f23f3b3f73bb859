"""Cut a streamed LLM reply into chunks for TTS.

The first chunk ends at the first clause boundary (``, ; : — …`` or a sentence end) once it
has ``first_chunk_min_words`` words, so the first audio starts early; the second also ends at a
clause boundary (from its second word) or after ``second_chunk_max_words`` words, because it has to be
ready before the first has played; later chunks end at sentence boundaries (``. ! ?``, an ellipsis
before a capital, a newline) or after ``max_chunk_words`` words (at the last clause boundary inside
them if there is one).

A terminator counts only when whitespace follows it (optionally after closing quotes or
brackets), so ``3.5``, ``1,000`` and ``10:30`` never split; known abbreviations (``Mr.``,
``e.g.``) and initials (``J.``) do not end a sentence; an ellipsis ends one only before a
capital letter.

Tags are parsed out first (:mod:`engine.text.tags`). A tag belongs to the chunk holding
the text right after it (``[happy] Hi!`` tags "Hi!"); tags at the very end of the reply
belong to the last chunk, which may then have empty text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.events import ReplyChunk
from engine.text.tags import Tag, TagStream
from engine.tts.config import TTSConfig

SENTENCE_END = ".!?…"
CLAUSE_END = ",;:"
DASHES = "—–"
CLOSERS = "\"'”’)]»"
ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "mx",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "a.m",
        "p.m",
        "approx",
        "ca",
        "fig",
        "mt",
        "ft",
        "lt",
        "col",
        "gen",
        "sgt",
        "capt",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "no",
        "u.s",
        "u.k",
    ]
)
_WORD = re.compile(r"\S*[^\W_]\S*")


def count_words(text: str) -> int:
    """Words with at least one letter or digit (a lone dash is not a word)."""
    return len(_WORD.findall(text))


def _speakable(text: str) -> bool:
    return any(c.isalnum() for c in text)


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A span of reply text ready for TTS, with the tags that occurred in it."""

    index: int
    text: str
    expressions: tuple[str, ...] = ()
    gestures: tuple[str, ...] = ()
    unknown_tags: tuple[str, ...] = ()

    def to_event(self, *, t: float, turn_id: int) -> ReplyChunk:
        return ReplyChunk(
            t=t,
            turn_id=turn_id,
            index=self.index,
            text=self.text,
            expressions=self.expressions,
            gestures=self.gestures,
        )


@dataclass(slots=True)
class _Pending:
    text: str = ""
    tags: list[tuple[int, Tag]] = field(default_factory=list)  # (position in text, tag)


def _dedupe(names: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


_DEFAULTS = TTSConfig()


class ReplyChunker:
    """Feed streamed reply pieces; get :class:`TextChunk` s as soon as their boundary is certain."""

    def __init__(
        self,
        first_chunk_min_words: int = _DEFAULTS.first_chunk_min_words,
        max_chunk_words: int = _DEFAULTS.max_chunk_words,
        first_chunk_max_words: int = _DEFAULTS.first_chunk_max_words,
        second_chunk_max_words: int = _DEFAULTS.second_chunk_max_words,
    ) -> None:
        """The defaults are the ``[tts]`` settings' (one source: engine/tts/config.py)."""
        self.first_chunk_min_words = first_chunk_min_words
        self.max_chunk_words = max_chunk_words
        self.first_chunk_max_words = min(first_chunk_max_words, max_chunk_words)
        self.second_chunk_max_words = min(second_chunk_max_words, max_chunk_words)
        self.reset()

    @classmethod
    def from_config(cls, config: TTSConfig) -> ReplyChunker:
        return cls(
            config.first_chunk_min_words,
            config.max_chunk_words,
            config.first_chunk_max_words,
            config.second_chunk_max_words,
        )

    def reset(self) -> None:
        """Forget everything (a new reply, or an interruption)."""
        self._tags = TagStream()
        self._cur = _Pending()
        self._index = 0

    def feed(self, piece: str) -> list[TextChunk]:
        for item in self._tags.feed(piece):
            self._add(item)
        return self._cut_ready()

    def flush(self) -> list[TextChunk]:
        """End of the reply: the chunks still held back (the remainder, and trailing tags)."""
        for item in self._tags.flush():
            self._add(item)
        out = self._cut_ready()
        text = " ".join(self._cur.text.split())
        if _speakable(text) or self._cur.tags:
            out.append(self._make(text if _speakable(text) else "", [t for _, t in self._cur.tags]))
        self._cur = _Pending()
        return out

    # ---- internals ---------------------------------------------------------------------

    def _add(self, item: str | Tag) -> None:
        if isinstance(item, Tag):
            self._cur.tags.append((len(self._cur.text), item))
        else:
            self._cur.text += item

    def _make(self, text: str, tags: list[Tag]) -> TextChunk:
        chunk = TextChunk(
            index=self._index,
            text=text,
            expressions=_dedupe([t.name for t in tags if t.kind == "expression"]),
            gestures=_dedupe([t.name for t in tags if t.kind == "gesture"]),
            unknown_tags=_dedupe([t.name for t in tags if t.kind == "unknown"]),
        )
        self._index += 1
        return chunk

    def _cut_ready(self) -> list[TextChunk]:
        out: list[TextChunk] = []
        while True:
            k = self._find_cut(self._cur.text, self._index)
            if k is None:
                return out
            text, rest = self._cur.text[:k], self._cur.text[k:]
            skipped = len(rest) - len(rest.lstrip())
            mine = [t for pos, t in self._cur.tags if pos < k]
            later = [(max(pos - k - skipped, 0), t) for pos, t in self._cur.tags if pos >= k]
            out.append(self._make(" ".join(text.split()), mine))
            self._cur = _Pending(rest.lstrip(), later)

    def _find_cut(self, buf: str, index: int) -> int | None:
        """Where chunk ``index`` ends (an index into ``buf``), or None while undecided."""
        early = index <= 1  # the first two chunks also end at clause boundaries
        need = self.first_chunk_min_words if index == 0 else 1
        min_clause = 2 if index == 1 else 1  # the second chunk: no one-word clause ("Well,")
        clause_need = max(need, min_clause)

        def ok(k: int, clause: bool = False) -> bool:
            return _speakable(buf[:k]) and count_words(buf[:k]) >= (clause_need if clause else need)

        i, n = 0, len(buf)
        while i < n:
            c = buf[i]
            if c == "\n":
                if ok(i):
                    return i
            elif c in SENTENCE_END:
                j = i
                while j < n and buf[j] in SENTENCE_END:
                    j += 1
                run = buf[i:j]
                while j < n and buf[j] in CLOSERS:
                    j += 1
                if j == n:
                    return None  # the next piece decides (or flush takes it whole, with trailing tags)
                if buf[j].isspace():
                    kind = self._terminator_kind(buf, i, j, run)
                    if kind is None:
                        return None
                    if (kind == "sentence" or early) and kind != "none" and ok(j, kind != "sentence"):
                        return j
                i = j
                continue
            elif early and (c in CLAUSE_END or c in DASHES or (c == "-" and buf[i - 1 : i] == " ")):
                if i + 1 == n:
                    return None
                if (c in DASHES or buf[i + 1].isspace()) and ok(i + 1, clause=True):
                    return i + 1
            i += 1
        limits = (self.first_chunk_max_words, self.second_chunk_max_words)
        limit = limits[index] if index < len(limits) else self.max_chunk_words
        return self._cut_long(buf, limit, min_clause)

    @staticmethod
    def _terminator_kind(buf: str, i: int, j: int, run: str) -> str | None:
        """'sentence', 'clause' (an ellipsis before lower case), 'none', or None to wait for more text."""
        if "..." in run or "…" in run:
            if "!" in run or "?" in run:
                return "sentence"
            rest = buf[j:].lstrip()
            if not rest:
                return None
            return "sentence" if rest[0].isupper() or rest[0] in "\"“'" else "clause"
        if run == ".":
            word = buf[:i].rsplit(None, 1)[-1] if buf[:i].strip() else ""
            word = word.lstrip("\"'“‘([").lower()
            if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                return "none"
        return "sentence"

    @staticmethod
    def _cut_long(buf: str, max_words: int, min_words: int = 1) -> int | None:
        """A cut after ``max_words`` complete words (at the last clause boundary within them, if one comes
        after at least ``min_words``)."""
        words = list(_WORD.finditer(buf))
        complete = [m for m in words if m.end() < len(buf) and buf[m.end()].isspace()]
        if len(complete) <= max_words:
            return None
        limit = complete[max_words - 1].end()
        for m in reversed(complete[max(0, min_words - 1) : max_words - 1]):
            end = m.end()
            if buf[end - 1] in CLAUSE_END + DASHES:
                return end
        return limit
