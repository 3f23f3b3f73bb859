"""Generation on the transformers model: prompt encoding, chunked prefill, sampling, the eager decode
loop over a ``DynamicCache``. :mod:`engine.llm.transformers_graph` adds the CUDA-graph decode on top
and :class:`~engine.llm.transformers_backend.TransformersLLM` the LLM protocol, loading and threads.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.llm.base import ChatMessage, LLMError
from engine.llm.config import LLMConfig
from engine.llm.kv_cache import CacheEntry, common_prefix_len, crop_cache
from engine.llm.streaming import CallStats, PieceChannel, prefill_in_chunks, sample_reply

PREFILL_CHUNK = 256  # tokens per prefill forward: the stop flag is checked between chunks


class TransformersGeneration:
    """The decode machinery over a loaded model; the attributes are set by the backend's constructor."""

    config: LLMConfig
    device: str
    model: Any
    tokenizer: Any
    _tok_lock: threading.Lock
    _cache_arg: str
    max_positions: int
    stop_ids: list[int]
    logit_bias: torch.Tensor | None
    prefilled_tokens: int
    reused_tokens: int
    generated_tokens: int

    def encode_chat(self, messages: list[ChatMessage], generation_prompt: bool = True) -> list[int]:
        """The prompt token ids: the tokenizer's chat template with the assistant turn opened (or, without
        ``generation_prompt``, just the messages: the start of a later prompt)."""
        with self._tok_lock:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=generation_prompt, tokenize=False
            )
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if self.logit_bias is not None:  # a random shape's tokenizer may know ids its model has not
            vocab = int(self.logit_bias.shape[-1])
            ids = [i if i < vocab else 0 for i in ids]
        return ids

    def _decode(self, ids: list[int]) -> str:
        with self._tok_lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # older transformers
            return DynamicCache()

    def _forward(self, ids: list[int], cache: Any) -> torch.Tensor:
        """Feed ``ids`` after what ``cache`` holds; return the last position's logits as float32 [1, V]."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        kwargs = {self._cache_arg: cache}
        out = self.model(input_ids=x, use_cache=True, logits_to_keep=1, **kwargs)
        return out.logits[:, -1, :].float()

    def _processors(self) -> Any:
        from transformers import (
            LogitsProcessorList,
            NoRepeatNGramLogitsProcessor,
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopPLogitsWarper,
        )

        cfg = self.config
        procs = LogitsProcessorList()
        if cfg.repetition_penalty > 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty))
        if cfg.no_repeat_ngram_size > 0:
            procs.append(NoRepeatNGramLogitsProcessor(cfg.no_repeat_ngram_size))
        if cfg.temperature > 0:
            procs.append(TemperatureLogitsWarper(cfg.temperature))
            if cfg.top_p < 1.0:
                procs.append(TopPLogitsWarper(cfg.top_p))
        return procs

    def _generate(
        self, messages: list[ChatMessage], entry: CacheEntry | None, chan: PieceChannel, stats: CallStats
    ) -> CacheEntry:
        ids = self.encode_chat(messages)
        stats.encoded_s = time.perf_counter() - stats.started
        stats.prompt_tokens = len(ids)
        self._check_length(len(ids), self.max_positions, "the model's")
        # Reuse the longest common prefix; at least one token must be fed to get logits.
        cache, keep = self._reuse(entry, ids, len(ids) - 1)
        fed = ids[:keep]
        logits = self._prefill(
            ids, keep, functools.partial(self._cache_forward, cache), fed, chan.stop, stats
        )
        if logits is None:
            return CacheEntry(fed, cache)

        def feed(token: int) -> torch.Tensor:
            out = self._forward([token], cache)
            fed.append(token)
            return out

        self._sample(logits, feed, chan, stats)
        return CacheEntry(fed, cache)

    def _reuse(self, entry: CacheEntry | None, ids: list[int], limit: int) -> tuple[Any, int]:
        """``entry``'s cache cropped to its longest common prefix with ``ids`` (at most ``limit`` tokens) and
        that length, or a new cache and 0."""
        if entry is not None and entry.cache.get_seq_length() == len(entry.ids):
            keep = min(common_prefix_len(entry.ids, ids), limit)
            if keep > 0:
                crop_cache(entry.cache, len(entry.ids), keep)
                return entry.cache, keep
        return self._new_cache(), 0

    def _cache_forward(self, cache: Any, chunk: list[int], start: int) -> torch.Tensor:
        """A prefill ``forward`` for the CPU cache (which knows its own positions)."""
        return self._forward(chunk, cache)

    def _prefill(
        self,
        ids: list[int],
        keep: int,
        forward: Callable[[list[int], int], torch.Tensor],
        fed: list[int],
        stop: threading.Event,
        stats: CallStats,
    ) -> torch.Tensor | None:
        """Feed ``ids[keep:]`` (the first ``keep`` are already cached) in ``PREFILL_CHUNK`` pieces through
        ``forward(chunk, start)``, appending each to ``fed``; the last logits, or None once stopped."""

        def feed(piece: list[int], start: int) -> torch.Tensor:
            logits = forward(piece, start)
            fed.extend(piece)
            return logits

        logits = prefill_in_chunks(ids, keep, feed, PREFILL_CHUNK, stop, stats, self)
        assert logits is not None or stop.is_set()
        return logits

    def _check_length(self, prompt_tokens: int, positions: int, whose: str, setting: str = "") -> None:
        if prompt_tokens + self.config.max_new_tokens > positions:
            raise LLMError(
                f"prompt of {prompt_tokens} tokens + max_new_tokens {self.config.max_new_tokens} exceeds "
                f"{whose} {positions} positions{setting}: shorten the history"
            )

    def _sample(
        self, logits: torch.Tensor, feed: Callable[[int], torch.Tensor], chan: PieceChannel, stats: CallStats
    ) -> None:
        """Sample up to ``max_new_tokens`` from ``logits`` on, handing text pieces to ``chan``;
        ``feed(token)`` puts a sampled token into the cache and returns the next logits (float32)."""
        cfg = self.config
        procs = self._processors()
        greedy = cfg.temperature == 0

        def pick(logits: torch.Tensor, reply: list[int]) -> int:
            if self.logit_bias is not None:
                logits = logits + self.logit_bias
            # Penalties look at the reply only: the prompt holds the persona, names and the
            # template's own markers, which the reply must stay free to repeat.
            logits = procs(torch.tensor([reply], dtype=torch.long, device=logits.device), logits)
            if greedy:
                return int(torch.argmax(logits, dim=-1))
            return int(torch.multinomial(torch.softmax(logits, dim=-1), 1))

        def counted(step: int) -> None:
            self.generated_tokens += 1

        sample_reply(
            logits, pick, feed, self._decode, self.stop_ids, cfg.max_new_tokens, chan, stats, counted
        )
