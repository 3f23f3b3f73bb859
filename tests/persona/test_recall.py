"""Recall of planted facts among many similar ones, through the full retrieval."""

from __future__ import annotations

import pytest

from engine.progress import silent_progress
from persona.bank import MemoryBank
from persona.bench import _fill_recall_set

pytestmark = pytest.mark.integration


def test_recall_at_5_on_planted_facts(bank: MemoryBank) -> None:
    queries = _fill_recall_set(bank, 1200, 100, seed=3, progress=silent_progress)
    first = sum(
        any(s.memory.id == q["id"] for s in bank.search(q["first"], 5, q["speaker"])) for q in queries
    )
    third = sum(any(s.memory.id == q["id"] for s in bank.search(q["third"], 5)) for q in queries)
    assert first / len(queries) >= 0.9, first
    assert third / len(queries) >= 0.85, third
