"""The llama.cpp backend on the bundled SmolLM2 GGUF itself (no dequantizing): streaming, stopping within a
token, prefix reuse across turns, separate contexts per conversation, the end-of-turn score, bad files."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from engine.llm.base import LLMError, ScoredStreamer, TurnEndScorer
from engine.llm.config import LLMConfig
from engine.llm.factory import load_llm, resolve_backend
from engine.llm.llama_cpp_backend import LlamaCppLLM, cpu_has_amx, use_weight_repack
from engine.llm.sampling import Sampler, banned_by_ngrams
from engine.llm.streaming import CHANNEL_PIECES, CallStats
from tests.llm.conftest import chat, collect, first_pieces

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def llama() -> LlamaCppLLM:
    return LlamaCppLLM(LLMConfig(backend="llama.cpp", temperature=0.0, max_new_tokens=24, contexts=3))  # type: ignore[call-arg]


COMMON = frozenset(
    [
        "the",
        "a",
        "an",
        "is",
        "of",
        "to",
        "and",
        "in",
        "it",
        "i",
        "you",
        "that",
        "capital",
        "paris",
        "france",
        "city",
    ]
)


def test_auto_picks_llama_cpp_for_the_bundled_gguf_on_the_cpu() -> None:
    assert resolve_backend(LLMConfig(device="cpu")) == "llama.cpp"  # type: ignore[call-arg]
    assert resolve_backend(LLMConfig(device="cpu", model="random:qwen2.5-tiny")) == "transformers"  # type: ignore[call-arg]
    assert resolve_backend(LLMConfig(backend="transformers")) == "transformers"  # type: ignore[call-arg]


async def test_streams_a_reply(llama: LlamaCppLLM) -> None:
    pieces = await collect(llama.stream(chat("What is the capital of France?"), cache_key="capital"))
    text = "".join(pieces)
    # The real model, not noise: words of English (what it says varies with the CPU's SIMD path: "Paris"
    # on one machine, "Bonjour, I'm a little unsure..." on another, both greedy).
    words = text.split()
    assert len(pieces) > 1 and len(words) >= 5, text
    assert sum(c.isalpha() or c.isspace() or c in ".,!?'-" for c in text) >= 0.9 * len(text), text
    assert sum(w.strip(".,!?'").lower() in COMMON for w in words) >= 2, text
    assert llama.last_call.stop_reason in ("eos", "max_new_tokens")
    assert llama.last_call.generated_tokens >= len(pieces)


async def test_closing_the_stream_stops_within_a_token(llama: LlamaCppLLM) -> None:
    long = llama.with_options(max_new_tokens=400, repetition_penalty=1.0, no_repeat_ngram_size=0)
    counting = chat("Count from 1 to 300, separated by commas.", system="You are a helpful assistant.")
    stream = long.stream(counting, cache_key="count")
    await first_pieces(stream, 3)
    await asyncio.sleep(0.3)  # the worker runs ahead of us, up to its channel's credits, and waits
    start = time.perf_counter()
    await stream.aclose()
    assert time.perf_counter() - start < 2.0
    call = long.last_call
    produced = call.generated_tokens
    assert call.stop_reason == "cancelled"
    await asyncio.sleep(0.3)
    assert call.generated_tokens == produced, "the worker went on after the close"
    assert produced <= 3 + CHANNEL_PIECES + 2


async def test_the_second_turn_prefills_only_its_tail(llama: LlamaCppLLM) -> None:
    first = chat("Hi! I'm Mika and I love cats.")
    reply = "".join(await collect(llama.stream(first, cache_key="mika")))
    one = llama.last_call
    assert one.prompt_tokens > 30
    second = chat("Hi! I'm Mika and I love cats.", reply, "What do I love?")
    await collect(llama.stream(second, cache_key="mika"))
    two = llama.last_call
    assert two.reused_tokens >= one.prompt_tokens, (one, two)
    assert two.prefilled_tokens == two.prompt_tokens - two.reused_tokens
    assert two.prefilled_tokens < 25, two  # the new user message and the template's markers


async def test_history_dropped_from_the_front_moves_the_rest_instead_of_prefilling_it(
    llama: LlamaCppLLM,
) -> None:
    """Consolidation drops the oldest exchanges: what follows them is moved in the cache (keys re-rotated),
    not evaluated again, and the model reads it as it reads a fresh prefill of the same prompt."""
    import threading

    import numpy as np

    exchanges = [
        ("What is your favorite color?", "I love pink, it is so cute!"),
        ("How are you feeling today?", "I'm super happy, thanks for asking!"),
        ("Can you tell me a fun fact?", "Octopuses have three hearts!"),
        ("What game should we play next?", "Let's play Mario Kart!"),
        ("Do you like music?", "Yes, I sing every day!"),
    ]
    flat = [text for pair in exchanges for text in pair]
    await collect(llama.stream(chat(*flat, "Where would you like to travel?"), cache_key="shift"))
    later = chat(*flat[4:], "What did you eat for breakfast?")  # the two oldest exchanges are gone
    await collect(llama.stream(later, cache_key="shift"))
    call = llama.last_call
    kept = len(llama.encode_chat(chat(*flat[4:]), generation_prompt=False)) - len(llama.encode_chat(chat()))
    assert call.shifted_tokens >= kept - 2, call  # the three kept exchanges, less their boundary tokens
    assert call.prefilled_tokens < 25, call  # the new question and the template's markers

    def next_token_probabilities(key: str, fresh: bool) -> np.ndarray:
        ids = llama.encode_chat(later)
        with llama._context_for(key, threading.Event()) as c:
            assert c is not None
            if fresh:
                c.crop(0)
            logits = llama._prefill(c, ids, len(ids) - 1, threading.Event(), CallStats())
            assert logits is not None
        p = np.exp(logits - logits.max())
        return p / p.sum()

    moved, fresh = next_token_probabilities("shift", False), next_token_probabilities("fresh", True)
    kl = float(np.sum(fresh * (np.log(fresh + 1e-12) - np.log(moved + 1e-12))))
    print(f"KL(fresh || moved) = {kl:.4f}")
    # measured 0.016-0.023 (the dropped exchanges' trace in the moved keys); a wrongly placed cache reads as
    # another text entirely. For scale: with and without the dropped exchanges differ by 0.02-0.15.
    assert kl < 0.06, kl


async def test_conversations_keep_their_own_contexts(llama: LlamaCppLLM) -> None:
    a = chat("Let's talk about volcanoes and the fire under them.")
    b = chat("Can you teach me three words of Japanese today?")
    await collect(llama.stream(a, cache_key="A"))
    a_len = llama.last_call.prompt_tokens
    await collect(llama.stream(b, cache_key="B"))
    await collect(llama.stream(a, cache_key="A"))
    again = llama.last_call
    assert again.reused_tokens == a_len - 1, again  # all of A's prompt was still evaluated
    assert llama.cached_tokens("B") > 0


async def test_each_stream_reports_its_own_call_while_another_runs(llama: LlamaCppLLM) -> None:
    """Two sessions' replies at once: each stream's ``stats`` are its own call's (the model's ``last_call``
    is whichever started last: the reply timings had read another session's, up to '16e9 tok/s')."""
    short = chat("Say hi.")
    long = chat("Tell me about the history of the violin, its makers and its greatest players, please.")
    s1, s2 = llama.stream(short, cache_key="S1"), llama.stream(long, cache_key="S2")
    await asyncio.gather(collect(s1), collect(s2))
    a, b = s1.stats, s2.stats  # type: ignore[attr-defined]
    assert a is not None and b is not None and a is not b
    assert a.prompt_tokens < b.prompt_tokens
    for call in (a, b):
        assert call.generated_tokens > 0 and call.elapsed_s >= (call.ttft_s or 0.0) > 0


