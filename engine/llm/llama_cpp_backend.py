"""The CPU language model: llama.cpp (``llama-cpp-python``) on the GGUF itself, no dequantizing.

The bundled SmolLM2-135M is a Q4_1 GGUF: transformers must dequantize it to float32 and reads 540 MB of
weights per token (~8 tokens/s on two cores); llama.cpp runs the quantized tensors directly (~118
tokens/s there, docs/PERFORMANCE.md). Loading is an mmap of the file (0.1 s warm).

**Conversations and their caches.** One model, several llama.cpp *contexts* (``llm.contexts``), each a KV
cache of its own (:class:`_Context`). A conversation (``cache_key``) keeps the context it was given, so its
evaluated prefix (system prompt, history, the host's words so far) survives between turns and each call
prefills only what follows the longest common token prefix. A new conversation takes a free context or the
one used least recently; contexts in use are never taken, so sessions do not evict each other on every turn
while there are at least as many contexts as talking sessions. The weights are shared: a context costs its
KV cache (~47 MB for SmolLM2 at 2,048 positions) and its compute buffers.

**Compute threads.** Every call (a reply's stream, a prewarm, an end-of-turn score, the warm-up at load)
runs on one of the model's own long-lived threads (:func:`compute_threads` of them: one on a 2-core machine),
through :mod:`engine.llm.streaming` (a stop flag checked before every forward pass: closing the stream stops
it within one token). llama.cpp's prefill runs an OpenMP team started by the calling thread, and libgomp
spins its workers only while it manages no more threads than there are cores: a second thread's team alive
beside the first (a prewarm thread's and a reply thread's) makes every barrier a sleep, and a 6-token batch
took 62 ms on two threads instead of 29 (docs/PERFORMANCE.md, "one OpenMP team"). Sampling is
:mod:`engine.llm.sampling` (the same controls as the transformers path).

This module uses ``llama_cpp._internals`` (``LlamaContext``, ``LlamaBatch``) for the contexts beyond the
first: ``Llama`` has one context per model, and loading the model once per context would repeat its load
and buffers. The version is pinned in ``pyproject.toml``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.cores import usable_cores
from engine.llm.base import ChatMessage, LLMError
from engine.llm.config import LLMConfig
from engine.llm.hf_models import ModelSource, resolve_source
from engine.llm.kv_cache import Shift, common_prefix_len, shifted_runs
from engine.llm.sampling import Sampler
from engine.llm.streaming import (
    END_OF_TURN_TOKENS,
    PREWARM_MIN_TOKENS,
    CallStats,
    PieceChannel,
    WorkerStream,
    prefill_in_chunks,
    run_stoppable,
    sample_reply,
)
from engine.llm.turn_end import split_at_last_message
from engine.native import model_executor
from engine.progress import Progress, silent_progress

log = logging.getLogger(__name__)

PREFILL_CHUNK = 64  # tokens per prefill forward: the stop flag is checked between chunks
# A batch this short runs on the decode threads, not the prefill team: a reply's own prefill (the host's last
# words and the chat marker, ~8 tokens) took 134 ms to its first piece on a team of two beside the video and
# 95 ms on one thread (docs/PERFORMANCE.md, "one OpenMP team"); at 5-16 tokens a team of two gains little
# even on an idle machine, and on a busy one each barrier waits for a descheduled thread.
SMALL_BATCH = 16
# After this many reply tokens (the first chunk's words and some) the decode thread lowers its own priority:
# the rest of the reply has a whole chunk of audio to arrive in, while the first chunk's synthesis and the
# video frames are due now (on two cores they all want the same CPU).
URGENT_TOKENS = 10
BACKGROUND_NICE = 10
# A run of cached tokens this long that the new prompt holds again, earlier (the history dropped from its
# front), is moved into place instead of prefilled again (shorter runs cost less to prefill than to find).
SHIFT_MIN_RUN = 16
TAKE_WAIT_S = 10.0  # a call waits this long for a context when every one is busy
SAMPLING_OPTIONS = frozenset(
    {"max_new_tokens", "temperature", "top_p", "repetition_penalty", "no_repeat_ngram_size"}
)


def decode_threads(setting: int) -> int:
    """llama.cpp's decode threads: the setting, or half the cores (1 to 4). A decode step is memory-bound
    and the reply's first chunk is being synthesized meanwhile: on 2 cores Piper took 85 ms for 4 words beside
    a 1-thread decode and 100 ms beside a 2-thread one (scripts/tts_first_chunk.py, docs/PERFORMANCE.md),
    and the renderer and the encoder need that core too."""
    return setting if setting > 0 else max(1, min(4, usable_cores() // 2))


def prefill_threads(setting: int) -> int:
    """llama.cpp's prefill (prompt batch) threads: the setting, or all cores up to 4 (short bursts that the
    first token waits for)."""
    return setting if setting > 0 else max(1, min(4, usable_cores()))


def compute_threads(contexts: int, threads: int, prefill: int) -> int:
    """The model's compute threads: as many calls at once as there are contexts, but no more OpenMP teams
    than the cores hold (one on 2 cores with 2 prefill threads; see the module's docstring)."""
    return max(1, min(contexts, usable_cores() // max(1, threads, prefill)))


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU reports Intel AMX (Sapphire Rapids and later): llama.cpp then repacks weights into
    its AMX buffer, whose matrix product segfaulted here on the bundled Q4_1 model's first decode."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_int8" in line.split()
    except OSError:
        pass
    return False


def use_weight_repack(setting: str) -> bool:
    """``llm.weight_repack``: llama.cpp's extra buffer types (AMX, repacked CPU tiles) on or off."""
    if setting == "auto":
        return not cpu_has_amx()
    return setting == "on"


_DEFAULTS_LOCK = threading.Lock()  # llama_model_default_params is swapped while one model loads


def load_llama(llama_cpp: Any, repack: bool, **kwargs: Any) -> Any:
    """``llama_cpp.Llama(**kwargs)`` with ``use_extra_bufts = repack``: llama-cpp-python's constructor has
    no argument for it and reads llama.cpp's defaults, so those are swapped while it loads."""
    module = llama_cpp.llama_cpp
    with _DEFAULTS_LOCK:
        original = module.llama_model_default_params

        def defaults() -> Any:
            params = original()
            params.use_extra_bufts = repack
            return params

        module.llama_model_default_params = defaults
        try:
            return llama_cpp.Llama(**kwargs)
        finally:
            module.llama_model_default_params = original


def gguf_path(source: ModelSource) -> Path:
    if source.kind != "gguf" or source.gguf_file is None:
        raise LLMError(
            f"llm.backend 'llama.cpp' runs GGUF files; llm.model {source.label or source.location!r} is "
            f"not one (use a .gguf path, or llm.backend = 'transformers')"
        )
    return Path(source.location) / source.gguf_file


def check_gguf(path: Path) -> None:
    """Refuse a missing, unreadable or non-GGUF file with a message naming it (before llama.cpp, whose
    own failure is a bare 'Failed to load model')."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise LLMError(f"llm.model: cannot read {path}: {e.strerror or e}") from e
    if magic != b"GGUF":
        raise LLMError(f"llm.model: {path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")


@dataclass
class _Context:
    """One llama.cpp context: a KV cache holding ``ids`` (positions 0..len-1), used by one call at a time."""

    ctx: Any  # llama_cpp._internals.LlamaContext
    batch: Any  # llama_cpp._internals.LlamaBatch
    n_vocab: int
    n_batch: int
    threads: int = 1  # decode threads (and a short batch's, SMALL_BATCH)
    prefill_threads: int = 1  # a longer batch's
    ids: list[int] = field(default_factory=list)
    key: str | None = None  # the conversation it holds
    busy: bool = False
    last_used: float = 0.0
    _batch_threads: int = 0  # what llama.cpp was last told to run a batch on

    def crop(self, keep: int) -> None:
        """Keep the first ``keep`` cached positions."""
        if keep < len(self.ids):
            self.ctx.kv_cache_seq_rm(-1, keep, -1)
            del self.ids[keep:]

    def shift(self, runs: list[Shift], end: int) -> None:
        """Move each run to its new positions (llama.cpp re-rotates the moved keys at the next decode), drop
        what lay between and after them: the cache then holds the new prompt's first ``end`` tokens, the
        last run ending there. (A moved run's keys and values were computed after what was dropped: close to,
        not exactly, a fresh prefill's; llama.cpp's server reuses its cache the same way.)"""
        for run in runs:
            self.ctx.kv_cache_seq_rm(-1, run.dst, run.src)
            self.ctx.kv_cache_seq_shift(0, run.src, run.src + run.length, run.dst - run.src)
            self.ids[run.dst : run.dst + run.length] = self.ids[run.src : run.src + run.length]
        self.ctx.kv_cache_seq_rm(-1, end, -1)
        del self.ids[end:]

    def feed(self, tokens: list[int]) -> np.ndarray:
        """Evaluate ``tokens`` after what is cached; the last position's logits (float32 [V], a copy)."""
        for i in range(0, len(tokens), self.n_batch):
            part = tokens[i : i + self.n_batch]
            batch_threads = self.threads if len(part) <= SMALL_BATCH else self.prefill_threads
            if batch_threads != self._batch_threads:
                self.ctx.set_n_threads(self.threads, batch_threads)
                self._batch_threads = batch_threads
            self.batch.set_batch(batch=part, n_past=len(self.ids), logits_all=False)
            try:
                self.ctx.decode(self.batch)
            except RuntimeError as e:
                self.ctx.kv_cache_seq_rm(-1, len(self.ids), -1)  # nothing half-fed stays cached
                raise LLMError(f"llama.cpp decode failed: {e}") from e
            self.ids.extend(part)
        logits = np.ctypeslib.as_array(self.ctx.get_logits_ith(-1), shape=(self.n_vocab,))
        return np.array(logits, dtype=np.float32)


class LlamaCppLLM:
    """:class:`~engine.llm.base.LLM` on llama.cpp. Construction loads the model (blocking, ~0.1-3 s): call it
    from an executor."""

    def __init__(self, config: LLMConfig | None = None, progress: Progress = silent_progress) -> None:
        try:
            import llama_cpp
            from llama_cpp import _internals
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as e:
            raise LLMError(
                "llm.backend 'llama.cpp' needs the llama-cpp-python package (built by `make install`; "
                f"or set llm.backend = 'transformers'): {e}"
            ) from e
        self.config = config or LLMConfig()  # type: ignore[call-arg]
        self.source = resolve_source(self.config.model)
        self.path = gguf_path(self.source)
        check_gguf(self.path)
        self.threads = decode_threads(self.config.threads)
        self.prefill_threads = prefill_threads(self.config.prefill_threads)
        self.weight_repack = use_weight_repack(self.config.weight_repack)
        progress("llm", f"loading {self.path.name} with llama.cpp ({self.threads} threads)", 0.0)
        start = time.perf_counter()
        try:
            self.llama = load_llama(
                llama_cpp,
                self.weight_repack,
                model_path=str(self.path),
                n_ctx=self.config.context_size,
                n_batch=PREFILL_CHUNK,
                n_ubatch=PREFILL_CHUNK,
                n_threads=self.threads,
                n_threads_batch=self.prefill_threads,
                use_mmap=True,
                logits_all=False,
                verbose=False,
            )
        except (ValueError, RuntimeError) as e:
            raise LLMError(f"llm.model: llama.cpp could not load {self.path}: {e}") from e
        self.load_s = time.perf_counter() - start
        self._internals = _internals
        # every call runs here (model threads, not the loop's executor, where aiortc encodes): a reply's
        # stream, a prewarm, a score; no more OpenMP teams than the cores hold (see the module's docstring)
        self.compute_threads = compute_threads(self.config.contexts, self.threads, self.prefill_threads)
        self._jobs = model_executor(self.compute_threads, "llm")
        self._renice = True  # lower a reply's priority after its first words (off where it cannot be undone)
        memory = self.llama._ctx.memory  # None for a model without a KV cache
        self.can_shift = memory is not None and bool(llama_cpp.llama_memory_can_shift(memory))
        self.n_ctx = self.llama.n_ctx()
        self.n_vocab = self.llama.n_vocab()
        meta = self.llama.metadata
        template = meta.get("tokenizer.chat_template")
        if not template:
            raise LLMError(f"llm.model: {self.path} carries no chat template (tokenizer.chat_template)")
        eos = self.llama.token_eos()
        bos = self.llama.token_bos()
        piece = functools.partial(self.llama._model.token_get_text)
        eos_text = piece(eos) if eos >= 0 else ""
        bos_text = piece(bos) if bos >= 0 else ""
        self._render = {
            prompt: Jinja2ChatFormatter(template, eos_text, bos_text, add_generation_prompt=prompt)
            for prompt in (True, False)
        }
        self.stop_ids = self._stop_ids(eos)
        self._lock = threading.Condition()
        first = _Context(
            self.llama._ctx,
            self.llama._batch,
            self.n_vocab,
            PREFILL_CHUNK,
            self.threads,
            self.prefill_threads,
            last_used=time.monotonic(),
        )
        self._contexts: list[_Context] = [first]
        self._growing = 0  # contexts being created (outside the lock)
        # Cumulative counters over all calls (the worker threads update them).
        self.prefilled_tokens = 0
        self.reused_tokens = 0
        self.generated_tokens = 0
        self.last_call = CallStats()
        self._jobs.submit(self._warm).result()
        progress("llm", f"llama.cpp ready ({self.load_s:.1f} s)", 1.0)

    def _warm(self) -> None:
        """The first decode allocates; a batch longer than SMALL_BATCH also starts this thread's OpenMP
        team."""
        with self._context_for(None, threading.Event()) as c:
            assert c is not None
            c.feed([self.stop_ids[0] if self.stop_ids else 0] * (SMALL_BATCH + 1))
            c.crop(0)

    # ---- the LLM protocol ---------------------------------------------------------------

    def stream(self, messages: list[ChatMessage], cache_key: str | None = None) -> WorkerStream:
        return WorkerStream(functools.partial(self._worker, list(messages), cache_key), pool=self._jobs)

    def stream_scored(
        self, messages: list[ChatMessage], cache_key: str | None, scored: Callable[[float], None]
    ) -> WorkerStream:
        work = functools.partial(self._worker, list(messages), cache_key, scored=scored)
        return WorkerStream(work, pool=self._jobs)

    async def prewarm(self, messages: list[ChatMessage], cache_key: str | None = None) -> int:
        return int(
            await run_stoppable(self._jobs, functools.partial(self._prewarm, list(messages), cache_key))
        )

    async def end_of_turn_probability(
        self, messages: list[ChatMessage], cache_key: str | None = None
    ) -> float:
        job = functools.partial(self._end_of_turn, list(messages), cache_key)
        return float(await run_stoppable(self._jobs, job))

    def describe(self) -> str:
        return (
            f"llama.cpp {self.source.label or self.path.name} (cpu, GGUF {self.path.name}, {self.threads} "
            f"decode / {self.prefill_threads} prefill threads, {self.config.contexts} conversation contexts "
            f"of {self.n_ctx} positions)"
        )

    def with_options(self, **changes: Any) -> LlamaCppLLM:
        """A sibling sharing this one's model and contexts, with other sampling settings."""
        import copy

        bad = set(changes) - SAMPLING_OPTIONS
        if bad:
            raise ValueError(f"with_options only changes {sorted(SAMPLING_OPTIONS)}, not {sorted(bad)}")
        sibling = copy.copy(self)
        sibling.config = LLMConfig.model_validate({**self.config.model_dump(), **changes})
        return sibling

    def close(self) -> None:
        with self._lock:
            extra, self._contexts = self._contexts[1:], self._contexts[:1]
        for c in extra:
            c.ctx.close()
            c.batch.close()
        self._jobs.shutdown(wait=False, cancel_futures=True)
        self.llama.close()

    # ---- prompt ---------------------------------------------------------------------------

    def encode_chat(self, messages: list[ChatMessage], generation_prompt: bool = True) -> list[int]:
        """The prompt token ids: the GGUF's chat template, the assistant turn opened (or, without
        ``generation_prompt``, just the messages: the start of a later prompt)."""
        return self.tokenize(self._rendered(messages, generation_prompt))

    def _rendered(self, messages: list[ChatMessage], generation_prompt: bool) -> str:
        return str(self._render[generation_prompt](messages=messages).prompt)  # type: ignore[arg-type]

    def tokenize(self, text: str) -> list[int]:
        return list(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def _decode(self, ids: list[int]) -> str:
        return self.llama.detokenize(ids).decode("utf-8", errors="replace")

    def _stop_ids(self, eos: int) -> list[int]:
        ids = {eos} if eos >= 0 else set()
        for token in END_OF_TURN_TOKENS:
            found = self.tokenize(token)
            if len(found) == 1:
                ids.add(found[0])
        return sorted(ids)

    # ---- contexts -------------------------------------------------------------------------

    def _new_context(self) -> _Context:
        params = self.llama.context_params
        ctx = self._internals.LlamaContext(model=self.llama._model, params=params, verbose=False)
        batch = self._internals.LlamaBatch(n_tokens=PREFILL_CHUNK, embd=0, n_seq_max=1, verbose=False)
        return _Context(ctx, batch, self.n_vocab, PREFILL_CHUNK, self.threads, self.prefill_threads)

    def _take(self, key: str | None, stop: threading.Event) -> _Context | None:
        """The context for ``key``: its own, else a free one (new while under ``llm.contexts``, else the
        least recently used); waits while every one is busy. None once ``stop`` is set or after
        ``TAKE_WAIT_S``."""
        deadline = time.monotonic() + TAKE_WAIT_S  # a worker thread's own timeout, not media time
        with self._lock:
            while True:
                mine = next((c for c in self._contexts if key is not None and c.key == key), None)
                if mine is not None and not mine.busy:
                    mine.busy = True
                    return mine
                if mine is None:
                    free = [c for c in self._contexts if not c.busy]
                    room = len(self._contexts) + self._growing < self.config.contexts
                    if room and not any(c.key is None for c in free):
                        self._growing += 1  # reserved: two calls growing at once stay within the limit
                        break
                    if free:
                        c = min(free, key=lambda c: (c.key is not None, c.last_used))
                        c.busy, c.key = True, key
                        c.crop(0)
                        return c
                if stop.is_set() or time.monotonic() >= deadline:
                    return None
                self._lock.wait(0.05)
        try:  # only a reserved growth gets here; outside the lock: a context allocates its buffers
            c = self._new_context()
        except BaseException:
            with self._lock:
                self._growing -= 1
            raise
        c.busy, c.key = True, key
        with self._lock:
            self._growing -= 1
            self._contexts.append(c)
        return c

    def _put_back(self, c: _Context, valid: bool) -> None:
        with self._lock:
            if not valid:
                c.crop(0)
            c.busy = False
            c.last_used = time.monotonic()  # LRU order of idle contexts: process time, deliberately
            self._lock.notify_all()

    def _context_for(self, key: str | None, stop: threading.Event, wait: bool = True) -> _Held:
        return _Held(self, key, stop, wait)

    def cached_tokens(self, key: str) -> int:
        """Tokens of conversation ``key`` held evaluated now (0 if it has no context)."""
        with self._lock:
            return next((len(c.ids) for c in self._contexts if c.key == key), 0)

    def _prefill(
        self, c: _Context, ids: list[int], limit: int, stop: threading.Event, stats: CallStats
    ) -> np.ndarray | None:
        """Crop ``c`` to its longest common prefix with ``ids`` (at most ``limit``), feed the rest in
        chunks; the last logits, or None once stopped (what was fed stays cached)."""
        keep = min(common_prefix_len(c.ids, ids), limit)
        runs = shifted_runs(c.ids, ids[:limit], keep, SHIFT_MIN_RUN) if self.can_shift else []
        if runs:
            last = runs[-1]
            c.shift(runs, last.dst + last.length)
            stats.shifted_tokens = sum(r.length for r in runs)
            keep = len(c.ids)
        else:
            c.crop(keep)
        return prefill_in_chunks(
            ids, keep, lambda piece, _start: c.feed(piece), PREFILL_CHUNK, stop, stats, self
        )

    def _check_length(self, prompt_tokens: int) -> None:
        if prompt_tokens + self.config.max_new_tokens > self.n_ctx:
            raise LLMError(
                f"prompt of {prompt_tokens} tokens + max_new_tokens {self.config.max_new_tokens} exceeds the "
                f"llama.cpp context of {self.n_ctx} positions (llm.context_size): shorten the history"
            )

    # ---- the worker threads ---------------------------------------------------------------

    def _worker(
        self,
        messages: list[ChatMessage],
        key: str | None,
        chan: PieceChannel,
        scored: Callable[[float], None] | None = None,
    ) -> None:
        stats = chan.stats
        self.last_call = stats
        error: BaseException | None = None
        nice = _thread_nice()
        try:
            ids = self.encode_chat(messages)
            stats.encoded_s = time.perf_counter() - stats.started
            stats.prompt_tokens = len(ids)
            self._check_length(len(ids))
            head = self._scored_head(messages) if scored is not None else None
            with self._context_for(key, chan.stop) as c:
                if c is None:
                    stats.stop_reason = "cancelled"
                elif head is None or self._score_head(c, head, chan, stats, scored):
                    head_reused = stats.reused_tokens
                    # Reuse the longest common prefix; at least one token must be fed to get logits.
                    logits = self._prefill(c, ids, len(ids) - 1, chan.stop, stats)
                    if head is not None:  # the call's reuse is what the head's prefill found
                        self.reused_tokens -= stats.reused_tokens
                        stats.reused_tokens = head_reused
                    if logits is not None:
                        self._sample(c, logits, chan, stats)
        except LLMError as e:
            error = e
        except Exception as e:
            log.exception("llm generation failed")
            error = LLMError(f"llama.cpp generation failed: {e!r}")
        finally:
            stats.elapsed_s = time.perf_counter() - stats.started
            if error is not None:
                stats.stop_reason = "error"
            if nice is not None and _thread_nice() != nice and not _set_thread_nice(nice):
                self._renice = False  # this thread stays lowered; later replies keep their priority
        chan.finish(error)

    def _sample(self, c: _Context, logits: np.ndarray, chan: PieceChannel, stats: CallStats) -> None:
        cfg = self.config
        sampler = Sampler(cfg.temperature, cfg.top_p, cfg.repetition_penalty, cfg.no_repeat_ngram_size)

        def counted(step: int) -> None:
            self.generated_tokens += 1
            if step == URGENT_TOKENS and self._renice:
                _lower_priority()

        def feed(token: int) -> np.ndarray:
            return c.feed([token])

        sample_reply(
            logits, sampler.pick, feed, self._decode, self.stop_ids, cfg.max_new_tokens, chan, stats, counted
        )

    def _prewarm(self, messages: list[ChatMessage], key: str | None, stop: threading.Event) -> int:
        if key is None:
            return 0
        ids = self.encode_chat(messages, generation_prompt=False)
        if not ids:
            return 0
        self._check_length(len(ids))
        stats = CallStats()
        with self._context_for(key, stop, wait=False) as c:
            if c is None:
                return 0
            if len(ids) - common_prefix_len(c.ids, ids) >= PREWARM_MIN_TOKENS:
                self._prefill(c, ids, len(ids), stop, stats)
        return stats.prefilled_tokens

    def _scored_head(self, messages: list[ChatMessage]) -> tuple[list[int], int]:
        """The tokens up to the end of the last message's text, and the end-of-turn marker's token."""
        if not messages:
            raise ValueError("no messages to score")
        rendered = self._rendered(messages, generation_prompt=False)
        head, tail = split_at_last_message(rendered, messages[-1]["content"])
        ids = self.tokenize(head)
        marker = self.tokenize(tail)
        if not ids or not marker:
            raise LLMError("the chat template leaves no end-of-turn marker after the message")
        self._check_length(len(ids))
        return ids, marker[0]

    def _score_head(
        self,
        c: _Context,
        head: tuple[list[int], int],
        chan: PieceChannel,
        stats: CallStats,
        scored: Callable[[float], None] | None,
    ) -> bool:
        """A scored stream's first part: prefill up to the end of the host's words, hand their end-of-turn
        probability to the loop, and go on (True) unless stopped; the rest of the prefill then feeds only
        the marker and the reply's opening."""
        ids, marker = head
        logits = self._prefill(c, ids, len(ids) - 1, chan.stop, stats)
        if logits is None or scored is None:
            return False
        try:
            chan.loop.call_soon_threadsafe(scored, _probability(logits, marker))
        except RuntimeError:  # the loop is closed: nobody is listening
            return False
        return True

    def _end_of_turn(self, messages: list[ChatMessage], key: str | None, stop: threading.Event) -> float:
        """P(end-of-turn marker) right after the last message's text, with everything before it in the
        conversation's context (which keeps it: the reply then prefills only the marker and its opening)."""
        ids, marker = self._scored_head(messages)
        stats = CallStats()
        with self._context_for(key, stop) as c:
            if c is None:
                raise TimeoutError("no llama.cpp context free to score the end of turn")
            logits = self._prefill(c, ids, len(ids) - 1, stop, stats)
            if logits is None:
                return 0.0
        return _probability(logits, marker)


def _probability(logits: np.ndarray, token: int) -> float:
    x = np.exp(logits - logits.max())
    return float(x[token] / x.sum())


def _thread_nice() -> int | None:
    """This thread's nice (Linux: per thread), or None where that cannot be read."""
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


def _set_thread_nice(nice: int) -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        return True
    except (AttributeError, OSError):  # raising a priority back needs a privilege the engine may not have
        return False


def _lower_priority() -> None:
    """Raise this compute thread's niceness for the rest of the reply (the worker puts it back after the
    call; where it cannot, the model stops doing this). Lowering a priority needs no privilege."""
    nice = _thread_nice()
    if nice is not None and nice < BACKGROUND_NICE:
        _set_thread_nice(BACKGROUND_NICE)


class _Held:
    """``with llm._context_for(key, stop) as c``: the conversation's context for the block (None if none
    could be had), put back after it (emptied if the block raised: a half-fed cache is no use)."""

    def __init__(self, llm: LlamaCppLLM, key: str | None, stop: threading.Event, wait: bool = True) -> None:
        self._llm, self._key, self._stop, self._wait = llm, key, stop, wait
        self._c: _Context | None = None

    def __enter__(self) -> _Context | None:
        stop = self._stop if self._wait else _SET
        self._c = self._llm._take(self._key, stop)
        return self._c

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self._c is not None:
            self._llm._put_back(self._c, valid=kind is None)


_SET = threading.Event()  # a stop already set: take a context only if it is free now
_SET.set()
