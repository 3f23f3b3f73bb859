"""ONNX export of the frame generator (static batch, opset 17: GridSample needs >= 16)."""

from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path

import torch

from engine.avatar.generator import FrameGenerator
from engine.avatar.params import NUM_PARAMS

OPSET = 17
INPUT_NAME, OUTPUT_NAME = "params", "frames"


def export_onnx(generator: FrameGenerator, batch: int = 1, path: str | Path | None = None) -> bytes:
    """Trace ``generator`` for a fixed ``batch`` and return the ONNX model bytes (also written to ``path``).

    Input ``params`` float32 ``[batch, P]``; output ``frames`` float32 ``[batch, 4, H, W]``
    premultiplied RGBA. The legacy TorchScript exporter is used (no onnxscript dependency).
    """
    generator = generator.eval().cpu()
    dummy = torch.zeros(batch, NUM_PARAMS)
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            generator,
            (dummy,),
            buf,  # type: ignore[arg-type]
            opset_version=OPSET,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamo=False,
            do_constant_folding=True,
        )
    data = buf.getvalue()
    if path is not None:
        Path(path).write_bytes(data)
    return data


def onnx_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