async def test_prewarm_then_the_reply_prefills_only_the_new_message(llama: LlamaCppLLM) -> None:
    history = chat("My favourite food is ramen with lots of garlic.", "Ramen is the best!")
    n = await llama.prewarm(history, cache_key="warm")
    assert n >= 16
    await collect(llama.stream([*history, {"role": "user", "content": "What do I like?"}], cache_key="warm"))
    assert llama.last_call.reused_tokens >= n
    assert llama.last_call.prefilled_tokens < 15


async def test_end_of_turn_probability_separates_finished_from_trailing_words(llama: LlamaCppLLM) -> None:
    assert isinstance(llama, TurnEndScorer)
    finished = ["What is your favorite color?", "Can you tell me a fun fact?"]
    trailing = ["So the thing about my brother is", "I was thinking that maybe we could"]
    p_done = [await llama.end_of_turn_probability(chat(t), cache_key="eot") for t in finished]
    p_open = [await llama.end_of_turn_probability(chat(t), cache_key="eot") for t in trailing]
    assert min(p_done) > 0.05 > max(p_open), (p_done, p_open)


async def test_the_reply_goes_on_from_the_scored_words(llama: LlamaCppLLM) -> None:
    messages = chat("Do you like music?")
    await llama.end_of_turn_probability(messages, cache_key="scored")
    held = llama.cached_tokens("scored")
    await collect(llama.stream(messages, cache_key="scored"))
    call = llama.last_call
    assert call.reused_tokens == held, (held, call)
    assert call.prefilled_tokens <= 6  # the end-of-turn marker and the assistant's opening


