"""Loading the transformers model: CPU threads, int8 quantization, the ids that end a reply.

:class:`~engine.llm.transformers_backend.TransformersLLM` builds itself from these (with
:mod:`engine.llm.hf_models` for the weights and tokenizer).
"""

from __future__ import annotations

from typing import Any

import torch

from engine.cores import usable_cores
from engine.llm.streaming import END_OF_TURN_TOKENS


def cpu_threads(setting: int) -> int:
    """Torch threads for CPU inference (process-wide: the frame renderer shares them)."""
    if setting > 0:
        return setting
    cores = usable_cores()
    return 1 if cores <= 2 else cores // 2


def quantize_int8(model: Any) -> Any:
    """Dynamic int8 quantization of the decoder layers' linear layers (~20% off a CPU decode step).

    The output head stays float: quantizing it too halved the step time but changed SmolLM2-135M's
    answers (it stopped naming Paris as the capital of France).
    """
    import warnings

    from torch import nn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the eager quantization API's migration notice
        body = getattr(model, "model", None)
        if isinstance(body, nn.Module):
            model.model = torch.ao.quantization.quantize_dynamic(body, {nn.Linear}, dtype=torch.qint8)
            return model
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def stop_ids(tokenizer: Any, model: Any) -> list[int]:
    """The ids that end a reply: the tokenizer's and generation config's EOS, and the end-of-turn tokens."""
    ids: set[int] = set()
    for source in (
        tokenizer.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(i) for i in source)
    unk = tokenizer.unk_token_id
    for token in END_OF_TURN_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != unk:
            ids.add(tid)
    return sorted(ids)
