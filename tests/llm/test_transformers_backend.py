"""The in-process backend against the real bundled SmolLM2 (no mocks)."""

from __future__ import annotations

import asyncio
import gc
import time
from contextlib import suppress

import pytest

from engine.llm.base import LLMError
from engine.llm.streaming import CHANNEL_PIECES, Detokenizer
from engine.llm.transformers_backend import TransformersLLM
from tests.llm.conftest import chat, collect, first_pieces

pytestmark = pytest.mark.integration


def trigrams(ids: list[int]) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + 3]) for i in range(len(ids) - 2)]


async def test_streams_coherent_text(smollm: TransformersLLM) -> None:
    messages = chat("What is the capital of France?", system="You are a helpful assistant. Answer briefly.")
    pieces = await collect(smollm.stream(messages))
    text = "".join(pieces)
    assert "Paris" in text, text
    assert len(pieces) > 1  # streamed, not one blob
    stats = smollm.last_call
    assert stats.stop_reason in ("eos", "max_new_tokens")
    assert stats.ttft_s is not None and stats.prompt_tokens == stats.prefilled_tokens
    assert "transformers SmolLM2 (cpu, float32" in smollm.describe()


async def test_second_turn_prefills_only_the_tail_and_matches_a_cold_run(smollm: TransformersLLM) -> None:
    llm = smollm.with_options(max_new_tokens=10)
    first = chat("Hi Aiko! What are we doing on stream today?")
    reply = "".join(await collect(llm.stream(first, cache_key="conv")))
    s1 = llm.last_call
    assert s1.reused_tokens == 0 and s1.prefilled_tokens == s1.prompt_tokens

    second = chat("Hi Aiko! What are we doing on stream today?", reply, "Nice. Which game will you play?")
    before = llm.prefilled_tokens
    warm = await collect(llm.stream(second, cache_key="conv"))
    s2 = llm.last_call
    # Everything of the first call (prompt and the reply as re-tokenized) was kept.
    assert s2.reused_tokens >= s1.prompt_tokens + 1
    assert s2.prefilled_tokens == s2.prompt_tokens - s2.reused_tokens
    assert llm.prefilled_tokens - before == s2.prefilled_tokens < s2.prompt_tokens // 2

    cold = await collect(llm.stream(second))  # no cache key: a full prefill
    s3 = llm.last_call
    assert s3.reused_tokens == 0 and s3.prefilled_tokens == s3.prompt_tokens
    assert s2.reply_ids == s3.reply_ids and "".join(warm) == "".join(cold)

    # The same prompt again: only the last prompt token is fed (logits must come from somewhere).
    again = await collect(llm.stream(second, cache_key="conv"))
    assert llm.last_call.prefilled_tokens == 1 and "".join(again) == "".join(cold)


async def test_prewarm_puts_the_next_prompts_start_in_the_cache(smollm: TransformersLLM) -> None:
    """Between turns the history is trimmed (the old prefix no longer matches); prewarming the new start
    leaves only the next user message to prefill, and the reply is the same as without it."""
    llm = smollm.with_options(max_new_tokens=8)
    older = chat("Hi Aiko!", "Hello, chat!", "What did you eat today?", "Pancakes with berries!")
    await collect(llm.stream(older + [{"role": "user", "content": "Nice."}], cache_key="conv"))
    trimmed = chat("What did you eat today?", "Pancakes with berries!")  # the first exchange dropped
    n = await llm.prewarm(trimmed, cache_key="conv")
    assert n > 0
    nxt = trimmed + [{"role": "user", "content": "Which game will you play next?"}]
    warm = await collect(llm.stream(nxt, cache_key="conv"))
    s = llm.last_call
    assert s.reused_tokens >= len(llm.encode_chat(trimmed, generation_prompt=False)) - 1
    assert s.prefilled_tokens < 20, s.prefilled_tokens  # the new message and the assistant header
    cold = await collect(llm.stream(nxt))
    assert "".join(warm) == "".join(cold)
    # nothing to do when the start is already cached (or only a few tokens are missing); no key, nothing kept
    assert await llm.prewarm(trimmed, cache_key="conv") == 0
    assert await llm.prewarm(nxt, cache_key="conv") == 0  # the call above cached all of it but a token or two
    assert await llm.prewarm(trimmed) == 0


