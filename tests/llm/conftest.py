"""Fixtures of the LLM tests: one real SmolLM2 per test session.

The dequantized copy of the bundled GGUF lives in the project's ``var/cache/models`` (git-ignored,
the same folder ``idolcast serve`` uses), so the ~25-60 s dequantize happens at most once per
checkout, and never more than once per test run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.llm.base import ChatMessage
from engine.llm.config import LLMConfig
from engine.llm.transformers_backend import TransformersLLM
from engine.progress import ConsoleProgress

REPO = Path(__file__).resolve().parents[2]
MODEL_CACHE = REPO / "var" / "cache" / "models"

SYSTEM = (
    "You are Aiko, a cheerful virtual idol co-hosting a live stream. Answer in one short, friendly sentence."
)


def chat(*turns: str, system: str = SYSTEM) -> list[ChatMessage]:
    """A conversation: user, assistant, user, ... after the system prompt."""
    messages: list[ChatMessage] = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


async def collect(stream: AsyncIterator[str]) -> list[str]:
    return [piece async for piece in stream]


async def first_pieces(stream: AsyncIterator[str], n: int) -> list[str]:
    """The first ``n`` pieces, leaving the stream open (generation goes on until it is closed)."""
    out: list[str] = []
    async for piece in stream:
        out.append(piece)
        if len(out) == n:
            break
    return out


@pytest.fixture(scope="session")
def smollm() -> TransformersLLM:
    """The bundled model, greedy, short replies, on CPU. Tests derive variants with ``with_options``."""
    config = LLMConfig(cache_dir=str(MODEL_CACHE), device="cpu", temperature=0.0, max_new_tokens=20)  # type: ignore[call-arg]
    return TransformersLLM(config, ConsoleProgress())
