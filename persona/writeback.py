"""Write-back after a turn (off the hot path): facts merged into the bank, consolidation.

* **duplicate**: the same slot with the same value, or (slot-less) an active memory about the
  same subject with cosine ≥ ``dup_threshold``: the old memory is refreshed (``mentions``+1,
  ``updated_at``, importance nudged up) instead of storing a copy.
* **contradiction**: the same slot with a different value: the new fact is stored and the old
  one gets ``superseded_by`` = new id (kept as history, out of the index and the prompt).
* **consolidation**: the oldest exchanges of the rolling history become an episodic summary
  (stored in ``episodes`` and as a searchable ``stream_event`` memory), so the context stays
  bounded over an 8-hour stream. The default summarizer is extractive (who talked about what);
  an LLM summarizer can be plugged in behind :class:`Summarizer`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from persona.bank import MemoryBank
from persona.facts import Fact
from persona.retrieval import embed_text
from persona.sanitize import is_injection
from persona.store import Conn, normalize_username


@dataclass(frozen=True, slots=True)
class Exchange:
    """One heard exchange of the rolling history."""

    speaker: str  # normalized username, or 'host'
    user: str  # the user message as it appears in the prompt (wrapped if chat)
    reply: str  # what was actually heard
    raw: str  # the speaker's plain text (for summaries)
    t: float
    tokens: int
    earlier: str = ""  # the summary of older exchanges this turn's prompt carried first (part of ``user``)


@dataclass(frozen=True, slots=True)
class WriteResult:
    action: str  # 'added' | 'merged' | 'superseded'
    memory_id: int
    previous_id: int | None = None


def apply_facts(
    bank: MemoryBank,
    facts: Sequence[Fact],
    now: float,
    dup_threshold: float = 0.9,
    also: Callable[[Conn], None] | None = None,
) -> list[WriteResult]:
    """Merge ``facts`` into the bank in one transaction (``also`` runs inside it: profile updates)."""
    if not facts and also is None:
        return []
    texts = [embed_text(f.kind, normalize_username(f.subject), f.text) for f in facts]
    vecs = bank.embedder.embed(texts) if texts else np.empty((0, bank.embedder.dim), np.float32)
    results: list[WriteResult] = []
    store, persona = bank.store, bank.persona
    with bank.write() as conn:
        if also is not None:
            also(conn)
        for fact, vec in zip(facts, vecs, strict=True):
            subject = normalize_username(fact.subject)
            old = store.active_slot(persona, subject, fact.slot) if fact.slot else None
            if old is None and fact.slot is None:
                near = [(m, float(e @ vec)) for m, e in store.subject_memories(persona, subject, 200)]
                best = max(near, key=lambda p: p[1], default=None)
                if best is not None and best[1] >= dup_threshold:
                    old = best[0]
            if old is not None and (old.text.lower() == fact.text.lower() or fact.slot is None):
                conn.execute(
                    "UPDATE memories SET mentions = mentions + 1, updated_at = ?, "
                    "importance = MIN(1.0, MAX(importance, ?) + 0.05) WHERE id = ?",
                    (now, fact.importance, old.id),
                )
                results.append(WriteResult("merged", old.id))
                continue
            mid = store.insert_memory(
                conn,
                persona=persona,
                kind=fact.kind,
                subject=subject,
                text=fact.text,
                embedding=vec,
                importance=fact.importance,
                slot=fact.slot,
                source="writeback",
                now=now,
            )
            if old is not None:
                conn.execute("UPDATE memories SET superseded_by = ? WHERE id = ?", (mid, old.id))
                bank.index.remove([old.id])
                results.append(WriteResult("superseded", mid, old.id))
            else:
                results.append(WriteResult("added", mid))
            bank.index.add([mid], vec[None, :])
    return results


class Summarizer(Protocol):
    def summarize(self, exchanges: Sequence[Exchange]) -> str: ...


_STOPWORDS = frozenset(
    [
        "about",
        "after",
        "again",
        "also",
        "always",
        "am",
        "an",
        "and",
        "any",
        "are",
        "aren't",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "but",
        "by",
        "can",
        "could",
        "did",
        "does",
        "doing",
        "don't",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "him",
        "his",
        "how",
        "i",
        "i'm",
        "if",
        "in",
        "into",
        "is",
        "it",
        "it's",
        "its",
        "just",
        "like",
        "me",
        "more",
        "most",
        "my",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "out",
        "over",
        "own",
        "really",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "that's",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yeah",
        "yes",
        "okay",
        "hi",
        "hello",
        "hey",
        "lol",
        "haha",
        "aiko",
        "chat",
        "today",
    ]
)


_ROLE_WORDS = frozenset(
    [
        "system",
        "assistant",
        "user",
        "developer",
        "admin",
        "instruction",
        "instructions",
        "prompt",
        "rules",
        "ignore",
        "disregard",
        "pretend",
        "persona",
        "jailbreak",
        "mode",
        "override",
    ]
)


class ExtractiveSummarizer:
    """Who talked about what, from the most frequent content words of each speaker (no model)."""

    def __init__(self, max_speakers: int = 6, words_per_speaker: int = 3) -> None:
        self.max_speakers = max_speakers
        self.words_per_speaker = words_per_speaker

    def summarize(self, exchanges: Sequence[Exchange]) -> str:
        by_speaker: dict[str, Counter[str]] = {}
        for ex in exchanges:
            if is_injection(ex.raw):  # untrusted chat: an injection attempt contributes no words
                by_speaker.setdefault(ex.speaker, Counter())
                continue
            words = [
                w
                for w in re.findall(r"[a-z][a-z'-]{3,}", ex.raw.lower())
                if w not in _STOPWORDS and w not in _ROLE_WORDS
            ]
            by_speaker.setdefault(ex.speaker, Counter()).update(words)
        parts = []
        ranked = sorted(by_speaker.items(), key=lambda kv: -sum(kv[1].values()))[: self.max_speakers]
        for speaker, counts in ranked:
            topics = [w for w, _ in counts.most_common(self.words_per_speaker)]
            who = "the host" if speaker == "host" else speaker
            parts.append(f"{who} ({', '.join(topics)})" if topics else who)
        others = len(by_speaker) - len(ranked)
        tail = f" and {others} more" if others > 0 else ""
        return f"Earlier ({len(exchanges)} exchanges): talked with {'; '.join(parts)}{tail}."


def store_episode(bank: MemoryBank, exchanges: Sequence[Exchange], summary: str) -> int:
    """Persist one consolidated episode and its searchable stream_event memory."""
    speakers = ",".join(sorted({e.speaker for e in exchanges}))
    vec: np.ndarray = bank.embedder.embed([summary])[0]
    with bank.write() as conn:
        eid = bank.store.add_episode(
            conn, bank.persona, exchanges[0].t, exchanges[-1].t, len(exchanges), summary, speakers
        )
        mid = bank.store.insert_memory(
            conn,
            persona=bank.persona,
            kind="stream_event",
            subject="stream",
            text=summary,
            embedding=vec,
            importance=0.4,
            source="consolidation",
            now=exchanges[-1].t,
        )
        bank.index.add([mid], vec[None, :])
    return eid