@pytest.mark.parametrize("how", ["aclose", "cancel", "drop"])
async def test_closing_or_cancelling_stops_the_worker(smollm: TransformersLLM, how: str) -> None:
    llm = smollm.with_options(max_new_tokens=400, no_repeat_ngram_size=0)
    stream = llm.stream(chat("Tell me a very long story about a dragon."))
    if how == "cancel":
        got: list[str] = []
        three = asyncio.Event()

        async def consume() -> None:
            async for piece in stream:
                got.append(piece)
                if len(got) == 3:
                    three.set()

        task = asyncio.get_running_loop().create_task(consume())
        await three.wait()
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
    else:
        await first_pieces(stream, 3)
    thread = stream.thread
    assert thread is not None
    start = time.perf_counter()
    if how == "aclose":
        await stream.aclose()
    elif how == "drop":
        del stream
        gc.collect()
    await asyncio.to_thread(thread.join, 5.0)
    assert not thread.is_alive(), "the worker did not stop"
    stopped_in = time.perf_counter() - start
    assert stopped_in < 2.0  # one decode step, with generous room for a contended CPU
    produced = llm.generated_tokens
    await asyncio.sleep(0.2)
    assert llm.generated_tokens == produced
    assert llm.last_call.stop_reason == "cancelled"
    assert produced <= 3 + CHANNEL_PIECES + 2


async def test_no_repeat_ngram_and_repetition_penalty(smollm: TransformersLLM) -> None:
    messages = chat(
        "Write the word 'la' thirty times, separated by spaces.", system="You are a helpful assistant."
    )
    plain = smollm.with_options(max_new_tokens=16, repetition_penalty=1.0, no_repeat_ngram_size=0)
    await collect(plain.stream(messages))
    plain_ids = plain.last_call.reply_ids
    assert len(set(trigrams(plain_ids))) < len(trigrams(plain_ids)), "control: the model should repeat itself"

    guarded = smollm.with_options(max_new_tokens=16, repetition_penalty=1.0, no_repeat_ngram_size=3)
    await collect(guarded.stream(messages))
    ids = guarded.last_call.reply_ids
    assert len(ids) > 3 and len(set(trigrams(ids))) == len(trigrams(ids))

    penalized = smollm.with_options(max_new_tokens=16, repetition_penalty=2.0, no_repeat_ngram_size=0)
    await collect(penalized.stream(messages))
    pen_ids = penalized.last_call.reply_ids
    assert len(set(pen_ids)) / len(pen_ids) > len(set(plain_ids)) / len(plain_ids)


async def test_sampling_and_prompt_limit(smollm: TransformersLLM) -> None:
    sampled = smollm.with_options(temperature=0.8, top_p=0.9, max_new_tokens=6)
    assert "".join(await collect(sampled.stream(chat("Say hello!")))).strip()

    too_long = smollm.with_options(max_new_tokens=4096)
    with pytest.raises(LLMError, match="exceeds the model's"):
        await collect(too_long.stream(chat("hello " * 5000)))
    with pytest.raises(ValueError, match="only changes"):
        smollm.with_options(model="other")


def test_detokenizer_keeps_multibyte_text_and_spaces(smollm: TransformersLLM) -> None:
    text = "Café ☕ こんにちは, naïve fan! 🎤🎶  two  spaces"
    ids = smollm.tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = Detokenizer(lambda i: smollm.tokenizer.decode(i, skip_special_tokens=True))
    pieces = [detok.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


async def test_after_a_barge_in_the_next_turn_reuses_the_heard_prefix(smollm: TransformersLLM) -> None:
    llm = smollm.with_options(max_new_tokens=400)
    first = chat("Tell me about your favourite song.")
    stream = llm.stream(first, cache_key="barge")
    heard = await first_pieces(stream, 4)
    await stream.aclose()  # returns once the worker has put the cache back
    assert llm.caches.cached_tokens("barge") > 0

    second = chat("Tell me about your favourite song.", "".join(heard), "Sorry, go on!")
    stream = llm.stream(second, cache_key="barge")
    await first_pieces(stream, 1)
    await stream.aclose()
    s = llm.last_call
    assert s.reused_tokens >= len(llm.encode_chat(first)) + 1
    assert s.prefilled_tokens == s.prompt_tokens - s.reused_tokens
