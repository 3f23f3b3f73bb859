"""Random-weight shapes and the CUDA-graph decode path of the transformers backend, on the CPU.

The graph path's slots hold :class:`GraphDecoder` objects; on the CPU a GraphDecoder runs its step eagerly
(no capture), so the backend's graph-path logic (prefix reuse by content, slot hand-out, cancellation, the
same sampling) is checked here against the DynamicCache path on the same weights. tests/gpu repeats it with
captured graphs.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from engine.llm.base import LLMError
from engine.llm.config import LLMConfig
from engine.llm.factory import describe
from engine.llm.graph_kv import GraphSlots
from engine.llm.hf_models import resolve_source
from engine.llm.random_model import speakable_ids
from engine.llm.transformers_backend import TransformersLLM
from engine.text.chunker import ReplyChunker
from engine.tts.config import TTSConfig
from tests.llm.conftest import chat, collect, first_pieces
from tests.llm.word_tokenizer import build_word_tokenizer

WORDS = re.compile(r"[A-Za-z]+|[.,!?]")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_tokenizer(tmp_path_factory.mktemp("tok") / "words")


def tiny(tokenizer_dir: Path, **over: object) -> TransformersLLM:
    config = LLMConfig.model_validate(
        {
            "model": "random:qwen2.5-tiny",
            "tokenizer": str(tokenizer_dir),
            "device": "cpu",
            "temperature": 0.0,
            "max_new_tokens": 16,
            **over,
        }
    )
    return TransformersLLM(config)


def with_graph_slots(
    llm: TransformersLLM, slots: int = 2, max_len: int = 256, batched: bool = False
) -> TransformersLLM:
    """A sibling of ``llm`` (same weights) decoding through GraphDecoder slots (eager on the CPU), the rows
    of one BatchedDecoder with ``batched``."""
    g = llm.with_options()
    g.graph_slots = GraphSlots(g.model, max_len=max_len, slots=slots, batched=batched)
    return g


def test_random_sources_and_errors(tokenizer_dir: Path) -> None:
    src = resolve_source("random:qwen2.5-1.5b")
    assert (src.kind, src.location) == ("random", "1.5B")
    with pytest.raises(LLMError, match="unknown random shape"):
        resolve_source("random:gpt-9")
    assert "random weights, benchmarks only" in describe(LLMConfig(model="random:qwen2.5-1.5b"))  # type: ignore[call-arg]
    with pytest.raises(LLMError, match="llm.tokenizer"):
        TransformersLLM(LLMConfig(model="random:qwen2.5-tiny", device="cpu"))  # type: ignore[call-arg]


def test_speakable_ids_are_words_below_the_model_vocabulary(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = speakable_ids(tok, 512, keep=[3])
    assert 3 in ids and max(ids) < 512 and len(tok) == 600
    assert not {0, 1, 2} & set(ids)  # <|endoftext|>, <unk>, <|im_start|>
    texts = [tok.decode([i], skip_special_tokens=True) for i in ids if i != 3]
    assert all(WORDS.fullmatch(t) for t in texts)


async def test_random_shape_feeds_ids_beyond_its_vocabulary_as_0(tokenizer_dir: Path) -> None:
    llm = tiny(tokenizer_dir)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert tok.convert_tokens_to_ids("dolo") >= 512  # a word of the tokenizer the tiny model has no row for
    ids = llm.encode_chat(chat("dolo baba"))
    assert max(ids) < 512 and 0 in ids
    assert await collect(llm.stream(chat("dolo"))) is not None
    s = llm.last_call
    assert s.encoded_s is not None and s.prefill_queued_s is not None and s.first_token_s is not None
    assert s.encoded_s <= s.prefill_queued_s <= s.first_token_s


async def test_random_shape_streams_a_speakable_bounded_reply(tokenizer_dir: Path) -> None:
    import torch

    torch.manual_seed(0)  # sampling: a stop id could come first by chance
    llm = tiny(tokenizer_dir, temperature=0.8, max_new_tokens=12)
    assert "random:qwen2.5-tiny (cpu, float32" in llm.describe()
    for _ in range(3):
        text = "".join(await collect(llm.stream(chat("Hello there, how are you?"))))
        s = llm.last_call
        assert s.generated_tokens <= 12 and s.stop_reason in ("eos", "max_new_tokens")
        assert text and all(re.fullmatch(r"[.,!?]*[A-Za-z]*[.,!?]*", w) for w in text.split()), text
    # Long enough replies reach the voice in chunks, the first cut after first_chunk_max_words words.
    long = tiny(tokenizer_dir, temperature=0.8, max_new_tokens=40)
    long.stop_ids = []  # a stop id may be sampled by chance: take the full length here
    chunker = ReplyChunker.from_config(TTSConfig())
    chunks = [
        c.text for piece in await collect(long.stream(chat("Tell me a story."))) for c in chunker.feed(piece)
    ]
    chunks += [c.text for c in chunker.flush()]
    assert len(chunks) >= 2, chunks
    assert len(chunks[0].split()) <= TTSConfig().first_chunk_max_words
    assert all(any(ch.isalpha() for ch in c) for c in chunks)


@pytest.mark.parametrize("batched", [False, True])
async def test_graph_path_matches_the_dynamic_cache_path(tokenizer_dir: Path, batched: bool) -> None:
    eager = tiny(tokenizer_dir, max_new_tokens=10)
    graph = with_graph_slots(eager, batched=batched)
    first = chat("Hi Aiko! What are we doing on stream today?")
    cold = "".join(await collect(eager.stream(first)))
    got = "".join(await collect(graph.stream(first, cache_key="a")))
    assert graph.last_call.reply_ids == eager.last_call.reply_ids and got == cold
    s1 = graph.last_call
    assert s1.reused_tokens == 0 and s1.prefilled_tokens == s1.prompt_tokens

    second = chat("Hi Aiko! What are we doing on stream today?", got, "Nice. Which game?")
    cold2 = "".join(await collect(eager.stream(second)))
    warm2 = "".join(await collect(graph.stream(second, cache_key="a")))
    s2 = graph.last_call
    assert warm2 == cold2 and s2.reply_ids == eager.last_call.reply_ids
    assert s2.reused_tokens >= s1.prompt_tokens + 1  # the first prompt and (re-tokenized) reply were kept
    assert s2.prefilled_tokens == s2.prompt_tokens - s2.reused_tokens

    # The same prompt again: only its last token is fed.
    again = "".join(await collect(graph.stream(second)))
    assert graph.last_call.prefilled_tokens == 1 and again == cold2
    assert graph.graph_slots is not None and graph.graph_slots.free() == 2


async def test_batched_slots_decode_concurrent_replies_together(tokenizer_dir: Path) -> None:
    """Three conversations at once through one batched cache: each gets what it gets alone on the eager
    path, and their tokens were stepped together (more rows than steps)."""
    eager = tiny(tokenizer_dir, max_new_tokens=24, no_repeat_ngram_size=0)
    eager.stop_ids = []  # full-length replies: they overlap for certain
    graph = with_graph_slots(eager, slots=3, batched=True)
    graph.stop_ids = []
    prompts = [chat("Hi Aiko!"), chat("What game are we playing today, and why that one?"), chat("Sing!")]
    alone = ["".join(await collect(eager.stream(p))) for p in prompts]
    together = await asyncio.gather(*(collect(graph.stream(p)) for p in prompts))
    assert ["".join(t) for t in together] == alone
    slots = graph.graph_slots
    assert slots is not None and slots.shared is not None and slots.free() == 3
    assert slots.shared.rows_stepped == 3 * 23  # every token but the first (from the prefill) stepped
    assert slots.shared.mean_batch() > 1.0


def test_shared_step_waits_for_a_silent_row_only_its_gather_window(tokenizer_dir: Path) -> None:
    import time

    import torch

    from engine.llm.cuda_graph_decode import BatchedDecoder, GraphDecoder
    from engine.llm.shared_decode import SharedStep

    llm = tiny(tokenizer_dir)
    shared = SharedStep(BatchedDecoder(llm.model, max_len=8, rows=2), gather_s=0.2)
    rows = shared.decoder.rows
    for r in (0, 1):
        rows[r].prefill(torch.tensor([5, 6, 7]), 0)
    alone = GraphDecoder(llm.model, max_len=8)
    alone.prefill(torch.tensor([5, 6, 7]), 0)
    shared.step(0, 9)  # row 0 joins, then goes quiet (its consumer behind, say)
    t0 = time.monotonic()
    logits = shared.step(1, 9).clone()  # row 1 waits for row 0's token, but only the gather window
    waited = time.monotonic() - t0
    assert 0.15 <= waited < 2.0
    assert torch.allclose(logits, alone.step(9), atol=1e-5)
    shared.leave(0)  # row 0's reply ended: row 1 steps at once
    t0 = time.monotonic()
    shared.step(1, 10)
    assert time.monotonic() - t0 < 0.15
    assert shared.steps == 3 and shared.rows_stepped == 3
    for _ in range(3):
        shared.step(1, 11)
    with pytest.raises(RuntimeError, match="full"):
        shared.step(1, 11)  # 8 positions: 3 prompt + 5 stepped


async def test_graph_path_cancels_and_waits_for_a_free_slot(tokenizer_dir: Path) -> None:
    graph = with_graph_slots(tiny(tokenizer_dir, max_new_tokens=200, no_repeat_ngram_size=0), slots=1)
    graph.stop_ids = []
    slots = graph.graph_slots
    assert slots is not None
    stream = graph.stream(chat("Tell me a long story."))
    await first_pieces(stream, 3)
    # One slot, held by the open stream: a second stream waits for it.
    second = asyncio.ensure_future(collect(graph.with_options(max_new_tokens=4).stream(chat("Hi!"))))
    await asyncio.sleep(0.2)
    assert not second.done()
    await stream.aclose()
    assert graph.last_call.stop_reason == "cancelled" and graph.last_call.generated_tokens < 200
    assert len(await asyncio.wait_for(second, 30)) > 0
    assert slots.free() == 1


def test_slots_are_taken_by_longest_common_prefix(tokenizer_dir: Path) -> None:
    import threading

    llm = tiny(tokenizer_dir)
    slots = GraphSlots(llm.model, max_len=32, slots=3)
    stop = threading.Event()
    a, b, c = (slots.take([], stop) for _ in range(3))
    assert a is not None and b is not None and c is not None
    stopped = threading.Event()
    stopped.set()
    assert slots.take([], stopped) is None  # all busy and stopped: no slot
    a.ids, b.ids, c.ids = [5, 6, 7], [5, 9], []
    for s in (a, b, c):
        slots.put_back(s)
    assert slots.take([5, 6, 8], stop) is a
    assert slots.take([5, 9, 9], stop) is b
    slots.put_back(a, valid=False)  # a failed call: the slot forgets what it held
    assert a.ids == [] and a.decoder.length == 0
