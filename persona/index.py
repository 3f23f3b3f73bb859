"""Approximate nearest-neighbour search over memory embeddings (usearch HNSW).

Why HNSW and not exact search: on this 2-core machine an exact numpy product over
100,000 × 384 float32 is 7.4 ms p50 / 8.1 ms p95 when the machine is idle, too close to the
10 ms budget once anything else runs; ``sqlite-vec`` (through apsw) was ~45 ms. An HNSW graph
answers in well under a millisecond idle. Vectors are stored quantized to int8 (cosine metric)
to halve build time and memory; the candidates it returns are re-scored exactly with the
float32 embeddings kept in SQLite (see :mod:`persona.retrieval`), so quantization does not
decide the ranking.

The index lives in RAM and is saved next to the database with the store's generation
counter; at open, a saved index whose generation matches is loaded, else it is rebuilt from
SQLite (SQLite is the source of truth; the index is a cache of it).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from persona.store import MemoryStore


def _new_index(**params: Any) -> Any:
    """A usearch ``Index``, imported on first use: an engine with the persona off never loads usearch."""
    try:  # onnxruntime must be loaded before usearch: the other order segfaults at import here
        import onnxruntime  # noqa: F401  (onnxruntime 1.32 + usearch 2.26.6 wheels)
    except ImportError:
        pass
    from usearch.index import Index

    return Index(**params)


class VectorIndex:
    def __init__(
        self,
        dim: int = 384,
        *,
        connectivity: int = 16,
        expansion_add: int = 64,
        expansion_search: int = 64,
        dtype: str = "i8",
        threads: int = 2,
    ) -> None:
        self.dim = dim
        self.threads = threads
        self._params = {
            "ndim": dim,
            "metric": "cos",
            "dtype": dtype,
            "connectivity": connectivity,
            "expansion_add": expansion_add,
            "expansion_search": expansion_search,
        }
        self._index = _new_index(**self._params)
        self._lock = threading.RLock()
        self.generation = -1

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return isinstance(key, int) and key >= 0 and key in self._index

    def add(self, ids: Iterable[int] | np.ndarray, vectors: np.ndarray) -> None:
        keys = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.uint64)
        if len(keys) == 0:
            return
        vecs = np.asarray(vectors, dtype=np.float32).reshape(len(keys), self.dim)
        with self._lock:
            present = [k for k in keys.tolist() if k in self._index]
            if present:
                self._index.remove(present)
            self._index.add(keys, vecs, threads=self.threads)

    def remove(self, ids: Iterable[int]) -> None:
        keys = [int(i) for i in ids]
        with self._lock:
            keys = [k for k in keys if k in self._index]
            if keys:
                self._index.remove(keys)

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, cosine similarities) of up to ``k`` nearest, best first."""
        with self._lock:
            if len(self._index) == 0:
                return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
            m = self._index.search(np.asarray(query, dtype=np.float32), min(k, len(self._index)))
        return np.asarray(m.keys, dtype=np.int64), 1.0 - np.asarray(m.distances, dtype=np.float32)

    def clear(self) -> None:
        with self._lock:
            self._index = _new_index(**self._params)

    # ---- persistence --------------------------------------------------------------------

    def save(self, path: str | Path, generation: int) -> None:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with self._lock:
            self._index.save(str(tmp))
            os.replace(tmp, path)
            Path(str(path) + ".json").write_text(
                json.dumps({"generation": generation, "count": len(self._index), **self._params}),
                encoding="utf-8",
            )
            self.generation = generation

    def load(self, path: str | Path, generation: int) -> bool:
        """Load a saved index if it reflects ``generation`` with the same parameters."""
        path = Path(path)
        meta_path = Path(str(path) + ".json")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if meta.get("generation") != generation or any(meta.get(k) != v for k, v in self._params.items()):
            return False
        with self._lock:
            index = _new_index(**self._params)
            try:
                index.load(str(path))
            except Exception:
                return False
            if len(index) != meta.get("count"):
                return False
            self._index = index
            self.generation = generation
        return True

    def rebuild(self, store: MemoryStore, persona: str, progress: Callable[[int], None] | None = None) -> int:
        self.clear()
        generation = store.generation()
        n = 0
        for ids, vecs in store.iter_active_vectors(persona):
            self.add(ids, vecs)
            n += len(ids)
            if progress is not None:
                progress(n)
        self.generation = generation
        return n

    def open(self, store: MemoryStore, persona: str, path: str | Path | None) -> str:
        """Load the saved index for ``persona`` or rebuild it; returns 'loaded' or 'rebuilt'."""
        if path is not None and self.load(path, store.generation()):
            return "loaded"
        self.rebuild(store, persona)
        return "rebuilt"

    @staticmethod
    def discard(path: str | Path) -> None:
        """Delete a saved index (it may hold embeddings of forgotten data)."""
        for p in (Path(path), Path(str(path) + ".json"), Path(str(path) + ".tmp")):
            p.unlink(missing_ok=True)
