"""The transformers backend's CUDA-graph decode path on a real GPU (skipped without one).

The same checks as tests/llm/test_random_and_graph_path.py, with captured graphs: the graph path streams the
same greedy reply as the DynamicCache path (float32), reuses the conversation prefix, stops on close and hands
its slot back; and for the Qwen2.5-1.5B shape in bf16 it streams speakable text faster than eager decoding.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from engine.llm.config import LLMConfig
from engine.llm.transformers_backend import TransformersLLM
from tests.llm.conftest import chat, collect, first_pieces
from tests.llm.word_tokenizer import build_word_tokenizer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_tokenizer(tmp_path_factory.mktemp("tok") / "words", size=4000)


def cuda_llm(tokenizer_dir: Path, **over: object) -> TransformersLLM:
    config = LLMConfig.model_validate(
        {
            "model": "random:qwen2.5-tiny",
            "tokenizer": str(tokenizer_dir),
            "device": "cuda",
            "dtype": "float32",
            "temperature": 0.0,
            "max_new_tokens": 16,
            "cuda_graph_slots": 2,
            "cuda_graph_max_len": 512,
            **over,
        }
    )
    return TransformersLLM(config)


async def test_graph_path_streams_what_the_eager_path_streams(tokenizer_dir: Path) -> None:
    graph = cuda_llm(tokenizer_dir)
    eager = cuda_llm(tokenizer_dir, cuda_graphs=False)
    assert graph.graph_slots is not None and eager.graph_slots is None
    assert "CUDA-graph decode, 2 static KV caches of 512 positions" in graph.describe()
    with torch.no_grad():  # the same random weights in both
        for p, q in zip(graph.model.parameters(), eager.model.parameters(), strict=True):
            assert torch.equal(p, q)
    first = chat("Hi Aiko! What are we doing on stream today?")
    g1 = "".join(await collect(graph.stream(first, cache_key="s")))
    e1 = "".join(await collect(eager.stream(first, cache_key="s")))
    assert graph.last_call.reply_ids == eager.last_call.reply_ids and g1 == e1
    second = chat("Hi Aiko! What are we doing on stream today?", g1, "Nice. Which game?")
    g2 = "".join(await collect(graph.stream(second, cache_key="s")))
    e2 = "".join(await collect(eager.stream(second, cache_key="s")))
    assert graph.last_call.reply_ids == eager.last_call.reply_ids and g2 == e2
    s = graph.last_call
    assert s.reused_tokens > 0 and s.prefilled_tokens == s.prompt_tokens - s.reused_tokens


async def test_graph_path_stops_on_close_and_returns_its_slot(tokenizer_dir: Path) -> None:
    llm = cuda_llm(tokenizer_dir, max_new_tokens=400, no_repeat_ngram_size=0, temperature=0.8)
    llm.stop_ids = []
    stream = llm.stream(chat("Tell me a long story."))
    await first_pieces(stream, 3)
    t0 = time.perf_counter()
    await stream.aclose()
    assert time.perf_counter() - t0 < 1.0
    assert llm.last_call.stop_reason == "cancelled" and llm.last_call.generated_tokens < 400
    assert llm.graph_slots is not None and llm.graph_slots.free() == 2


async def test_1_5b_shape_bf16_streams_speakable_text_faster_than_eager(tokenizer_dir: Path) -> None:
    options = {"model": "random:qwen2.5-1.5b", "dtype": "bfloat16", "temperature": 0.7, "max_new_tokens": 64}
    rates = {}
    for name, graphs in (("graph", True), ("eager", False)):
        llm = cuda_llm(tokenizer_dir, cuda_graphs=graphs, **options)
        llm.stop_ids = []  # the full length, to time it
        await collect(llm.stream(chat("Warm up.")))
        t0 = time.perf_counter()
        text = "".join(await collect(llm.stream(chat("What is your favorite color?"))))
        elapsed = time.perf_counter() - t0
        s = llm.last_call
        assert s.generated_tokens == 64
        assert all(re.fullmatch(r"[.,!?]*[A-Za-z]*[.,!?]*", w) for w in text.split()), text
        rates[name] = s.generated_tokens / elapsed
        del llm
        torch.cuda.empty_cache()
    print(f"backend tokens/s, 1.5B shape bf16, 64 sampled tokens: {rates}")
    assert rates["graph"] > 2 * rates["eager"], rates