async def scored_stream(
    llama: LlamaCppLLM, messages: list[dict[str, str]], key: str
) -> tuple[list[str], list[float], list[str]]:
    """A scored stream's events in order ("scored" or "piece"), the scores it handed over, its pieces."""
    order: list[str] = []
    scores: list[float] = []
    pieces: list[str] = []

    def scored(p: float) -> None:
        order.append("scored")
        scores.append(p)

    async for piece in llama.stream_scored(messages, key, scored):
        order.append("piece")
        pieces.append(piece)
    return order, scores, pieces


async def test_a_scored_stream_judges_the_words_in_the_reply_s_own_prefill(llama: LlamaCppLLM) -> None:
    """The early reply's prefill hands over the end-of-turn probability before its first piece, the same
    number the scoring call gives, and the reply is the one the two calls (score, then stream) give."""
    assert isinstance(llama, ScoredStreamer)
    for text in ("What is your favorite season?", "So the thing about my brother is"):
        messages = chat(text)
        p_alone = await llama.end_of_turn_probability(messages, cache_key="alone")
        two_calls = "".join(await collect(llama.stream(messages, cache_key="alone")))

        order, scores, pieces = await scored_stream(llama, messages, "together")
        call = llama.last_call
        assert order[0] == "scored" and order.count("scored") == 1, order
        assert abs(scores[0] - p_alone) < 1e-3 * max(p_alone, 1e-6) + 1e-6, (scores, p_alone)
        assert "".join(pieces) == two_calls
        # one prefill of the prompt, each token counted once (fed, or found in the cache)
        assert call.reused_tokens + call.prefilled_tokens == call.prompt_tokens, call
        assert call.prefilled_tokens > 6, call  # it did score its own words, not the other call's


