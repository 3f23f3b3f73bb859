"""The memory bank: the store (source of truth), the vector index (its cache) and the embedder,
kept consistent. Every method here is blocking: call it from a worker thread in async code."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from persona.embed import Embedder
from persona.index import VectorIndex
from persona.retrieval import RetrievalWeights, Scored, embed_text, focus_subjects, query_tokens, retrieve
from persona.store import KINDS, Conn, Memory, MemoryStore, normalize_username


class MemoryNotFound(LookupError):
    """No such memory."""


class MemoryBank:
    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder,
        persona: str,
        *,
        index_path: str | Path | None = None,
        index: VectorIndex | None = None,
        weights: RetrievalWeights | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.persona = persona
        self.weights = weights or RetrievalWeights()
        self.clock = clock
        self.self_names: set[str] = {persona}  # names of the persona (subjects of her self-facts)
        self.index_path = Path(index_path) if index_path is not None else None
        self.index = index or VectorIndex(embedder.dim)
        self._lock = threading.RLock()
        self._change_seq = store.change_seq()  # before the index is read: later changes are replayed
        self.index_state = self.index.open(store, persona, self._index_file())

    @classmethod
    def open(cls, db_path: str | Path, embedder: Embedder, persona: str, **kw: object) -> MemoryBank:
        store = MemoryStore(db_path)
        index_path = None if str(db_path) == ":memory:" else Path(str(db_path) + ".usearch")
        return cls(store, embedder, persona, index_path=index_path, **kw)  # type: ignore[arg-type]

    @classmethod
    def open_postgres(cls, dsn: str, embedder: Embedder, persona: str, **kw: object) -> MemoryBank:
        """A bank over a shared PostgreSQL (no index file: each engine builds its index from the rows)."""
        from persona.pgstore import PostgresMemoryStore

        return cls(PostgresMemoryStore(dsn), embedder, persona, index_path=None, **kw)  # type: ignore[arg-type]

    def _index_file(self) -> Path | None:
        if self.index_path is None:
            return None
        return self.index_path.with_name(f"{self.index_path.name}.{self.persona}")

    # ---- consistency between store and index ---------------------------------------------

    @contextmanager
    def write(self) -> Iterator[Conn]:
        """A store transaction; afterwards the index is known to match the store only if no one
        else wrote in between (else it will be rebuilt at the next open instead of loaded)."""
        with self._lock, self.store.transaction() as conn:
            before = int(conn.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()[0])
            yield conn
        self.index.generation = before + 1 if self.index.generation == before else -1

    def sync(self) -> int:
        """Bring the index in step with memories other engines wrote or deleted in a shared store
        (see :mod:`persona.pgstore`); returns how many memories changed (-1: rebuilt)."""
        with self._lock:
            got = self.store.changes_since(self.persona, self._change_seq)
            if got is None:  # the change log no longer reaches back: rebuild from the rows
                self._change_seq = self.store.change_seq()
                self.index.rebuild(self.store, self.persona)
                return -1
            seq, changes = got
            if changes:
                self.index.remove([mid for mid, active in changes if not active])
                live = [(m, v) for m, v in self.store.get_with_embeddings([mid for mid, a in changes if a])]
                live = [(m, v) for m, v in live if m.superseded_by is None and m.persona == self.persona]
                if live:
                    self.index.add([m.id for m, _ in live], np.stack([v for _, v in live]))
            self._change_seq = seq
            return len(changes)

    def save_index(self) -> None:
        path = self._index_file()
        if path is not None and self.index.generation >= 0:
            self.index.save(path, self.index.generation)

    def switch_persona(self, persona: str) -> None:
        with self._lock:
            self.save_index()
            self.persona = persona
            self.index = VectorIndex(self.embedder.dim)
            self._change_seq = self.store.change_seq()
            self.index_state = self.index.open(self.store, persona, self._index_file())

    def close(self) -> None:
        with self._lock:
            self.save_index()
            self.store.close()

    # ---- queries ------------------------------------------------------------------------

    def search(self, query: str, k: int = 5, speaker: str | None = None) -> list[Scored]:
        """The ``k`` best memories for a query (as a turn by ``speaker`` would retrieve them)."""
        self.sync()
        vec = self.embedder.embed([query])[0]
        user = normalize_username(speaker) if speaker else None
        tokens = query_tokens(query)
        named = self.store.known_subjects(self.persona, tokens) - {self.persona}
        low = query.lower()
        if any(f"{n}'s" in low for n in self.self_names):
            named.add(self.persona)
        focus = focus_subjects(query, user, self.persona, named)
        return retrieve(
            self.store,
            self.index,
            vec,
            self.persona,
            k=k,
            focus=focus,
            now=self.clock(),
            weights=self.weights,
        )

    def get(self, memory_id: int) -> Memory:
        m = self.store.get([memory_id]).get(memory_id)
        if m is None or m.persona != self.persona:
            raise MemoryNotFound(f"no memory {memory_id} for persona {self.persona!r}")
        return m

    # ---- edits ----------------------------------------------------------------------------

    def add(
        self,
        text: str,
        *,
        kind: str = "viewer_fact",
        subject: str = "",
        importance: float = 0.5,
        slot: str | None = None,
        source: str = "api",
    ) -> Memory:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not text.strip():
            raise ValueError("text must not be empty")
        if not 0.0 <= importance <= 1.0:
            raise ValueError(f"importance must be between 0 and 1, got {importance}")
        subj = normalize_username(subject) if subject else ""
        vec = self.embedder.embed([embed_text(kind, subj, text)])[0]
        with self.write() as conn:
            mid = self.store.insert_memory(
                conn,
                persona=self.persona,
                kind=kind,
                subject=normalize_username(subject) if subject else "",
                text=text.strip(),
                embedding=vec,
                importance=importance,
                slot=slot,
                source=source,
                now=self.clock(),
            )
            self.index.add([mid], vec[None, :])
        return self.get(mid)

    def edit(self, memory_id: int, *, text: str | None = None, importance: float | None = None) -> Memory:
        old = self.get(memory_id)
        if importance is not None and not 0.0 <= importance <= 1.0:
            raise ValueError(f"importance must be between 0 and 1, got {importance}")
        vec = (
            self.embedder.embed([embed_text(old.kind, old.subject, text)])[0]
            if text is not None and text.strip()
            else None
        )
        if text is not None and vec is None:
            raise ValueError("text must not be empty")
        with self.write() as conn:
            if vec is not None and text is not None:
                conn.execute(
                    "UPDATE memories SET text = ?, embedding = ?, updated_at = ? WHERE id = ?",
                    (text.strip(), vec.astype("<f4").tobytes(), self.clock(), memory_id),
                )
            if importance is not None:
                conn.execute(
                    "UPDATE memories SET importance = ?, updated_at = ? WHERE id = ?",
                    (importance, self.clock(), memory_id),
                )
        m = self.get(memory_id)
        if vec is not None and m.superseded_by is None:
            self.index.add([memory_id], vec[None, :])
        return m

    def forget(self, memory_id: int) -> list[int]:
        """Delete a memory and the history it superseded (so no older version resurfaces)."""
        self.get(memory_id)
        ids = [memory_id, *(m.id for m in self.store.history_of(memory_id))]
        with self.write() as conn:
            self.store.delete_memories(conn, ids)
        self.index.remove(ids)
        return ids

    def forget_viewer(self, username: str, all_personas: bool = True) -> dict[str, object]:
        """Right to be forgotten: delete every row about the viewer, purge the disk, drop their
        vectors from the index and any saved index file, and their texts from caches."""
        with self._lock:
            report = self.store.forget_viewer(username, None if all_personas else self.persona)
            self.index.remove(report["memory_ids"])
            self.index.generation = -1
            if self.index_path is not None:
                for f in self.index_path.parent.glob(self.index_path.name + ".*"):
                    f.unlink(missing_ok=True)
            forget_cache = getattr(self.embedder, "forget", None)
            if callable(forget_cache):
                forget_cache(report["username"])
            return report
