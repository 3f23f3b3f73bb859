"""The face's features compiled for the CPU (engine/avatar/kernels.py): the same pictures as eager torch, a
clear error or an eager fallback where they cannot be compiled.

The first test compiles for real with Inductor's C++ backend (~30 s on a fresh machine, cached under
var/cache/inductor after); the others run after it in this process."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from engine.avatar import kernels
from engine.avatar.backends.torch_cpu import TorchBackend
from engine.avatar.cpu_render import CpuRenderer
from engine.avatar.delivery import speaking_params
from engine.avatar.features import ProceduralFeature
from engine.avatar.kernels import FeatureKernels, KernelsUnavailable
from engine.avatar.loaders import load_character
from engine.avatar.params import INDEX
from tests.avatar.conftest import generator

pytestmark = pytest.mark.unit


def _moving(n: int) -> np.ndarray:
    """Speaking idle with a wink (one eye drawn alone) and a glance (the iris moves)."""
    p = speaking_params(n, 1)[:, 0].copy()
    p[n // 2 : n // 2 + 4, INDEX["eye_open_l"]] = 0.2
    p[n // 3 :, INDEX["gaze_x"]] = np.linspace(-0.8, 0.8, n - n // 3)
    return p


def test_compiled_features_draw_the_eager_frames() -> None:
    """A speaking sequence through the compiled renderer matches the eager one (float rounding only), and every
    procedural feature, alone and as twins, ran compiled."""
    compiled = TorchBackend(load_character("builtin:default"), "720p", kernels="on")
    eager = CpuRenderer(generator("720p"))
    heads = [g for g in compiled.renderer.groups if g.layer.feats]
    procedural = sum(isinstance(f, ProceduralFeature) for g in heads for f in g.layer.feats)
    assert sum(g.kernels.compiled for g in heads) == procedural + 1  # each alone, and the two eyes together
    params = _moving(40)
    for i in range(len(params)):
        got, want = compiled.render(params[i])[0], eager.render(params[i])[0]
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.001, (i, diff.max(), diff.mean())


def test_each_compiled_feature_is_the_eager_feature() -> None:
    gen = generator("360p")
    feats = [f for layer in gen.groups for f in layer.feats]
    drawer = FeatureKernels(feats, "on")
    with torch.inference_mode():
        p = torch.from_numpy(_moving(30)[20]).view(1, -1)
        drawer.build(p)
        items = list(range(len(feats)))
        for feat, got in zip(feats, drawer.draw(items, p), strict=True):
            torch.testing.assert_close(got, feat(p), atol=1e-4, rtol=0.0, msg=feat.name)
        # whole graphs (kernels compile without fullgraph, see kernels._compile): no feature breaks its graph
        for feat in feats:
            if isinstance(feat, ProceduralFeature):
                assert torch._dynamo.explain(feat)(p).graph_break_count == 0, feat.name


def test_a_kernel_that_fails_while_drawing_costs_no_frame(caplog: pytest.LogCaptureFixture) -> None:
    """A compiled kernel that raises mid-stream (a runtime's failure) is dropped: that frame and the next are
    drawn eagerly, the others stay compiled."""
    gen = generator("360p")
    feats = [f for layer in gen.groups for f in layer.feats]
    mouth = next(i for i, f in enumerate(feats) if f.name == "mouth")
    drawer = FeatureKernels(feats, "on")
    with torch.inference_mode():
        p = torch.from_numpy(_moving(4)[0]).view(1, -1)
        drawer.build(p)
        compiled = drawer.compiled

        def broken(_: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("the kernel failed")

        drawer._kernels[(mouth,)] = broken
        with caplog.at_level(logging.ERROR, logger="engine.avatar.kernels"):
            for _ in range(2):
                (got,) = drawer.draw([mouth], p)
                assert torch.equal(got, feats[mouth](p))
    assert caplog.text.count("mouth: its compiled kernel failed") == 1
    assert drawer.compiled == compiled - 1


def test_without_a_compiler_auto_draws_eagerly_and_on_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    gen = generator("360p")
    feats = [f for layer in gen.groups for f in layer.feats]
    p = torch.from_numpy(_moving(4)[0]).view(1, -1)
    auto = FeatureKernels(feats, "auto")
    auto.build(p)
    assert auto.compiled == 0
    with torch.no_grad():
        assert all(
            torch.equal(a, f(p)) for a, f in zip(auto.draw(list(range(len(feats))), p), feats, strict=True)
        )
    with pytest.raises(KernelsUnavailable, match="no C\\+\\+ compiler"):
        FeatureKernels(feats, "on").build(p)


def test_a_feature_that_fails_to_compile_stays_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A compile that fails (here: the mouth's) leaves that feature eager and the others compiled under "auto";
    under "on" it is an error naming the feature."""
    real = kernels._compile

    def compile_but_the_mouth(fn: kernels.Kernel) -> kernels.Kernel:
        if getattr(fn, "name", None) == "mouth":
            raise RuntimeError("the C++ build failed")
        return real(fn)

    monkeypatch.setattr(kernels, "_compile", compile_but_the_mouth)
    gen = generator("360p")
    feats = [f for layer in gen.groups for f in layer.feats]
    p = torch.from_numpy(_moving(4)[0]).view(1, -1)
    with caplog.at_level(logging.WARNING, logger="engine.avatar.kernels"):
        auto = FeatureKernels(feats, "auto")
        auto.build(p)
    assert "mouth runs eagerly" in caplog.text
    procedural = sum(isinstance(f, ProceduralFeature) for f in feats)
    assert auto.compiled == procedural  # all groups but the mouth (the eyes' twins included)
    with pytest.raises(KernelsUnavailable, match="compiling mouth failed"):
        FeatureKernels(feats, "on").build(p)
