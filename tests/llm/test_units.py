"""Fast checks of the pieces around the models (no weights loaded)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine.llm.base import LLMError
from engine.llm.config import LLMConfig
from engine.llm.factory import load_llm
from engine.llm.hf_models import gguf_cache_dir, resolve_source
from engine.llm.kv_cache import CacheEntry, PrefixCacheStore, Shift, common_prefix_len, shifted_runs

pytestmark = pytest.mark.unit


def test_shifted_runs_find_what_is_left_after_the_front_of_the_history_is_dropped() -> None:
    system, old, kept, tail = [1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23, 24, 25], [30, 31]
    cached = system + old + kept + tail
    # the oldest exchange dropped, the kept ones moved forward, a new message after them
    assert shifted_runs(cached, system + kept + [40, 41], 3, 4) == [Shift(src=7, dst=3, length=6)]
    # two dropped stretches: each kept run moves by what was dropped before it
    assert shifted_runs(cached, system + kept[:3] + tail + [40], 3, 2) == [
        Shift(src=7, dst=3, length=3),
        Shift(src=13, dst=6, length=2),
    ]
    # a run shorter than the minimum is prefilled instead; new tokens end the search (only deletions move)
    assert shifted_runs(cached, system + kept[:3], 3, 4) == []
    assert shifted_runs(cached, system + [99] + kept, 3, 4) == []
    # nothing dropped: the common prefix covers it, nothing to move
    assert shifted_runs(cached, cached + [40], len(cached), 4) == []


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2


def test_store_is_an_lru_of_claimed_entries() -> None:
    store = PrefixCacheStore(slots=2)
    stop = threading.Event()
    for key in ("a", "b", "c"):
        owned, entry = store.take(key, stop)
        assert owned and entry is None
        store.put_back(key, CacheEntry([1, 2], cache=None))
    assert len(store) == 2 and store.cached_tokens("a") == 0  # 'a' was evicted
    owned, entry = store.take("b", stop)
    assert owned and entry is not None and entry.ids == [1, 2]
    assert store.cached_tokens("b") == 0  # taken out while in use


def test_a_busy_key_waits_then_runs_cold() -> None:
    store = PrefixCacheStore()
    stop = threading.Event()
    store.put_back("k", CacheEntry([7], cache=None))
    assert store.take("k", stop)[0]
    start = time.perf_counter()
    assert store.take("k", stop, wait_s=0.1) == (False, None)  # still held: cold, must not put back
    assert time.perf_counter() - start >= 0.1
    threading.Timer(0.05, store.put_back, args=("k", CacheEntry([8], cache=None))).start()
    owned, entry = store.take("k", stop, wait_s=2.0)
    assert owned and entry is not None and entry.ids == [8]


def test_model_sources(tmp_path: Path) -> None:
    bundled = resolve_source("bundled:smollm2-135m")
    assert bundled.kind == "gguf" and bundled.gguf_file and bundled.gguf_file.endswith(".gguf")
    key = gguf_cache_dir(bundled, tmp_path)
    assert key.parent == tmp_path and key == gguf_cache_dir(bundled, tmp_path)
    assert resolve_source("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hub"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert resolve_source(str(tmp_path / "m")).kind == "folder"
    with pytest.raises(LLMError, match="unknown bundled model"):
        resolve_source("bundled:gpt-9")
    with pytest.raises(LLMError, match="not a bundled model, an existing path or a hub id"):
        resolve_source("./missing/folder/x")
    with pytest.raises(LLMError, match="no config.json"):
        resolve_source(str(tmp_path))


def test_unknown_backend_is_refused() -> None:
    config = LLMConfig.model_construct(backend="nope")
    with pytest.raises(LLMError, match="llm.backend"):
        load_llm(config)


async def test_simple_history_is_trimmed_in_halves_so_the_prefix_holds() -> None:
    """The prompt before the newest user message changes only when the history is trimmed: every
    ``max_turns // 2`` turns, not every turn (each change costs the LLM a full re-prefill)."""
    from engine.events import UserTurn
    from engine.llm.prompt import SimplePromptProvider

    provider = SimplePromptProvider("You are Hoshi.", max_turns=8)
    previous: list[dict[str, str]] | None = None
    broken = 0
    for i in range(24):
        turn = UserTurn(t=float(i), text=f"question {i}", source="voice", turn_id=i + 1)
        messages = [dict(m) for m in await provider.build_prompt(turn)]
        if previous is not None and messages[: len(previous)] != previous:
            broken += 1  # the last prompt (with its reply) is no longer a prefix of this one
        await provider.record_turn(turn, f"answer {i}", interrupted=False)
        previous = messages + [{"role": "assistant", "content": f"answer {i}"}]
        assert len(provider.history) <= 8
        assert provider.history[-1] == (f"question {i}", f"answer {i}")
    assert broken == 3, broken  # trimmed to 4 after turns 9, 14 and 19 (a sliding window: 15 times)
