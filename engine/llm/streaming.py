"""What every in-process backend shares: a worker thread generating, the event loop reading.

Generation runs in a worker thread and hands text pieces to the event loop through a bounded
:class:`PieceChannel` (a credit semaphore: the worker blocks when the consumer falls behind). Closing the
stream, cancelling its consumer, or dropping it sets a stop flag the worker checks before every forward
pass, so it stops within one decode step (or one prefill chunk). :class:`CallStats` is what one call did.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Executor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from engine.native import as_model_thread

L = TypeVar("L")  # a backend's logits row (torch tensor, numpy array)

WORKER_JOIN_S = 5.0  # aclose waits this long at most (a stop lands within one forward pass)
CHANNEL_PIECES = 32  # text pieces the worker may run ahead of the consumer
# A shorter missing tail is left to the next call: a separate forward pass costs a whole step where a few
# more tokens in the next prefill cost a few ms each.
PREWARM_MIN_TOKENS = 16
# End-of-turn markers of the common chat templates (ChatML, Llama 3, Phi, Gemma, GPT-2 style).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass
class CallStats:
    """What one ``stream`` call did (filled in by the worker as it goes)."""

    prompt_tokens: int = 0
    reused_tokens: int = 0
    shifted_tokens: int = 0  # of the reused: moved in the cache to where the new prompt has them
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float | None = None  # worker start to the first text piece handed over
    # Where the time to the first piece went (seconds from the worker's start): the prompt tokenized, the
    # prefill's work queued (on CUDA it runs asynchronously), the first token sampled (a host sync).
    encoded_s: float | None = None
    prefill_queued_s: float | None = None
    first_token_s: float | None = None
    elapsed_s: float = 0.0
    stop_reason: str = ""  # "eos" | "max_new_tokens" | "cancelled" | "error"
    reply_ids: list[int] = field(default_factory=list, repr=False)
    started: float = field(default_factory=time.perf_counter, repr=False)


class PrefillTotals(Protocol):
    """A model's running counts across calls (what its describe/metrics report)."""

    reused_tokens: int
    prefilled_tokens: int


Logits = TypeVar("Logits")


def prefill_in_chunks(
    ids: list[int],
    keep: int,
    feed: Callable[[list[int], int], Logits],
    chunk: int,
    stop: threading.Event,
    stats: CallStats,
    totals: PrefillTotals,
) -> Logits | None:
    """Feed ``ids[keep:]`` (the first ``keep`` are already evaluated) ``chunk`` tokens at a time through
    ``feed(piece, start)``, checking ``stop`` between pieces; counts go to this call's ``stats`` and the
    model's ``totals``. The last logits, or None once stopped (what was fed stays fed)."""
    stats.reused_tokens = keep
    totals.reused_tokens += keep
    logits: Logits | None = None
    for start in range(keep, len(ids), chunk):
        if stop.is_set():
            stats.stop_reason = "cancelled"
            return None
        piece = ids[start : start + chunk]
        logits = feed(piece, start)
        stats.prefilled_tokens += len(piece)
        totals.prefilled_tokens += len(piece)
    stats.prefill_queued_s = time.perf_counter() - stats.started
    return logits


@dataclass(frozen=True)
class _End:
    error: BaseException | None = None


