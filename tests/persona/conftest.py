"""Persona fixtures: one real MiniLM embedder per test session, fresh SQLite banks per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from persona.bank import MemoryBank  # noqa: E402
from persona.card import PersonaCard, load_card  # noqa: E402
from persona.embed import HashEmbedder, MiniLMEmbedder  # noqa: E402


@pytest.fixture(scope="session")
def embedder() -> MiniLMEmbedder:
    # the ONNX export is cached under var/cache/persona (git-ignored) and checked against torch at load
    return MiniLMEmbedder()


@pytest.fixture
def card() -> PersonaCard:
    return load_card("builtin:default")


@pytest.fixture
def bank(tmp_path: Path, embedder: MiniLMEmbedder) -> Iterator[MemoryBank]:
    b = MemoryBank.open(tmp_path / "memory.sqlite3", embedder, "aiko")
    yield b
    b.close()


@pytest.fixture
def hash_bank(tmp_path: Path) -> Iterator[MemoryBank]:
    """A bank with a model-free embedder, for tests about assembly and storage, not meaning."""
    b = MemoryBank.open(tmp_path / "memory.sqlite3", HashEmbedder(), "aiko")
    yield b
    b.close()
