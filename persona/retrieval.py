"""Retrieval: semantic similarity blended with recency and importance.

``score = w_sim · cos(query, memory) + w_recency · 0.5^(age / half_life) + w_importance · importance
+ w_focus · [the memory is about a subject the query is about]``

The *focus* of a query: the speaker when they speak in the first person ("my", "I", "me"),
herself when asked in the second person possessive ("your …"), and any known viewer named in
it (username or display name). Viewer facts are embedded with their subject's name replaced
by "this viewer" (:func:`embed_text`): which viewer a fact is about is decided by the focus,
not by how a username happens to embed, and the facts of one viewer then compete on meaning.

Candidates come from two places: the ANN index (the ``candidates`` nearest of all active
memories) and the memories of each focus subject (exact, from SQLite, most recent first), so a
viewer's facts are found even among thousands of similar facts about other viewers. Every
candidate is re-scored with its exact float32 embedding. Memories below ``min_similarity``
(``min_similarity_focus`` for the focus subjects' own) are never returned (an irrelevant note costs prompt tokens and can mislead the model).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from persona.index import VectorIndex
from persona.store import Memory, MemoryStore


@dataclass(frozen=True, slots=True)
class RetrievalWeights:
    similarity: float = 1.0
    recency: float = 0.1
    importance: float = 0.1
    focus: float = 0.25
    half_life_s: float = 7 * 24 * 3600.0
    min_similarity: float = 0.25
    min_similarity_focus: float = 0.05  # a memory about the subject in focus is relevant by subject
    candidates: int = 32
    subject_candidates: int = 200


_FIRST_PERSON = re.compile(r"\b(?:i|i'm|im|i've|i'd|me|my|mine|myself)\b", re.I)
_SECOND_POSSESSIVE = re.compile(r"\b(?:your|yours|yourself)\b", re.I)
_TOKEN = re.compile(r"[\w.-]{2,40}")


def embed_text(kind: str, subject: str, text: str) -> str:
    """What is embedded for a memory: a viewer fact with its subject's name made generic."""
    if kind == "viewer_fact" and subject and subject not in ("host",):
        return re.sub(rf"(?<![\w.-]){re.escape(subject)}(?![\w-])", "this viewer", text, flags=re.I)
    return text


def query_tokens(query: str) -> list[str]:
    """Lower-case words of a query that could name a subject ("kenji_77's" → "kenji_77")."""
    out = []
    for t in _TOKEN.findall(query.lower()):
        t = t.rstrip(".-")
        out.append(t[:-2] if t.endswith("'s") else t)
    return sorted(set(out))[:64]


def focus_subjects(query: str, speaker: str | None, self_subject: str, named: Iterable[str]) -> set[str]:
    focus = set(named)
    if speaker and _FIRST_PERSON.search(query):
        focus.add(speaker)
    if _SECOND_POSSESSIVE.search(query):
        focus.add(self_subject)
    return focus


@dataclass(frozen=True, slots=True)
class Scored:
    memory: Memory
    score: float
    similarity: float
    recency: float = field(default=0.0)


def retrieve(
    store: MemoryStore,
    index: VectorIndex,
    query: np.ndarray,
    persona: str,
    *,
    k: int = 5,
    focus: Iterable[str] = (),
    now: float,
    weights: RetrievalWeights | None = None,
) -> list[Scored]:
    w = weights or RetrievalWeights()
    ids, _ = index.search(query, w.candidates)
    rows = store.get_with_embeddings([int(i) for i in ids])
    focus = set(focus)
    seen = {m.id for m, _ in rows}
    for subject in sorted(focus):
        for m, e in store.subject_memories(persona, subject, w.subject_candidates):
            if m.id not in seen:
                seen.add(m.id)
                rows.append((m, e))
    rows = [(m, e) for m, e in rows if m.superseded_by is None and m.persona == persona]
    if not rows:
        return []
    sims = np.stack([e for _, e in rows]) @ np.asarray(query, dtype=np.float32)
    decay = math.log(2) / w.half_life_s
    out = []
    for (m, _), sim in zip(rows, sims.tolist(), strict=True):
        in_focus = m.subject in focus
        if sim < (w.min_similarity_focus if in_focus else w.min_similarity):
            continue
        rec = math.exp(-decay * max(0.0, now - m.updated_at))
        score = w.similarity * sim + w.recency * rec + w.importance * m.importance
        if in_focus:
            score += w.focus
        out.append(Scored(m, score, sim, rec))
    out.sort(key=lambda s: s.score, reverse=True)
    return out[:k]