class PieceChannel:
    """Worker thread → event loop hand-off, bounded by credits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pieces: int = CHANNEL_PIECES) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[str | _End] = asyncio.Queue()
        self.credits = threading.Semaphore(pieces)
        self.stop = threading.Event()
        self.stats = CallStats()  # this call's, filled in by its worker (never another session's)

    def put(self, piece: str) -> bool:
        """Hand one piece over, blocking while the consumer is behind; False once stopped."""
        while not self.stop.is_set():
            if self.credits.acquire(timeout=0.05):
                return self._post(piece)
        return False

    def finish(self, error: BaseException | None = None) -> None:
        self._post(_End(error))

    def _post(self, item: str | _End) -> bool:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
            return True
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.stop.set()
            return False


Work = Callable[[PieceChannel], None]


class WorkerStream:
    """The async iterator an in-process backend's ``stream`` returns: ``work(channel)`` runs on the first
    ``__anext__``, in ``pool`` (long-lived warmed threads) or else in a thread of its own, and must end by
    calling ``channel.finish``."""

    def __init__(self, work: Work, pool: Executor | None = None, name: str = "llm-decode") -> None:
        self._work = work
        self._pool = pool
        self._name = name
        self._chan: PieceChannel | None = None
        self.thread: threading.Thread | None = None
        self._done = False
        self._ended = False  # the worker's end marker was received

    def __aiter__(self) -> WorkerStream:
        return self

    @property
    def stats(self) -> CallStats | None:
        """What this call did (None before it started). The model's ``last_call`` is whichever call
        started last, another session's when several talk at once."""
        return self._chan.stats if self._chan is not None else None

    async def __anext__(self) -> str:
        if self._done:
            raise StopAsyncIteration
        if self._chan is None:
            self._chan = PieceChannel(asyncio.get_running_loop())
            if self._pool is not None:
                self._pool.submit(self._work, self._chan)
            else:
                self.thread = threading.Thread(
                    target=_as_model_thread(self._work), args=(self._chan,), name=self._name, daemon=True
                )
                self.thread.start()
        try:
            item = await self._chan.queue.get()
        except asyncio.CancelledError:
            self._chan.stop.set()
            self._done = True
            raise
        if isinstance(item, _End):
            self._done = self._ended = True
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        self._chan.credits.release()
        return item

    async def aclose(self) -> None:
        """Stop generation and wait (up to ``WORKER_JOIN_S``) until the worker has let go of the model
        and put its KV cache back: the next turn on this conversation can reuse it at once."""
        self._done = True
        if self._chan is None or self._ended:
            return
        self._chan.stop.set()
        with suppress(TimeoutError):
            async with asyncio.timeout(WORKER_JOIN_S):
                while not isinstance(await self._chan.queue.get(), _End):
                    pass
                self._ended = True

    def __del__(self) -> None:
        if self._chan is not None:
            self._chan.stop.set()


class Detokenizer:
    """Decode the running reply and hand out only the new suffix (keeps multi-byte and spaces intact)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self._decode(self.ids).lstrip()
        if text.endswith("\ufffd") or len(text) <= len(self.emitted):
            return ""  # an incomplete UTF-8 sequence, or nothing new yet
        piece = text[len(self.emitted) :] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece


def sample_reply(
    logits: L,
    pick: Callable[[L, list[int]], int],
    feed: Callable[[int], L],
    decode: Callable[[list[int]], str],
    stop_ids: Collection[int],
    max_new_tokens: int,
    chan: PieceChannel,
    stats: CallStats,
    on_token: Callable[[int], None] | None = None,
) -> None:
    """The decode loop every in-process backend runs: ``pick(logits, reply)`` samples the next token,
    ``feed(token)`` puts it into the cache and returns the next logits; text pieces go to ``chan`` until an
    end token, ``max_new_tokens`` or a stop. ``on_token(step)`` runs after each token is counted."""
    detok = Detokenizer(decode)
    reply: list[int] = []
    stats.stop_reason = "max_new_tokens"
    for step in range(max_new_tokens):
        token = pick(logits, reply)
        if stats.first_token_s is None:
            stats.first_token_s = time.perf_counter() - stats.started
        reply.append(token)
        stats.reply_ids.append(token)
        stats.generated_tokens += 1
        if on_token is not None:
            on_token(step)
        if token in stop_ids:
            stats.stop_reason = "eos"
            break
        piece = detok.push(token)
        if piece:
            if stats.ttft_s is None:
                stats.ttft_s = time.perf_counter() - stats.started
            if not chan.put(piece):
                stats.stop_reason = "cancelled"
                break
        if step == max_new_tokens - 1:
            break
        if chan.stop.is_set():
            stats.stop_reason = "cancelled"
            break
        logits = feed(token)


def _as_model_thread(work: Work) -> Work:
    def run(chan: PieceChannel) -> None:
        as_model_thread()  # its own thread: a model thread, and llama.cpp's OpenMP team it starts too
        work(chan)

    return run


async def run_stoppable(pool: Executor | None, job: Callable[[threading.Event], Any]) -> Any:
    """Run ``job(stop)`` in ``pool`` (None: the loop's default executor); cancelling the caller sets
    ``stop`` (the job stops at its next check and cleans up) without waiting for it."""
    stop = threading.Event()
    future = asyncio.get_running_loop().run_in_executor(pool, job, stop)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        stop.set()
        raise
