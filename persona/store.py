"""The durable memory store: SQLite in WAL mode.

Durability: every write-back is one transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) with
``synchronous=FULL``: in WAL mode NORMAL already survives a process crash (SIGKILL), but
may lose the last commits on power loss; FULL fsyncs the WAL at each commit, and write-back
runs off the hot path a few times a minute, so the few milliseconds of fsync cost nothing
anyone hears. ``secure_delete=ON`` overwrites deleted content with zeros; forgetting a viewer
also checkpoints and truncates the WAL and VACUUMs, so the bytes are gone from disk.

Connections: one writer, one reader (WAL readers never block the writer), each behind a
lock, usable from worker threads. Embeddings are stored as float32 blobs.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from persona.migrations import migrate

MemoryKind = Literal["viewer_fact", "self_fact", "stream_event"]
KINDS: tuple[str, ...] = ("viewer_fact", "self_fact", "stream_event")
_COLS = "id, persona, kind, subject, text, importance, created_at, updated_at, slot, mentions, superseded_by, source"


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """What a write transaction hands out: a DB-API connection with ``?`` placeholders (SQLite's
    own, or :class:`persona.pgstore.PgConn`, which translates the few dialect differences)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...


@dataclass(frozen=True, slots=True)
class Memory:
    id: int
    persona: str
    kind: str
    subject: str
    text: str
    importance: float
    created_at: float
    updated_at: float
    slot: str | None
    mentions: int
    superseded_by: int | None
    source: str

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True)
class ViewerProfile:
    persona: str
    username: str
    display_name: str | None
    first_seen: float
    last_seen: float
    turns: int

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True)
class Episode:
    id: int
    persona: str
    started_at: float
    ended_at: float
    turns: int
    summary: str
    speakers: str

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


def normalize_username(name: str) -> str:
    return name.strip().lstrip("@").lower()


def to_blob(vec: np.ndarray) -> bytes:
    return np.ascontiguousarray(vec, dtype="<f4").tobytes()


