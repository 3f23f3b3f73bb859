"""ONNX export: parity with the torch module through onnxruntime, and TensorRT-parsable operators only."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from engine.avatar.export import OPSET, export_onnx
from engine.avatar.generator import FrameGenerator, rest_params

pytestmark = pytest.mark.unit

# Operators the TensorRT ONNX parser supports (onnx-tensorrt, docs/operators.md, TensorRT 10.x, opsets 9-20),
# limited to those this project might emit. GridSample needs opset >= 16 (we export at 17).
TENSORRT_OPS = frozenset(
    {
        "Abs",
        "Add",
        "And",
        "Cast",
        "Ceil",
        "Clip",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Cos",
        "Div",
        "Equal",
        "Exp",
        "Expand",
        "Flatten",
        "Floor",
        "Gather",
        "Gemm",
        "Greater",
        "GreaterOrEqual",
        "GridSample",
        "Identity",
        "Less",
        "LessOrEqual",
        "MatMul",
        "Max",
        "Min",
        "Mul",
        "Neg",
        "Not",
        "Or",
        "Pad",
        "Pow",
        "Range",
        "ReduceMax",
        "ReduceMin",
        "ReduceSum",
        "Relu",
        "Reshape",
        "Resize",
        "Shape",
        "Sigmoid",
        "Sign",
        "Sin",
        "Slice",
        "Split",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Sum",
        "Tile",
        "Transpose",
        "Unsqueeze",
        "Where",
    }
)

# Per-pixel tolerance of ONNX Runtime against torch (premultiplied float, 0..1 scale).
MAX_ABS_DIFF = 2e-3
MEAN_ABS_DIFF = 1e-5


@pytest.fixture(scope="module")
def exported(gen360: FrameGenerator) -> bytes:
    return export_onnx(gen360, batch=2)


def test_onnx_matches_torch(gen360: FrameGenerator, exported: bytes) -> None:
    p = rest_params(2, expr_happy=0.7, expr_neutral=0.3, viseme_aa=0.6, head_roll=0.4, arm_wave=0.8)
    p[1] = rest_params(
        1,
        expr_sad=1.0,
        expr_neutral=0.0,
        viseme_O=1.0,
        viseme_sil=0.0,
        head_yaw=-0.6,
        eye_open_l=0.3,
        body_x=-1.0,
        breath=1.0,
        gaze_x=0.5,
    )[0]
    sess = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"params": p})
    with torch.no_grad():
        want = gen360(torch.from_numpy(p)).numpy()
    diff = np.abs(got - want)
    assert got.shape == want.shape == (2, 4, 360, 640)
    assert diff.max() <= MAX_ABS_DIFF and diff.mean() <= MEAN_ABS_DIFF, (diff.max(), diff.mean())


def test_onnx_ops_are_tensorrt_supported(exported: bytes) -> None:
    model = onnx.load_from_string(exported)
    assert model.opset_import[0].version == OPSET >= 16
    ops = {n.op_type for n in model.graph.node}
    assert "GridSample" in ops
    assert ops <= TENSORRT_OPS, f"not in TensorRT's ONNX parser list: {sorted(ops - TENSORRT_OPS)}"
    assert "ScatterND" not in ops and "Loop" not in ops and "If" not in ops  # no data-dependent control flow