def test_a_missing_gguf_is_refused_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.gguf"
    with pytest.raises(LLMError, match="nothing"):
        load_llm(LLMConfig(backend="llama.cpp", model=str(missing)))  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "content", [b"not a model at all" * 64, b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 20]
)
def test_a_corrupt_gguf_is_refused_naming_the_file(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "broken-model.gguf"
    bad.write_bytes(content)
    with pytest.raises(LLMError, match="broken-model.gguf"):
        LlamaCppLLM(LLMConfig(backend="llama.cpp", model=str(bad)))  # type: ignore[call-arg]


def test_weight_repack_is_off_by_default_on_amx_cpus(tmp_path: Path) -> None:
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n\n")
    zen = tmp_path / "zen"
    zen.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\n")
    assert cpu_has_amx(str(amx)) and not cpu_has_amx(str(zen))
    assert not cpu_has_amx(str(tmp_path / "missing"))
    assert use_weight_repack("auto") is not cpu_has_amx()
    assert use_weight_repack("on") and not use_weight_repack("off")


@pytest.mark.parametrize("setting", ["on", "off"])
async def test_the_model_loads_with_the_chosen_weight_repack_and_decodes(setting: str) -> None:
    import llama_cpp

    if setting == "on" and cpu_has_amx():
        pytest.skip("llama.cpp's AMX weight buffer crashes on this CPU (the reason 'auto' turns it off)")
    defaults = llama_cpp.llama_cpp.llama_model_default_params
    llm = LlamaCppLLM(LLMConfig(backend="llama.cpp", weight_repack=setting, max_new_tokens=4))  # type: ignore[call-arg]
    assert llm.llama.model_params.use_extra_bufts is (setting == "on")
    assert llama_cpp.llama_cpp.llama_model_default_params is defaults  # swapped back after the load
    assert await llm.end_of_turn_probability(chat("What is your favorite color?")) > 0.0  # a real decode


def test_sampler_controls() -> None:
    assert banned_by_ngrams([1, 2, 3, 1, 2], 3) == {3}
    assert banned_by_ngrams([1, 2], 3) == set()
    import numpy as np

    logits = np.array([0.0, 5.0, 4.9, -1.0], dtype=np.float32)
    greedy = Sampler(0.0, 1.0, 1.0, 0)
    assert greedy.pick(logits, []) == 1
    assert Sampler(0.0, 1.0, 2.0, 0).pick(logits, [1]) == 2  # the repeated token is penalised
    assert Sampler(0.0, 1.0, 1.0, 2).pick(logits, [1, 1]) == 2  # (1, 1) would repeat
    nucleus = Sampler(1.0, 0.5, 1.0, 0, seed=1)
    assert {nucleus.pick(logits, []) for _ in range(50)} == {1}  # token 1 alone holds half the mass
    assert logits[1] == 5.0  # the caller's row is not modified


@pytest.mark.unit
def test_no_more_compute_threads_than_openmp_teams_the_cores_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.llm import llama_cpp_backend

    monkeypatch.setattr(llama_cpp_backend, "usable_cores", lambda: 2)
    assert llama_cpp_backend.compute_threads(contexts=4, threads=1, prefill=2) == 1
    monkeypatch.setattr(llama_cpp_backend, "usable_cores", lambda: 16)
    assert llama_cpp_backend.compute_threads(contexts=4, threads=2, prefill=4) == 4
    assert llama_cpp_backend.compute_threads(contexts=2, threads=2, prefill=4) == 2
    monkeypatch.setattr(llama_cpp_backend, "usable_cores", lambda: 1)
    assert llama_cpp_backend.compute_threads(contexts=4, threads=1, prefill=1) == 1


async def test_every_call_runs_on_the_model_s_compute_thread_and_leaves_its_priority_as_it_was() -> None:
    """One OpenMP team for llama.cpp's prefill: the prewarm, the score and every reply run on the model's
    compute thread (a reply's own thread beside it made each prefill barrier a sleep, docs/PERFORMANCE.md),
    and a reply that lowered that thread's priority after its first words puts it back."""
    import os
    import threading

    seen: list[tuple[str, int, int]] = []

    class Watched(LlamaCppLLM):
        def _prefill(self, c, ids, limit, stop, stats):  # type: ignore[no-untyped-def]
            tid = threading.get_native_id()
            seen.append((threading.current_thread().name, tid, os.getpriority(os.PRIO_PROCESS, tid)))
            return super()._prefill(c, ids, limit, stop, stats)

    llm = Watched(LLMConfig(backend="llama.cpp", max_new_tokens=20, contexts=2, prefill_threads=2, threads=1))  # type: ignore[call-arg]
    # greedy, and asked for a list: a sampled reply ended after 4 tokens in one CI run
    long = llm.with_options(temperature=0.0, repetition_penalty=1.0, no_repeat_ngram_size=0)
    try:
        history = chat("Tell me a long story about a dragon, please.")
        await llm.prewarm(history, cache_key="s")
        for key in ("s", "t"):
            await collect(long.stream(history + chat("Now count from one to thirty, please."), cache_key=key))
            assert long.last_call.generated_tokens > 10  # past the point where the reply lowers its priority
        await llm.end_of_turn_probability(chat("What is your name?"), cache_key="s")
        names = {name for name, _, _ in seen}
        tids = {tid for _, tid, _ in seen}
        assert len(seen) >= 4 and all(n.startswith("llm") for n in names), seen
        if llm.compute_threads == 1:
            assert len(tids) == 1, seen
        # each call found the thread's priority as it was
        assert len({nice for _, _, nice in seen}) == 1, seen
    finally:
        llm.close()
