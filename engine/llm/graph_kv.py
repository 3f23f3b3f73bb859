"""The GPU decode path's KV caches: a few :class:`GraphDecoder` slots, each a static K/V buffer with its own
captured decode step, reused across calls by common token prefix.

A call *takes* a slot for its whole duration and *puts it back* at the end, so two generations never share
one. Reuse is by content, not by conversation key: a slot remembers the token ids whose K/V it holds, and a
call takes the free slot sharing the longest prefix with its prompt (the persona/system prompt and the
conversation so far), crops it there (``reset_to``: later writes overwrite the rest) and prefills only the
tail. Each slot has its own sampler (:mod:`engine.llm.device_sampler`), a graph of its own too. All slots
are built, and their graphs captured, at construction: capturing later, while other threads replay graphs
or read results on the same device, is not safe.

``batched`` (the default of the backend): the slots are the rows of one :class:`BatchedDecoder` and the
replies decoding at the same time step together (:mod:`engine.llm.shared_decode`); otherwise each slot is
a :class:`GraphDecoder` stepping alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.llm.cuda_graph_decode import BatchedDecoder, GraphDecoder
from engine.llm.device_sampler import DeviceSampler
from engine.llm.kv_cache import common_prefix_len
from engine.llm.shared_decode import SharedStep


@dataclass
class GraphSlot:
    decoder: GraphDecoder
    sampler: DeviceSampler
    row: int = 0  # its row of the batched decoder, where there is one
    ids: list[int] = field(default_factory=list)  # host mirror of the ids held (== decoder.length of them)
    used: int = 0  # when last put back (a count of put-backs, not time), for least-recently-used ties

    def crop(self, keep: int) -> None:
        """Keep the first ``keep`` cached tokens."""
        self.decoder.reset_to(keep)
        del self.ids[keep:]


class GraphSlots:
    """``slots`` decoders over one model (blocking construction: graph capture per slot)."""

    def __init__(self, model: Any, max_len: int, slots: int, batched: bool = False) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.max_len = max_len
        self.shared: SharedStep | None = None
        if batched:
            self.shared = SharedStep(BatchedDecoder(model, max_len=max_len, rows=slots))
            decoders = self.shared.decoder.rows
        else:
            decoders = [GraphDecoder(model, max_len=max_len) for _ in range(slots)]
        self._free = [
            GraphSlot(d, DeviceSampler(d.vocab, d.dtype, d.device, d.use_graph), row)
            for row, d in enumerate(decoders)
        ]
        self.slots = slots
        self._cond = threading.Condition()
        self._put_backs = 0

    def step(self, slot: GraphSlot, token: int) -> torch.Tensor:
        """Feed ``token`` to ``slot`` (with the other decoding slots where batched); its next logits
        ``[1, vocab]``, a buffer the slot's next step overwrites."""
        if self.shared is None:
            out = slot.decoder.step(token)
        else:
            out = self.shared.step(slot.row, token)
        slot.ids.append(token)
        return out

    def take(self, ids: list[int], stop: threading.Event) -> GraphSlot | None:
        """The free slot sharing the longest prefix with ``ids`` (least recently used among equals), waiting
        while all are busy; None once ``stop`` is set first."""
        with self._cond:
            while not self._free:
                if stop.is_set():
                    return None
                self._cond.wait(0.05)
            best = max(self._free, key=lambda s: (common_prefix_len(s.ids, ids), -s.used))
            self._free.remove(best)
            return best

    def put_back(self, slot: GraphSlot, valid: bool = True) -> None:
        """Release ``slot``; ``valid=False`` (the call failed midway) forgets what it holds."""
        if self.shared is not None:
            self.shared.leave(slot.row)
        try:
            if not valid:
                slot.ids.clear()
                slot.decoder.reset_to(0)
        finally:
            with self._cond:
                self._put_backs += 1
                slot.used = self._put_backs
                self._free.append(slot)
                self._cond.notify()

    def warm(self, token: int) -> None:
        """Run a short prefill and one step on every slot (first-use costs out of the first reply), then
        empty them."""
        for slot in self._free:
            dec = slot.decoder
            dec.prefill(torch.full((8,), token, dtype=torch.long, device=dec.device), 0)
            dec.step(token)
        if self.shared is not None:
            self.shared.decoder.step_rows({slot.row: token for slot in self._free})
        for slot in self._free:
            slot.crop(0)
        if self._free and self._free[0].decoder.device.type == "cuda":
            torch.cuda.synchronize(self._free[0].decoder.device)

    def free(self) -> int:
        with self._cond:
            return len(self._free)