def from_blob(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


def _like_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class MemoryStore:
    """Memories, viewer profiles and episodic summaries of every persona, in one SQLite file.

    The SQL here is the common subset of SQLite and PostgreSQL (``RETURNING``, ``ON CONFLICT``);
    :class:`persona.pgstore.PostgresMemoryStore` reuses it over a shared PostgreSQL."""

    #: case-insensitive LIKE of the dialect (SQLite's LIKE already is, for ASCII)
    ILIKE = "LIKE"

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self._wlock = threading.RLock()
        self._rlock = threading.Lock()
        self._w = self._connect(synchronous)
        migrate(self._w)
        self._r = self._connect(synchronous) if str(path) != ":memory:" else self._w

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA secure_delete=ON")
        return conn

    def close(self) -> None:
        with self._wlock, self._rlock:
            if self._r is not self._w:
                self._r.close()
            self._w.close()

    # ---- transactions ---------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        """One durable write: committed (and the generation bumped) on exit, rolled back on error."""
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                yield self._w
                self._w.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")
                self._w.execute("COMMIT")
            except BaseException:
                self._w.execute("ROLLBACK")
                raise

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._rlock:
            return self._r.execute(sql, args).fetchall()

    def generation(self) -> int:
        return int(self._read("SELECT value FROM meta WHERE key = 'generation'")[0][0])

    def integrity_check(self) -> str:
        return str(self._read("PRAGMA integrity_check")[0][0])

    def changes_since(self, persona: str, seq: int) -> tuple[int, list[tuple[int, bool]]] | None:
        """Memories of ``persona`` added, changed or deleted by *other processes* since change
        ``seq``: (latest seq, [(memory id, active now)]). The embedded SQLite store has one
        writer, this process, so there is nothing to follow: ``(0, [])``. ``None``: the log no
        longer reaches back to ``seq`` (rebuild the index)."""
        return 0, []

    def change_seq(self) -> int:
        """The latest change number (see :meth:`changes_since`)."""
        return 0

    # ---- memories -------------------------------------------------------------------

    def insert_memory(
        self,
        conn: Conn,
        *,
        persona: str,
        kind: str,
        subject: str,
        text: str,
        embedding: np.ndarray,
        importance: float = 0.5,
        slot: str | None = None,
        source: str = "",
        now: float | None = None,
        created_at: float | None = None,
    ) -> int:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        t = self.clock() if now is None else now
        cur = conn.execute(
            "INSERT INTO memories (persona, kind, subject, text, importance, created_at, updated_at, "
            "embedding, slot, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                persona,
                kind,
                subject,
                text,
                float(np.clip(importance, 0, 1)),
                created_at or t,
                t,
                to_blob(embedding),
                slot,
                source,
            ),
        )
        return int(cur.fetchone()[0])

    def add_memory(self, **kw: Any) -> int:
        with self.transaction() as conn:
            return self.insert_memory(conn, **kw)

    def get(self, ids: Sequence[int]) -> dict[int, Memory]:
        if not ids:
            return {}
        q = ",".join("?" * len(ids))
        rows = self._read(f"SELECT {_COLS} FROM memories WHERE id IN ({q})", list(ids))
        return {r[0]: Memory(*r) for r in rows}

    def get_with_embeddings(self, ids: Sequence[int]) -> list[tuple[Memory, np.ndarray]]:
        if not ids:
            return []
        q = ",".join("?" * len(ids))
        rows = self._read(f"SELECT {_COLS}, embedding FROM memories WHERE id IN ({q})", list(ids))
        return [(Memory(*r[:-1]), from_blob(r[-1])) for r in rows]

    def subject_memories(
        self, persona: str, subject: str, limit: int = 500
    ) -> list[tuple[Memory, np.ndarray]]:
        """Active memories about one subject (most recent first), with embeddings."""
        rows = self._read(
            f"SELECT {_COLS}, embedding FROM memories WHERE persona = ? AND subject = ? "
            "AND superseded_by IS NULL ORDER BY updated_at DESC LIMIT ?",
            (persona, subject, limit),
        )
        return [(Memory(*r[:-1]), from_blob(r[-1])) for r in rows]

    def active_slot(self, persona: str, subject: str, slot: str) -> Memory | None:
        rows = self._read(
            f"SELECT {_COLS} FROM memories WHERE persona = ? AND subject = ? AND slot = ? "
            "AND superseded_by IS NULL ORDER BY updated_at DESC LIMIT 1",
            (persona, subject, slot),
        )
        return Memory(*rows[0]) if rows else None

    def iter_active_vectors(self, persona: str, batch: int = 4096) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, float32 vectors) of every active memory of ``persona``, in batches (index rebuilds)."""
        last = 0
        while True:
            rows = self._read(
                "SELECT id, embedding FROM memories WHERE persona = ? AND superseded_by IS NULL AND id > ? "
                "ORDER BY id LIMIT ?",
                (persona, last, batch),
            )
            if not rows:
                return
            last = rows[-1][0]
            ids = np.fromiter((r[0] for r in rows), dtype=np.uint64, count=len(rows))
            yield ids, np.stack([from_blob(r[1]) for r in rows])

    def known_subjects(self, persona: str, tokens: Sequence[str]) -> set[str]:
        """Which of ``tokens`` name a subject with memories, or a viewer (username or display name)."""
        if not tokens:
            return set()
        q = ",".join("?" * len(tokens))
        rows = self._read(
            f"SELECT DISTINCT subject FROM memories WHERE persona = ? AND subject IN ({q}) "
            f"UNION SELECT username FROM viewer_profiles WHERE persona = ? AND (username IN ({q}) "
            f"OR lower(display_name) IN ({q}))",
            [persona, *tokens, persona, *tokens, *tokens],
        )
        return {r[0] for r in rows}

    def list_memories(
        self,
        persona: str,
        *,
        subject: str | None = None,
        kind: str | None = None,
        include_superseded: bool = False,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Memory]:
        where, args = ["persona = ?"], [persona]
        if subject is not None:
            where.append("subject = ?")
            args.append(subject)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if not include_superseded:
            where.append("superseded_by IS NULL")
        sql = f"SELECT {_COLS} FROM memories WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ? OFFSET ?"
        return [Memory(*r) for r in self._read(sql, [*args, limit, offset])]

    def count(self, persona: str | None = None, active_only: bool = False) -> int:
        sql, args = "SELECT COUNT(*) FROM memories WHERE 1 = 1", []
        if persona is not None:
            sql += " AND persona = ?"
            args.append(persona)
        if active_only:
            sql += " AND superseded_by IS NULL"
        return int(self._read(sql, args)[0][0])

    def history_of(self, memory_id: int) -> list[Memory]:
        """The facts this memory superseded, newest first (its contradiction history)."""
        out: list[Memory] = []
        frontier = [memory_id]
        while frontier and len(out) < 100:
            q = ",".join("?" * len(frontier))
            rows = self._read(f"SELECT {_COLS} FROM memories WHERE superseded_by IN ({q})", frontier)
            found = [Memory(*r) for r in rows]
            out.extend(found)
            frontier = [m.id for m in found]
        return sorted(out, key=lambda m: m.updated_at, reverse=True)

    def delete_memories(self, conn: Conn, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        q = ",".join("?" * len(ids))
        return conn.execute(f"DELETE FROM memories WHERE id IN ({q})", list(ids)).rowcount

    # ---- viewer profiles and episodes ---------------------------------------------------

    def touch_profile(
        self, conn: Conn, persona: str, username: str, display_name: str | None, now: float
    ) -> None:
        conn.execute(
            "INSERT INTO viewer_profiles (persona, username, display_name, first_seen, last_seen, turns) "
            "VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT (persona, username) DO UPDATE SET "
            "last_seen = excluded.last_seen, turns = viewer_profiles.turns + 1, "
            "display_name = COALESCE(excluded.display_name, viewer_profiles.display_name)",
            (persona, username, display_name, now, now),
        )

    def profile(self, persona: str, username: str) -> ViewerProfile | None:
        rows = self._read(
            "SELECT persona, username, display_name, first_seen, last_seen, turns FROM viewer_profiles "
            "WHERE persona = ? AND username = ?",
            (persona, normalize_username(username)),
        )
        return ViewerProfile(*rows[0]) if rows else None

    def profiles(self, persona: str) -> list[ViewerProfile]:
        rows = self._read(
            "SELECT persona, username, display_name, first_seen, last_seen, turns FROM viewer_profiles "
            "WHERE persona = ? ORDER BY username",
            (persona,),
        )
        return [ViewerProfile(*r) for r in rows]

    def add_episode(
        self,
        conn: Conn,
        persona: str,
        started: float,
        ended: float,
        turns: int,
        summary: str,
        speakers: str,
    ) -> int:
        cur = conn.execute(
            "INSERT INTO episodes (persona, started_at, ended_at, turns, summary, speakers) "
            "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
            (persona, started, ended, turns, summary, speakers),
        )
        return int(cur.fetchone()[0])

    def episodes(self, persona: str, limit: int = 1000) -> list[Episode]:
        rows = self._read(
            "SELECT id, persona, started_at, ended_at, turns, summary, speakers FROM episodes "
            "WHERE persona = ? ORDER BY ended_at DESC LIMIT ?",
            (persona, limit),
        )
        return [Episode(*r) for r in rows]

    # ---- forgetting -------------------------------------------------------------------------

    def forget_viewer(self, username: str, persona: str | None = None) -> dict[str, Any]:
        """Delete every memory, profile and episode about ``username`` (in one persona, or all):
        memories whose subject is the viewer, and any memory or summary naming them (username or
        display name, whole word). Then purge freed pages from disk. Returns what was deleted."""
        user = normalize_username(username)
        with self.transaction() as conn:
            scope, sargs = ("persona = ? AND ", [persona]) if persona else ("", [])
            names = {user} | {
                (r[0] or "").strip().lower()
                for r in conn.execute(
                    f"SELECT display_name FROM viewer_profiles WHERE {scope}username = ?", [*sargs, user]
                )
                if r[0] and len(r[0].strip()) >= 3
            }
            pat = re.compile(r"(?<!\w)(" + "|".join(re.escape(n) for n in sorted(names)) + r")(?!\w)", re.I)
            ids = {
                r[0]
                for r in conn.execute(f"SELECT id FROM memories WHERE {scope}subject = ?", [*sargs, user])
            }
            ep_ids: set[int] = set()
            for name in names:
                like = f"%{_like_escape(name)}%"
                for mid, text in conn.execute(
                    f"SELECT id, text FROM memories WHERE {scope}text {self.ILIKE} ? ESCAPE '\\'",
                    [*sargs, like],
                ):
                    if pat.search(text):
                        ids.add(mid)
                for eid, text, speakers in conn.execute(
                    f"SELECT id, summary, speakers FROM episodes WHERE {scope}(summary {self.ILIKE} ? ESCAPE '\\' "
                    f"OR speakers {self.ILIKE} ? ESCAPE '\\')",
                    [*sargs, like, like],
                ):
                    if pat.search(text) or user in speakers.split(","):
                        ep_ids.add(eid)
            deleted = self.delete_memories(conn, sorted(ids))
            if ep_ids:
                q = ",".join("?" * len(ep_ids))
                conn.execute(f"DELETE FROM episodes WHERE id IN ({q})", sorted(ep_ids))
            profiles = conn.execute(
                f"DELETE FROM viewer_profiles WHERE {scope}username = ?", [*sargs, user]
            ).rowcount
        self.purge()
        return {
            "username": user,
            "memory_ids": sorted(ids),
            "memories": deleted,
            "episodes": len(ep_ids),
            "profiles": profiles,
        }

    def purge(self) -> None:
        """Make deleted data unrecoverable: checkpoint and truncate the WAL, VACUUM, truncate again."""
        with self._wlock, self._rlock:
            self._w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._w.execute("VACUUM")
            self._w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
