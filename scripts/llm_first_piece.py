"""A reply's own prefill on the bundled GGUF through the engine's llama.cpp backend, alone: the system prompt
and history prewarmed, then each question streamed with its end-of-turn score (``stream_scored``), as an early
reply does. Prints when the score came, the first piece and the eighth (ms from the call), per question.

    python scripts/llm_first_piece.py [--turns 10]

(docs/PERFORMANCE.md, "one OpenMP team": medians 131 / 227 ms to the score / first piece at 1fbe06a, 91 / 145
after, on an idle 2-core AMX Xeon.)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.llm.base import ChatMessage  # noqa: E402
from engine.llm.config import LLMConfig  # noqa: E402
from engine.llm.llama_cpp_backend import LlamaCppLLM  # noqa: E402

SYSTEM = ("You are Hana, a cheerful virtual idol who co-hosts a live stream. " * 20).strip()
QUESTIONS = (
    "What game should we play next?",
    "Do you have a favorite animal?",
    "Tell me about your day.",
    "What should I cook for dinner tonight?",
    "How do you feel about rainy weather?",
)


async def run(turns: int) -> None:
    llm = await asyncio.to_thread(LlamaCppLLM, LLMConfig(backend="llama.cpp"))  # type: ignore[call-arg]
    print(llm.describe())
    history: list[ChatMessage] = [{"role": "system", "content": SYSTEM}]
    rows: list[dict[str, float]] = []
    for i in range(turns):
        await llm.prewarm(history, cache_key="s")
        messages = history + [ChatMessage(role="user", content=QUESTIONS[i % len(QUESTIONS)])]
        start = time.perf_counter()
        marks: dict[str, float] = {}

        def scored(_p: float, marks: dict[str, float] = marks, start: float = start) -> None:
            marks["score"] = (time.perf_counter() - start) * 1000

        text, n = "", 0
        async for piece in llm.stream_scored(messages, "s", scored):
            n += 1
            text += piece
            if n == 1:
                marks["first piece"] = (time.perf_counter() - start) * 1000
            if n == 8:
                marks["eighth piece"] = (time.perf_counter() - start) * 1000
                break
        rows.append(marks)
        print(
            {k: round(v, 1) for k, v in marks.items()},
            f"prefilled {llm.last_call.prefilled_tokens}",
            repr(text),
        )
        history = messages + [ChatMessage(role="assistant", content=text)]
    for key in ("score", "first piece", "eighth piece"):
        print(f"median {key}: {statistics.median(r[key] for r in rows if key in r):.1f} ms")
    llm.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=10)
    asyncio.run(run(ap.parse_args().turns))
