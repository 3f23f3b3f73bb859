"""One reply: prompt → LLM tokens → chunks → guard → TTS → playout.

The LLM side and the TTS side run as two tasks joined by a small queue, so the
first clause is synthesized while the model is still writing the rest. The whole
reply is one cancellable task: barge-in cancels it, and the session flushes the
playout buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from engine.clock import Clock
from engine.events import (
    Event,
    ExpressionCommand,
    GestureCommand,
    ReplyChunk,
    ReplyToken,
    SpeechAudio,
    UserTurn,
)
from engine.llm.base import LLM, ScoredStreamer
from engine.llm.prompt import PromptProvider
from engine.session.timings import TurnTimings
from engine.text.chunker import ReplyChunker
from engine.transport.playout import PlayoutBuffer
from engine.tts.base import TTS
from engine.tts.config import TTSConfig

Publish = Callable[[Event], None]


class StageFailed(Exception):
    """A stage of the reply failed; ``stage`` names it (prompt, llm, guard, tts)."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.stage = stage
        self.cause = cause


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    try:
        yield
    except (asyncio.CancelledError, StageFailed):
        raise
    except Exception as e:
        raise StageFailed(name, e) from e


@dataclass
class ReplyContext:
    llm: LLM
    tts: TTS
    tts_config: TTSConfig
    prompt: PromptProvider
    playout: PlayoutBuffer
    clock: Clock
    publish: Publish  # to the bus (an early reply's events are held until the turn confirms it)
    cache_key: str
    background: Callable[[Coroutine[Any, Any, Any], str], object]  # an owned task outliving the reply
    gate: asyncio.Event | None = None  # an early reply's audio waits for this (the turn's confirmation)
    scored: Callable[[float], None] | None = None  # an early reply's: the host's words judged by its prefill


@dataclass
class ReplyResult:
    queued: int = 0  # chunks handed to the playout buffer
    written: str = ""  # everything the model wrote, tags included


async def run_reply(turn: UserTurn, ctx: ReplyContext, timings: TurnTimings, result: ReplyResult) -> None:
    """Generate, synthesize and queue the reply to ``turn``, filling ``result`` as it goes (so a
    cancelled reply still says what it had written and queued)."""
    clock = ctx.clock
    prompt_t = clock.now()
    with stage("prompt"):
        messages = await ctx.prompt.build_prompt(turn)
    prompt_ms = (clock.now() - prompt_t) * 1000  # the persona's recall and the prompt's assembly
    chunks: asyncio.Queue[ReplyChunk | None] = asyncio.Queue(maxsize=8)

    async def write() -> None:
        chunker = ReplyChunker.from_config(ctx.tts_config)
        index = 0

        async def emit(text: str, expressions: tuple[str, ...], gestures: tuple[str, ...]) -> None:
            nonlocal index
            with stage("guard"):
                guarded = ctx.prompt.guard(text)
            if not guarded or not guarded.strip():
                # Nothing to say, but the face still reacts now.
                for name in expressions:
                    ctx.publish(ExpressionCommand(t=clock.now(), name=name, source="llm"))
                for name in gestures:
                    ctx.publish(GestureCommand(t=clock.now(), name=name, source="llm"))
                return
            timings.mark("first_chunk_text", clock.now())
            # what the audience will hear, as the guard let it through (never the model's raw text)
            ctx.publish(ReplyToken(t=clock.now(), turn_id=turn.turn_id, text=guarded))
            await chunks.put(
                ReplyChunk(
                    t=clock.now(),
                    turn_id=turn.turn_id,
                    index=index,
                    text=guarded,
                    expressions=expressions,
                    gestures=gestures,
                )
            )
            index += 1

        with stage("llm"):
            if ctx.scored is not None and isinstance(ctx.llm, ScoredStreamer):
                stream = ctx.llm.stream_scored(messages, ctx.cache_key, ctx.scored)
            else:
                stream = ctx.llm.stream(messages, cache_key=ctx.cache_key)
        try:
            async for piece in _llm_pieces(stream):
                timings.mark("llm_first_token", clock.now())
                result.written += piece
                for c in chunker.feed(piece):
                    await emit(c.text, tuple(c.expressions), tuple(c.gestures))
            for c in chunker.flush():
                await emit(c.text, tuple(c.expressions), tuple(c.gestures))
            timings.llm = _llm_stats(stream, prompt_ms)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    # Barge-in: do not hold the next turn while the model finishes its current step.
                    ctx.background(aclose(), f"reply{turn.turn_id}:llm-close")
                else:
                    await aclose()
        await chunks.put(None)

    async def speak() -> None:
        while (chunk := await chunks.get()) is not None:
            with stage("tts"):
                synth = await ctx.tts.synthesize(chunk.text, first=chunk.index == 0)
            if len(synth.pcm) == 0:
                continue
            timings.mark("tts_first_audio", clock.now())
            if ctx.gate is not None:
                await ctx.gate.wait()
            await ctx.playout.wait_for_room()
            ctx.playout.enqueue(
                SpeechAudio(
                    t=clock.now(),
                    turn_id=turn.turn_id,
                    index=chunk.index,
                    text=chunk.text,
                    pcm=synth.pcm,
                    sample_rate=synth.sample_rate,
                    phonemes=synth.phonemes,
                    words=synth.words,
                    expressions=chunk.expressions,
                    gestures=chunk.gestures,
                )
            )
            result.queued += 1

    async with asyncio.TaskGroup() as tg:
        tg.create_task(write(), name=f"reply{turn.turn_id}:llm")
        tg.create_task(speak(), name=f"reply{turn.turn_id}:tts")


def _llm_stats(stream: object, prompt_ms: float) -> dict[str, float] | None:
    """What the in-process model did for this reply (the prompt's build time, tokens reused / prefilled,
    time to the first piece, decode speed), from the reply's own stream (an OpenAI-compatible server's has
    none)."""
    call = getattr(stream, "stats", None)
    if call is None or not getattr(call, "generated_tokens", 0):
        return None
    decode_s = call.elapsed_s - (call.ttft_s or 0.0)
    return {
        "prompt_ms": round(prompt_ms, 1),
        "prompt_tokens": call.prompt_tokens,
        "reused_tokens": call.reused_tokens,
        "shifted_tokens": getattr(call, "shifted_tokens", 0),
        "prefilled_tokens": call.prefilled_tokens,
        "generated_tokens": call.generated_tokens,
        "ttft_ms": round((call.ttft_s or 0.0) * 1000, 1),
        "tokens_per_s": round(max(0, call.generated_tokens - 1) / decode_s, 2) if decode_s > 0 else 0.0,
    }


async def _llm_pieces(stream: AsyncIterator[str]) -> AsyncIterator[str]:
    """The model's pieces, with a failure inside the model reported as the llm stage's."""
    while True:
        with stage("llm"):
            try:
                piece = await anext(stream)
            except StopAsyncIteration:
                return
        yield piece
