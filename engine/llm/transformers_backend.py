"""The in-process language model: transformers with our own decode loop and a reusable KV cache.

Generation runs in one worker thread per call and hands text pieces to the event loop through a
bounded channel (:mod:`engine.llm.streaming`, shared with the llama.cpp backend). Closing the stream,
cancelling its consumer, or dropping it sets a stop flag the worker checks before every forward pass,
so it stops within one decode step (or one prefill chunk).

Per ``cache_key`` the backend keeps the token ids and the ``DynamicCache`` of the previous call
(see :mod:`engine.llm.kv_cache`); the next call prefills only what follows the longest common
token prefix. :attr:`TransformersLLM.prefilled_tokens` and friends count the real work done.

On CUDA (``llm.cuda_graphs``, the default there) decoding goes through :mod:`engine.llm.graph_kv`
instead: a few static KV caches, each with one captured CUDA graph per decode step, reused by common
token prefix. Prompt handling, sampling, the stop flag and the counters are the same on both paths.

Three modules: loading (:mod:`engine.llm.transformers_load`), generation
(:mod:`engine.llm.transformers_generate`) and the CUDA-graph path (:mod:`engine.llm.transformers_graph`);
this one is the LLM protocol over them: construction, the worker threads, prewarm and end of turn.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from engine.llm.base import ChatMessage, LLMError
from engine.llm.config import LLMConfig
from engine.llm.hf_models import load_model, pick_device, pick_dtype, resolve_source
from engine.llm.kv_cache import CacheEntry, PrefixCacheStore
from engine.llm.random_model import speakable_bias
from engine.llm.streaming import (
    PREWARM_MIN_TOKENS,
    CallStats,
    PieceChannel,
    WorkerStream,
    run_stoppable,
)
from engine.llm.transformers_graph import GraphDecodePath
from engine.llm.transformers_load import cpu_threads, quantize_int8, stop_ids
from engine.llm.turn_end import split_at_last_message
from engine.llm.workers import warmed_pool
from engine.progress import Progress, silent_progress

log = logging.getLogger(__name__)

SAMPLING_OPTIONS = frozenset(
    {"max_new_tokens", "temperature", "top_p", "repetition_penalty", "no_repeat_ngram_size"}
)


class TransformersLLM(GraphDecodePath):
    """:class:`~engine.llm.base.LLM` on a local transformers causal LM (default: bundled SmolLM2-135M).

    Construction loads the model (blocking; seconds, or ~25-60 s the very first time a GGUF is
    dequantized): call it from an executor, e.g. ``await asyncio.to_thread(load_llm, cfg, progress)``.
    """

    def __init__(
        self,
        config: LLMConfig | None = None,
        progress: Progress = silent_progress,
        *,
        cache_slots: int = 8,
        warmup: bool = True,
    ) -> None:
        self.config = config or LLMConfig()  # type: ignore[call-arg]
        self.device = pick_device(self.config.device)
        if self.device == "cpu":
            torch.set_num_threads(cpu_threads(self.config.threads))
        self.dtype = pick_dtype(self.config.dtype, self.device)
        self.source = resolve_source(self.config.model)
        self.model, self.tokenizer = load_model(
            self.source,
            cache_dir=self.config.cache_dir,
            dtype=self.dtype,
            device=self.device,
            progress=progress,
            tokenizer_dir=self.config.tokenizer,
        )
        self.quantized = self.device == "cpu" and self.config.quantize == "int8"
        if self.quantized:
            self.model = quantize_int8(self.model)
        self._tok_lock = threading.Lock()  # fast tokenizers dislike concurrent use
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)
        self.stop_ids = stop_ids(self.tokenizer, self.model)
        # Random-weight shapes (benchmarks) sample only ids that read as words: see engine.llm.random_model.
        self.logit_bias: torch.Tensor | None = None
        if self.source.kind == "random":
            vocab = int(self.model.config.vocab_size)
            self.logit_bias = speakable_bias(self.tokenizer, vocab, self.stop_ids, self.device)
        # transformers 5.2x renamed `past_key_values` to `cache` (the old name warns, then goes away).
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.caches = PrefixCacheStore(cache_slots)
        # Cumulative counters over all calls (the worker threads update them).
        self.prefilled_tokens = 0
        self.reused_tokens = 0
        self.generated_tokens = 0
        self.last_call = CallStats()
        self.graph_slots = self._graph_slots(progress)

        def warm_forward() -> None:
            with torch.inference_mode():
                self._forward([self.stop_ids[0] if self.stop_ids else 0], self._new_cache())

        # On CUDA the worker threads live as long as the model, each warmed now: a reply on a thread that had
        # done no CUDA work took 75-90 ms longer to its first token on the H200 (engine/llm/workers.py).
        self.cuda_workers: ThreadPoolExecutor | None = None
        if self.device == "cuda":
            workers = max(4, 2 * self.config.cuda_graph_slots)
            self.cuda_workers = warmed_pool(workers, warm_forward)
        elif warmup:
            warm_forward()

    # ---- the LLM protocol ---------------------------------------------------------------

    def stream(self, messages: list[ChatMessage], cache_key: str | None = None) -> WorkerStream:
        work = functools.partial(self._worker, list(messages), cache_key)
        return WorkerStream(work, self.cuda_workers)  # CPU: a thread of its own

    async def prewarm(self, messages: list[ChatMessage], cache_key: str | None = None) -> int:
        # Cancelled: the worker stops at the next prefill chunk and puts its cache back.
        job = functools.partial(self._prewarm, list(messages), cache_key)
        return int(await run_stoppable(self.cuda_workers, job))

    def _prewarm(self, messages: list[ChatMessage], key: str | None, stop: threading.Event) -> int:
        ids = self.encode_chat(messages, generation_prompt=False)
        stats = CallStats()
        with torch.inference_mode():
            slots = self.graph_slots
            if slots is not None and ids:
                self._check_length(len(ids), slots.max_len, "the CUDA-graph KV cache's")
                slot = slots.take(ids, stop)
                if slot is None:
                    return 0
                valid = False
                try:
                    self._slot_prefill(slot, ids, len(ids), stop, stats, PREWARM_MIN_TOKENS)
                    valid = True
                finally:
                    slots.put_back(slot, valid)
            elif key is not None and ids:
                owned, entry = self.caches.take(key, stop, wait_s=0.0)  # held by a call: not idle any more
                if not owned:
                    return 0
                keep_entry: CacheEntry | None = None
                try:
                    self._check_length(len(ids), self.max_positions, "the model's")
                    cache, keep = self._reuse(entry, ids, len(ids))
                    keep_entry = CacheEntry(ids[:keep], cache)
                    if len(ids) - keep >= PREWARM_MIN_TOKENS:
                        forward = functools.partial(self._cache_forward, cache)
                        self._prefill(ids, keep, forward, keep_entry.ids, stop, stats)
                except Exception:
                    keep_entry = None  # a half-fed cache is no use
                    raise
                finally:
                    self.caches.put_back(key, keep_entry)
        return stats.prefilled_tokens

    async def end_of_turn_probability(
        self, messages: list[ChatMessage], cache_key: str | None = None
    ) -> float:
        job = functools.partial(self._end_of_turn, list(messages), cache_key)
        return float(await run_stoppable(self.cuda_workers, job))

    def _end_of_turn(self, messages: list[ChatMessage], key: str | None, stop: threading.Event) -> float:
        """P(end-of-turn marker) right after the last message's text; the evaluated prefix stays cached
        (the conversation's CPU cache, or a CUDA-graph slot) for the reply that follows."""
        if not messages:
            raise ValueError("no messages to score")
        with self._tok_lock:
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=False, tokenize=False
            )
        head, tail = split_at_last_message(str(rendered), messages[-1]["content"])
        with self._tok_lock:
            ids = list(self.tokenizer(head, add_special_tokens=False)["input_ids"])
            marker = list(self.tokenizer(tail, add_special_tokens=False)["input_ids"])
        if not ids or not marker:
            raise LLMError("the chat template leaves no end-of-turn marker after the message")
        stats = CallStats()
        logits: torch.Tensor | None = None
        with torch.inference_mode():
            slots = self.graph_slots
            if slots is not None:
                self._check_length(len(ids), slots.max_len, "the CUDA-graph KV cache's")
                slot = slots.take(ids, stop)
                if slot is None:
                    return 0.0
                valid = False
                try:
                    logits = self._slot_prefill(slot, ids, len(ids) - 1, stop, stats)
                    if logits is not None:
                        logits = logits.to(torch.float32, copy=True)
                    valid = True
                finally:
                    slots.put_back(slot, valid)
            else:
                self._check_length(len(ids), self.max_positions, "the model's")
                owned, entry = self.caches.take(key, stop) if key is not None else (False, None)
                keep_entry: CacheEntry | None = None
                try:
                    cache, keep = self._reuse(entry, ids, len(ids) - 1)
                    keep_entry = CacheEntry(ids[:keep], cache)
                    forward = functools.partial(self._cache_forward, cache)
                    logits = self._prefill(ids, keep, forward, keep_entry.ids, stop, stats)
                except Exception:
                    keep_entry = None
                    raise
                finally:
                    if key is not None and owned:
                        self.caches.put_back(key, keep_entry)
        if logits is None:
            return 0.0
        return float(torch.softmax(logits.float().reshape(-1), dim=-1)[marker[0]])

    def with_options(self, **changes: Any) -> TransformersLLM:
        """A sibling sharing this one's weights and tokenizer, with other sampling settings
        (its own KV caches and counters): e.g. a per-persona temperature."""
        bad = set(changes) - SAMPLING_OPTIONS
        if bad:
            raise ValueError(f"with_options only changes {sorted(SAMPLING_OPTIONS)}, not {sorted(bad)}")
        sibling = copy.copy(self)
        sibling.config = LLMConfig.model_validate({**self.config.model_dump(), **changes})
        sibling.caches = PrefixCacheStore(self.caches.slots)
        sibling.prefilled_tokens = sibling.reused_tokens = sibling.generated_tokens = 0
        sibling.last_call = CallStats()
        return sibling

    def describe(self) -> str:
        threads = f", {torch.get_num_threads()} threads" if self.device == "cpu" else ""
        dtype = str(self.dtype).removeprefix("torch.") + (", int8 linear layers" if self.quantized else "")
        if self.graph_slots is not None:
            g = self.graph_slots
            threads = f", CUDA-graph decode, {g.slots} static KV caches of {g.max_len} positions"
        return f"transformers {self.source.label or self.source.location} ({self.device}, {dtype}{threads})"

    # ---- the worker thread --------------------------------------------------------------

    def _worker(self, messages: list[ChatMessage], key: str | None, chan: PieceChannel) -> None:
        stats = chan.stats
        self.last_call = stats
        graph = self.graph_slots is not None
        owned, entry = self.caches.take(key, chan.stop) if key is not None and not graph else (False, None)
        error: BaseException | None = None
        keep: CacheEntry | None = None
        try:
            with torch.inference_mode():
                if graph:
                    self._generate_graph(messages, chan, stats)
                else:
                    keep = self._generate(messages, entry, chan, stats)
        except LLMError as e:
            error = e
        except Exception as e:
            log.exception("llm generation failed")
            error = LLMError(f"transformers generation failed: {e!r}")
        finally:
            stats.elapsed_s = time.perf_counter() - stats.started
            if error is not None:
                stats.stop_reason = "error"
            if key is not None and owned:
                self.caches.put_back(key, keep)  # before the end is signalled: the next call finds it
        chan.finish(error)
