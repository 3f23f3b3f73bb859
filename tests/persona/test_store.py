from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from persona.migrations import LATEST, MigrationError, migrate, schema_version
from persona.store import MemoryStore

pytestmark = pytest.mark.unit


def test_old_version_database_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, target=1) == [1]
    conn.execute(
        "INSERT INTO memories (persona, kind, subject, text, importance, created_at, updated_at, embedding) "
        "VALUES ('aiko', 'viewer_fact', 'kenji', 'kenji likes ramen', 0.5, 1, 1, ?)",
        (np.ones(384, dtype="<f4").tobytes(),),
    )
    conn.close()

    store = MemoryStore(path)
    assert schema_version(store._w) == LATEST == 2
    [m] = store.list_memories("aiko")
    assert m.text == "kenji likes ramen" and m.superseded_by is None and m.mentions == 1
    assert store.generation() == 0
    cols = {r[1] for r in store._w.execute("PRAGMA table_info(memories)")}
    assert {"superseded_by", "slot", "mentions"} <= cols
    assert store.integrity_check() == "ok"
    store.close()


def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.close()
    with pytest.raises(MigrationError, match="newer"):
        MemoryStore(path)


def test_pragmas_and_transaction_rollback(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.sqlite3")
    assert store._w.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._w.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store._w.execute("PRAGMA secure_delete").fetchone()[0] == 1
    g = store.generation()
    with pytest.raises(RuntimeError), store.transaction() as conn:
        store.insert_memory(
            conn,
            persona="aiko",
            kind="self_fact",
            subject="aiko",
            text="x",
            embedding=np.zeros(384, np.float32),
        )
        raise RuntimeError("boom")
    assert store.count() == 0 and store.generation() == g
    with pytest.raises(ValueError, match="kind"):
        store.add_memory(persona="aiko", kind="gossip", subject="", text="x", embedding=np.zeros(384))
    store.close()
