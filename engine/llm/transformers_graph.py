"""The CUDA-graph decode path of the transformers backend (``llm.cuda_graphs``, on by default on CUDA).

A few static KV caches (:mod:`engine.llm.graph_kv`), each with one captured CUDA graph per decode
step and its own sampler on the device (:mod:`engine.llm.device_sampler`), reused by common token prefix.
Prompt handling, the stop flag and the counters are those of
:class:`~engine.llm.transformers_generate.TransformersGeneration`.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from engine.llm.base import ChatMessage
from engine.llm.graph_kv import GraphSlot, GraphSlots
from engine.llm.kv_cache import common_prefix_len
from engine.llm.streaming import CallStats, PieceChannel, sample_reply
from engine.llm.transformers_generate import TransformersGeneration
from engine.progress import Progress

log = logging.getLogger(__name__)


class GraphDecodePath(TransformersGeneration):
    """Adds the CUDA-graph slots: ``graph_slots`` is None where the eager path runs."""

    graph_slots: GraphSlots | None

    def _graph_slots(self, progress: Progress) -> GraphSlots | None:
        """The CUDA-graph decode path's KV caches (built and captured now), or None (CPU, switched off, or
        a model GraphDecoder does not support: then the DynamicCache path runs on the GPU too)."""
        cfg = self.config
        if self.device != "cuda" or not cfg.cuda_graphs:
            return None
        max_len = min(cfg.cuda_graph_max_len, self.max_positions)
        start = time.perf_counter()
        try:
            slots = GraphSlots(
                self.model, max_len=max_len, slots=cfg.cuda_graph_slots, batched=cfg.cuda_graph_batched
            )
        except NotImplementedError as e:
            log.warning("llm: no CUDA-graph decode for this model (%s): eager decode with a DynamicCache", e)
            return None
        with torch.inference_mode():
            slots.warm(self.stop_ids[0] if self.stop_ids else 0)
        progress(
            "llm",
            f"CUDA-graph decode captured ({cfg.cuda_graph_slots} caches"
            f"{', decoding together' if cfg.cuda_graph_batched else ''}, "
            f"{time.perf_counter() - start:.1f} s)",
        )
        return slots

    def _generate_graph(self, messages: list[ChatMessage], chan: PieceChannel, stats: CallStats) -> None:
        slots = self.graph_slots
        assert slots is not None
        ids = self.encode_chat(messages)
        stats.encoded_s = time.perf_counter() - stats.started
        stats.prompt_tokens = len(ids)
        self._check_length(len(ids), slots.max_len, "the CUDA-graph KV cache's", " (llm.cuda_graph_max_len)")
        slot = slots.take(ids, chan.stop)
        if slot is None:
            stats.stop_reason = "cancelled"
            return
        valid = False
        try:
            self._run_graph(slot, ids, chan, stats)
            valid = True
        finally:
            slots.put_back(slot, valid)

    def _slot_prefill(
        self,
        slot: GraphSlot,
        ids: list[int],
        limit: int,
        stop: threading.Event,
        stats: CallStats,
        min_new: int = 1,
    ) -> torch.Tensor | None:
        """Crop ``slot`` to its longest common prefix with ``ids`` (at most ``limit`` tokens) and prefill the
        rest through its graphs, unless fewer than ``min_new`` are missing; the last logits, or None."""
        keep = min(common_prefix_len(slot.ids, ids), limit)
        slot.crop(keep)
        if len(ids) - keep < min_new:
            return None
        dec = slot.decoder

        def forward(chunk: list[int], start: int) -> torch.Tensor:
            return dec.prefill(torch.tensor(chunk, dtype=torch.long, device=self.device), start)

        return self._prefill(ids, keep, forward, slot.ids, stop, stats)

    def _run_graph(self, slot: GraphSlot, ids: list[int], chan: PieceChannel, stats: CallStats) -> None:
        slots = self.graph_slots
        assert slots is not None
        # Reuse the longest common prefix; at least one token must be fed to get logits.
        logits = self._slot_prefill(slot, ids, len(ids) - 1, chan.stop, stats)
        if logits is None:
            return

        def feed(token: int) -> torch.Tensor:
            return slots.step(slot, token)  # a static buffer: the sampler copies it before the next step

        cfg = self.config
        sampler = slot.sampler
        sampler.begin(
            cfg.temperature, cfg.top_p, cfg.repetition_penalty, cfg.no_repeat_ngram_size, self.logit_bias
        )

        def counted(step: int) -> None:
            self.generated_tokens += 1

        sample_reply(
            logits, sampler.pick, feed, self._decode, self.stop_ids, cfg.max_new_tokens, chan, stats, counted
        )
