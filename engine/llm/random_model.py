"""Random-weight language models of published shapes, for benchmarks on machines that cannot download.

``llm.model = "random:qwen2.5-1.5b"`` builds a ``Qwen2ForCausalLM`` of that shape with N(0, 0.02) weights
directly on the device (:func:`engine.llm.cuda_reference.build_qwen2`); ``llm.tokenizer`` names a local
tokenizer folder (any Hugging Face tokenizer with a chat template, e.g. the bundled SmolLM2's). The model
keeps its own vocabulary size (the LM head costs what it costs in the real model); the tokenizer may be
smaller.

Random weights give near-flat logits, so sampling would pick any id: ids the tokenizer does not have, byte
fragments, special tokens. :func:`speakable_bias` restricts sampling to ids that decode to a plain word (or
a word piece) or common punctuation, plus the stop ids, so a reply is text a voice can speak. It is applied
to random models only; a real model's logits are never touched.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from engine.llm.base import LLMError

if TYPE_CHECKING:
    import torch

PREFIX = "random:"
# Setting name -> key of engine.llm.cuda_reference.QWEN25_SHAPES.
RANDOM_SHAPES = {
    "qwen2.5-0.5b": "0.5B",
    "qwen2.5-1.5b": "1.5B",
    "qwen2.5-7b": "7B",
    "qwen2.5-tiny": "tiny",
}
_WORD = re.compile(r" ?[A-Za-z]{1,14}")
_PUNCT = frozenset({".", ",", "!", "?"})


def shape_of(model: str) -> str:
    """The shape key for a ``random:NAME`` setting; LLMError for an unknown name."""
    name = model.removeprefix(PREFIX)
    if name not in RANDOM_SHAPES:
        raise LLMError(f"llm.model: unknown random shape {name!r} (known: {', '.join(RANDOM_SHAPES)})")
    return RANDOM_SHAPES[name]


def load_random(shape: str, tokenizer_dir: str, *, dtype: Any, device: str) -> tuple[Any, Any]:
    """(model, tokenizer): random weights of ``shape`` on ``device``, the tokenizer from ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    from engine.llm.cuda_reference import build_qwen2

    if not tokenizer_dir:
        raise LLMError("llm.tokenizer: a 'random:*' model needs a local tokenizer folder (llm.tokenizer)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError) as e:
        raise LLMError(f"llm.tokenizer: could not load a tokenizer from {tokenizer_dir!r}: {e}") from e
    if not getattr(tokenizer, "chat_template", None):
        raise LLMError(f"llm.tokenizer: {tokenizer_dir!r} has no chat template")
    model = build_qwen2(shape, device, dtype)
    return model, tokenizer


def speakable_ids(tokenizer: Any, vocab: int, keep: list[int]) -> list[int]:
    """Ids below ``vocab`` that decode (alone) to a word or word piece of ASCII letters, optionally with a
    leading space, or to ``. , ! ?``; plus ``keep`` (the stop ids)."""
    n = min(vocab, len(tokenizer))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out = {i for i in keep if 0 <= i < vocab}
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=True)
    for i, text in enumerate(texts):
        if i not in special and (_WORD.fullmatch(text) or text in _PUNCT):
            out.add(i)
    return sorted(out)


def speakable_bias(tokenizer: Any, vocab: int, keep: list[int], device: str) -> torch.Tensor:
    """``[1, vocab]`` float32: 0 on :func:`speakable_ids`, -inf elsewhere (added to the logits)."""
    import torch

    allowed = speakable_ids(tokenizer, vocab, keep)
    if len(allowed) <= len(set(keep)):
        raise LLMError("llm.tokenizer: the tokenizer has no plain-word tokens below the model's vocabulary")
    bias = torch.full((1, vocab), float("-inf"), dtype=torch.float32)
    bias[0, torch.tensor(allowed, dtype=torch.long)] = 0.0
    return bias.to(device)
