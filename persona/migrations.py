"""Versioned schema migrations for the memory store.

The schema version lives in ``PRAGMA user_version``. Each migration runs in its own
transaction together with the version bump, so a crash leaves the database at the old
or the new version, never in between. A database newer than this code is refused.
"""

from __future__ import annotations

import sqlite3


class MigrationError(Exception):
    """The database cannot be brought to this code's schema version."""


# v1: the first schema: memories, viewer profiles, episodic summaries.
_V1 = """
        CREATE TABLE memories (
            id INTEGER PRIMARY KEY,
            persona TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('viewer_fact', 'self_fact', 'stream_event')),
            subject TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL,
            importance REAL NOT NULL DEFAULT 0.5 CHECK (importance BETWEEN 0 AND 1),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            embedding BLOB NOT NULL
        );
        CREATE INDEX memories_subject ON memories (persona, subject);
        CREATE TABLE viewer_profiles (
            persona TEXT NOT NULL,
            username TEXT NOT NULL,
            display_name TEXT,
            first_seen REAL NOT NULL,
            last_seen REAL NOT NULL,
            turns INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (persona, username)
        );
        CREATE TABLE episodes (
            id INTEGER PRIMARY KEY,
            persona TEXT NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL NOT NULL,
            turns INTEGER NOT NULL,
            summary TEXT NOT NULL
        );
        CREATE INDEX episodes_persona ON episodes (persona, ended_at);
"""

# v2: contradiction history (superseded_by), fact slots, mention counts, episode speakers,
# and a generation counter that the vector index checks against.
_V2 = """
        ALTER TABLE memories ADD COLUMN slot TEXT;
        ALTER TABLE memories ADD COLUMN mentions INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE memories ADD COLUMN superseded_by INTEGER REFERENCES memories (id) ON DELETE SET NULL;
        ALTER TABLE memories ADD COLUMN source TEXT NOT NULL DEFAULT '';
        CREATE INDEX memories_active ON memories (persona, subject, slot) WHERE superseded_by IS NULL;
        CREATE INDEX memories_superseded ON memories (superseded_by);
        ALTER TABLE episodes ADD COLUMN speakers TEXT NOT NULL DEFAULT '';
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta (key, value) VALUES ('generation', '0');
"""

MIGRATIONS: list[str] = [_V1, _V2]
LATEST = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, target: int = LATEST) -> list[int]:
    """Bring ``conn`` up to ``target``; return the versions applied. The connection must be in
    autocommit mode (``isolation_level=None``)."""
    current = schema_version(conn)
    if current > LATEST:
        raise MigrationError(f"database schema v{current} is newer than this idolcast (v{LATEST})")
    applied = []
    for version in range(current + 1, target + 1):
        script = f"BEGIN IMMEDIATE;\n{MIGRATIONS[version - 1]}\nPRAGMA user_version = {version};\nCOMMIT;"
        try:
            conn.executescript(script)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        applied.append(version)
    return applied
