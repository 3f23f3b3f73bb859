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
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from engine.llm.base import ChatMessage, LLMError
from engine.llm.config import LLMConfig
from engine.llm.graph_kv import GraphSlot, GraphSlots
from engine.llm.hf_models import load_model, pick_device, pick_dtype, resolve_source
from engine.llm.kv_cache import CacheEntry, PrefixCacheStore, common_prefix_len, crop_cache
from engine.llm.random_model import speakable_bias
from engine.llm.streaming import (
    END_OF_TURN_TOKENS,
    PREWARM_MIN_TOKENS,
    CallStats,
    PieceChannel,
    WorkerStream,
    run_stoppable,
    sample_reply,
)
from engine.llm.turn_end import split_at_last_message
from engine.llm.workers import warmed_pool
from engine.progress import Progress, silent_progress

log = logging.getLogger(__name__)

PREFILL_CHUNK = 256  # tokens per prefill forward: the stop flag is checked between chunks
SAMPLING_OPTIONS = frozenset(
    {"max_new_tokens", "temperature", "top_p", "repetition_penalty", "no_repeat_ngram_size"}
)


def cpu_threads(setting: int) -> int:
    """Torch threads for CPU inference (process-wide: the frame renderer shares them)."""
    if setting > 0:
        return setting
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else cores // 2


def quantize_int8(model: Any) -> Any:
    """Dynamic int8 quantization of the decoder layers' linear layers (~20% off a CPU decode step).

    The output head stays float: quantizing it too halved the step time but changed SmolLM2-135M's
    answers (it stopped naming Paris as the capital of France).
    """
    import warnings

    from torch import nn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the eager quantization API's migration notice
        body = getattr(model, "model", None)
        if isinstance(body, nn.Module):
            model.model = torch.ao.quantization.quantize_dynamic(body, {nn.Linear}, dtype=torch.qint8)
            return model
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


class TransformersLLM:
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
        self.stop_ids = self._stop_ids()
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

    # ---- helpers ------------------------------------------------------------------------

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

    def _stop_ids(self) -> list[int]:
        ids: set[int] = set()
        for source in (
            self.tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list | tuple):
                ids.update(int(i) for i in source)
        unk = self.tokenizer.unk_token_id
        for token in END_OF_TURN_TOKENS:
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != unk:
                ids.add(tid)
        return sorted(ids)

    def _graph_slots(self, progress: Progress) -> GraphSlots | None:
        """The CUDA-graph decode path's KV caches (built and captured now), or None (CPU, switched off, or
        a model GraphDecoder does not support: then the DynamicCache path runs on the GPU too)."""
        cfg = self.config
        if self.device != "cuda" or not cfg.cuda_graphs:
            return None
        max_len = min(cfg.cuda_graph_max_len, self.max_positions)
        start = time.perf_counter()
        try:
            slots = GraphSlots(self.model, max_len=max_len, slots=cfg.cuda_graph_slots)
        except NotImplementedError as e:
            log.warning("llm: no CUDA-graph decode for this model (%s): eager decode with a DynamicCache", e)
            return None
        with torch.inference_mode():
            slots.warm(self.stop_ids[0] if self.stop_ids else 0)
        progress(
            "llm",
            f"CUDA-graph decode captured ({cfg.cuda_graph_slots} caches, "
            f"{time.perf_counter() - start:.1f} s)",
        )
        return slots

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
        stats.reused_tokens = keep
        self.reused_tokens += keep
        logits: torch.Tensor | None = None
        for start in range(keep, len(ids), PREFILL_CHUNK):
            if stop.is_set():
                stats.stop_reason = "cancelled"
                return None
            chunk = ids[start : start + PREFILL_CHUNK]
            logits = forward(chunk, start)
            fed.extend(chunk)
            stats.prefilled_tokens += len(chunk)
            self.prefilled_tokens += len(chunk)
        assert logits is not None
        stats.prefill_queued_s = time.perf_counter() - stats.started
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

    # ---- the CUDA-graph path ------------------------------------------------------------

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
        dec = slot.decoder
        # Reuse the longest common prefix; at least one token must be fed to get logits.
        logits = self._slot_prefill(slot, ids, len(ids) - 1, chan.stop, stats)
        if logits is None:
            return

        def feed(token: int) -> torch.Tensor:
            out = dec.step(token)  # the graph's static buffer: copy before the next step
            slot.ids.append(token)
            return out.to(torch.float32, copy=True)

        self._sample(logits.to(torch.float32, copy=True), feed, chan, stats)
