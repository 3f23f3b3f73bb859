"""The memory bank on a shared PostgreSQL: the store's contract, and two engine replicas (two
processes) sharing one idol's memory, each with its own vector index kept in step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persona.bank import MemoryBank
from persona.embed import HashEmbedder
from tests.persona.pg import fresh_schema

pytestmark = [pytest.mark.integration, pytest.mark.postgres]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    with fresh_schema() as dsn:
        yield dsn


def test_store_contract_on_postgres(pg_dsn: str) -> None:
    from persona.pgstore import PostgresMemoryStore

    store = PostgresMemoryStore(pg_dsn)
    vec = np.ones(8, dtype=np.float32) / np.sqrt(8)
    with store.transaction() as conn:
        a = store.insert_memory(
            conn, persona="aiko", kind="viewer_fact", subject="mika", text="Mika has a cat", embedding=vec
        )
        b = store.insert_memory(
            conn, persona="aiko", kind="self_fact", subject="aiko", text="MIKA's friend Aiko", embedding=vec
        )
        store.touch_profile(conn, "aiko", "mika", "Mika", 1.0)
        store.touch_profile(conn, "aiko", "mika", None, 2.0)
        store.add_episode(conn, "aiko", 0.0, 1.0, 2, "talked with mika about cats", "mika")
        conn.execute(  # the import path's SQLite-only statement, translated
            "INSERT OR REPLACE INTO viewer_profiles (persona, username, display_name, first_seen, last_seen, "
            "turns) VALUES (?, ?, ?, ?, ?, ?)",
            ("aiko", "ren", "Ren", 1.0, 1.0, 3),
        )
    assert b > a > 0 and store.count("aiko") == 2 and store.generation() == 1
    assert np.allclose(store.get_with_embeddings([a])[0][1], vec)
    p = store.profile("aiko", "@Mika")
    assert p is not None and p.turns == 2 and p.display_name == "Mika" and p.last_seen == 2.0
    assert store.known_subjects("aiko", ["mika", "nobody"]) == {"mika"}
    report = store.forget_viewer("mika")
    # case-insensitive like SQLite's LIKE: "MIKA's" in a self fact is found too
    assert report["memories"] == 2 and report["episodes"] == 1 and report["profiles"] == 1
    assert store.count() == 0 and store.profile("aiko", "ren") is not None
    got = store.changes_since("aiko", 0)
    assert got is not None and sorted(got[1]) == [(a, False), (b, False)]
    store.close()


def test_a_bank_follows_writes_of_another_bank(pg_dsn: str) -> None:
    emb = HashEmbedder()
    one, two = MemoryBank.open_postgres(pg_dsn, emb, "aiko"), MemoryBank.open_postgres(pg_dsn, emb, "aiko")
    m = one.add("Mika's cat is called Miso", subject="mika")
    assert m.id not in two.index
    assert two.sync() == 1 and m.id in two.index
    one.forget(m.id)
    assert two.sync() == 1 and m.id not in two.index and len(two.index) == 0
    # a bank that fell behind a pruned change log rebuilds its index from the rows
    kept = one.add("Ren plays the cello", subject="ren")
    with one.store.transaction() as conn:
        conn.execute("DELETE FROM memory_changes")  # as the day-old prune does, with everything
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'changes_pruned_to'", (str(one.store.change_seq() + 5),)
        )
    assert two.sync() == -1 and kept.id in two.index and len(two.index) == 1
    assert two.sync() == 0
    one.close()
    two.close()


class Replica:
    """An engine's memory in its own process (tests/persona/pg_replica.py)."""

    def __init__(self, dsn: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.persona.pg_replica", dsn],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"replica exited with {self.proc.wait(timeout=30)}"
        return dict(json.loads(line))

    def __call__(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


@pytest.mark.timeout(300)
def test_two_engines_share_one_memory(pg_dsn: str) -> None:
    a, b = Replica(pg_dsn), Replica(pg_dsn)  # both open (and build their index) before anything is told
    try:
        assert a.hello["indexed"] == 0 and b.hello["indexed"] == 0
        told = a(op="tell", who="Mika", text="I live in Sapporo, and my favourite anime is Mushishi")
        assert told["ids"], "engine A wrote nothing back"
        assert b(op="indexed", ids=told["ids"])["indexed"] == told["ids"]  # B's own index follows

        got = b(op="recall", who="Mika", text="do you remember my favourite anime?")
        assert "Mushishi" in got["prompt"].split("<chat")[0], got["prompt"]
        assert any("Mushishi" in h for h in got["hits"])

        report = a(op="forget", who="Mika")
        assert report["memories"] >= 1 and set(told["ids"]) <= set(report["memory_ids"])
        assert b(op="indexed", ids=told["ids"])["indexed"] == []
        gone = b(op="recall", who="Mika", text="do you remember my favourite anime?")
        assert (
            "Mushishi" not in gone["prompt"]
            and "Sapporo" not in gone["prompt"]
            and not any("Mushishi" in h for h in gone["hits"])
        )
        assert a(op="recall", who="Mika", text="what is my favourite anime?")["hits"] == []
    finally:
        a.close()
        b.close()
