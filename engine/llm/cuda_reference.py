"""Random-weight models of real shapes and the eager reference that GraphDecoder is checked against.

Shared by tests/gpu and engine/bench/gpu_llm.py. Nothing is downloaded: configs come from shape numbers.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

# Qwen2.5 decoder shapes (from the published configs). 0.5B and 1.5B tie the embeddings; 7B does not.
QWEN25_SHAPES: dict[str, dict[str, Any]] = {
    "0.5B": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "tie_word_embeddings": True,
    },
    "1.5B": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "tie_word_embeddings": True,
    },
    "7B": {
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "tie_word_embeddings": False,
    },
    # A toy of the same family, for CPU smoke runs of the bench.
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "tie_word_embeddings": True,
        "vocab_size": 512,
        "bos_token_id": 0,
        "eos_token_id": 1,
    },
}
QWEN25_COMMON: dict[str, Any] = {
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}


def init_normal(model: nn.Module, std: float = 0.02, seed: int = 0) -> None:
    """Numerically sane random weights: matrices and embeddings ~ N(0, std), biases 0, norm gains 1."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)


def build_qwen2(shape: str, device: str | torch.device, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """A Qwen2.5-shaped ``Qwen2ForCausalLM`` with random weights, built directly on ``device`` in ``dtype``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**{**QWEN25_COMMON, **QWEN25_SHAPES[shape]})
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    init_normal(model, seed=seed)
    return model.eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float32 (L2 over everything given: one step's vocabulary, say)."""
    a32, b32 = a.float(), b.float()
    return float((a32 - b32).norm() / b32.norm())


def eager_teacher_forced(
    model: nn.Module, prompt: torch.Tensor, feed: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's eager forward through a ``DynamicCache``: the prompt's last logits ``[B, vocab]``, then one
    logits row per token of ``feed`` (``[B, steps]``), fed one at a time."""
    from transformers import DynamicCache

    # transformers >= 5.2x renamed ``past_key_values`` to ``cache`` (the GPU image has 5.17).
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    config: Any = model.config
    kw: dict[str, Any] = {key: DynamicCache(config=config), "use_cache": True}
    with torch.no_grad():
        first = model(prompt, **kw).logits[:, -1]
        steps = [model(feed[:, i : i + 1], **kw).logits[:, -1] for i in range(feed.shape[1])]
    return first, steps
