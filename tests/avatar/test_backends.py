"""Backends: selection, the torch CPU and ONNX Runtime backends, CUDA graphs (gpu), TensorRT errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.avatar.backends import BackendUnavailable, FrameBackend, select_backend
from engine.avatar.backends.tensorrt import build_trt_plans, find_plans
from engine.avatar.delivery import speaking_params
from engine.avatar.generator import rest_params, to_uint8
from engine.avatar.loaders import load_character
from engine.bench.render_frames import run_render_bench
from tests.avatar.conftest import generator


@pytest.mark.unit
def test_auto_falls_back_to_torch_on_cpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    backend = select_backend("auto", "360p", plan_dir=str(tmp_path))
    assert isinstance(backend, FrameBackend) and backend.name == "torch"
    params = speaking_params(1, 2)[0]
    frames = backend.render(params)
    assert frames.shape == (2, 360, 640, 4) and frames.dtype == np.uint8
    drawn = backend.renderer.feature_params(params)  # the gaze rounded to a quarter pixel of the iris
    with torch.no_grad():
        ref = to_uint8(generator("360p")(torch.from_numpy(drawn))).numpy()
    assert np.abs(frames.astype(int) - ref.astype(int)).max() <= 1


@pytest.mark.unit
def test_onnxruntime_backend_matches_torch() -> None:
    backend = select_backend("onnxruntime", "360p")
    p = rest_params(1, expr_surprised=1.0, viseme_O=1.0)
    got = backend.render(p)
    with torch.no_grad():
        want = to_uint8(generator("360p")(torch.from_numpy(p))).numpy()
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


@pytest.mark.unit
def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown frame backend"):
        select_backend("vulkan", "360p")


@pytest.mark.unit
def test_tensorrt_unavailable_says_why(tmp_path: Path) -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailable, match="tensorrt"):
            select_backend("tensorrt", "360p", plan_dir=str(tmp_path))
        with pytest.raises(BackendUnavailable, match="tensorrt"):
            build_trt_plans(["360p"], [1], out_dir=tmp_path)
    else:  # pragma: no cover - GPU machines
        pytest.skip("tensorrt is installed")


@pytest.mark.unit
def test_plan_matching_explains_mismatch(tmp_path: Path) -> None:
    (tmp_path / "a.plan").write_bytes(b"x")
    entry = {
        "file": "a.plan",
        "character": "builtin:default",
        "gpu": "NVIDIA H200",
        "tensorrt": "10.3.0",
        "width": 1280,
        "height": 720,
        "batch": 8,
        "precision": "fp16",
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"plans": [entry]}))
    assert find_plans("builtin:default", 1280, 720, tmp_path, "NVIDIA H200", "10.3.0")[0]["batch"] == 8
    with pytest.raises(
        BackendUnavailable, match=r"width=1280 \(need 1920\).*tensorrt='10.3.0' \(need '10.5.0'\)"
    ):
        find_plans("builtin:default", 1920, 720, tmp_path, "NVIDIA H200", "10.5.0")
    with pytest.raises(BackendUnavailable, match="build plans"):
        find_plans("builtin:default", 1280, 720, tmp_path / "none", "NVIDIA H200", "10.3.0")


@pytest.mark.unit
def test_render_bench_rows() -> None:
    rows = run_render_bench(["torch"], ["360p"], [1, 2], frames=2, warmup=1)
    assert [(r["backend"], r["width"], r["height"], r["batch"]) for r in rows] == [
        ("torch", 640, 360, 1),
        ("torch", 640, 360, 2),
    ]
    assert all(r["ms_per_frame"] > 0 for r in rows)


@pytest.mark.gpu
def test_cuda_graph_matches_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from engine.avatar.backends.cuda_graph import CudaGraphBackend

    # buckets 1, 2, 4: a batch of 3 replays the 4-row graph, one of 6 renders 4 then 2 rows
    backend = CudaGraphBackend(load_character("builtin:default"), "360p", max_batch=4)
    assert sorted(backend._graphs) == [1, 2, 4]
    for batch in (1, 3, 4, 6):
        p = speaking_params(2, batch)
        for i in range(2):  # replay twice: the graph must pick up new params
            got = backend.render(p[i])
            assert got.shape[0] == batch
            with torch.no_grad():
                want = to_uint8(generator("360p")(torch.from_numpy(p[i]))).numpy()
            diff = np.abs(got.astype(int) - want.astype(int))
            assert diff.max() <= 2 and (diff > 1).mean() < 1e-3
