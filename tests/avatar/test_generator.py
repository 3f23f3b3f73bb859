"""The frame generator: shapes, batching, the CPU fast path against the module, motion ranges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.avatar.generator import FrameGenerator, rest_params, to_uint8
from engine.avatar.params import NUM_PARAMS

pytestmark = pytest.mark.unit


def _varied(batch: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    p = rest_params(batch)
    p[:, :5] = rng.uniform(-1, 1, size=(batch, 5)).astype(np.float32)
    p[:, 4] = rng.uniform(0, 1, size=batch)
    p[:, 5:7] = rng.uniform(0, 1, size=(batch, 2))
    p[:, 14] = rng.uniform(0, 1, size=batch)  # arm_wave
    p[:, 15] = rng.uniform(-1, 1, size=batch)
    p[:, 16:] = rng.uniform(0, 1, size=(batch, NUM_PARAMS - 16))
    return p


def test_output_shape_and_premultiplied(gen360: FrameGenerator) -> None:
    with torch.no_grad():
        out = gen360(torch.from_numpy(rest_params(2)))
    assert out.shape == (2, 4, 360, 640) and out.dtype == torch.float32
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0 + 1e-5
    assert bool((out[:, :3] <= out[:, 3:4] + 1e-4).all()), "colour must not exceed alpha (premultiplied)"
    assert float(out[:, 3].mean()) > 0.1  # the idol is on screen
    assert float(out[0, 3, :, :20].max()) == 0.0  # and the edges are transparent


def test_batch_equals_singles(gen360: FrameGenerator) -> None:
    p = torch.from_numpy(_varied(4))
    with torch.no_grad():
        batched = gen360(p)
        singles = torch.cat([gen360(p[i : i + 1]) for i in range(4)])
    assert torch.allclose(batched, singles, atol=1e-5)


def test_render_into_matches_forward(gen360: FrameGenerator) -> None:
    """The CPU fast path (skips, tight boxes, memoized features) gives the module's pixels exactly."""
    params = _varied(6)
    params[2, 14] = 0.0  # arm hidden, after a frame with the arm up in the same buffer
    frames = gen360.new_frames(1)
    for i in range(6):
        gen360.render_into(frames, params[i : i + 1])
        with torch.no_grad():
            ref = to_uint8(gen360(torch.from_numpy(params[i : i + 1]))).numpy()
        diff = np.abs(frames.astype(int) - ref.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-4, f"frame {i}: max {diff.max()}"


def test_render_into_batch(gen360: FrameGenerator) -> None:
    params = _varied(3)
    frames = gen360.render_into(gen360.new_frames(3), params)
    with torch.no_grad():
        ref = to_uint8(gen360(torch.from_numpy(params))).numpy()
    assert np.abs(frames.astype(int) - ref.astype(int)).max() <= 1


def test_motion_changes_pixels(gen360: FrameGenerator) -> None:
    with torch.no_grad():
        rest = gen360(torch.from_numpy(rest_params()))
        for name, value in [
            ("head_roll", 1.0),
            ("breath", 1.0),
            ("body_x", 1.0),
            ("arm_wave", 1.0),
            ("eye_open_l", 0.0),
            ("viseme_aa", 1.0),
            ("expr_happy", 1.0),
            ("gaze_x", 1.0),
        ]:
            moved = gen360(torch.from_numpy(rest_params(**{name: value})))
            assert float((moved - rest).abs().max()) > 0.2, name


def test_profiles_build() -> None:
    gen = FrameGenerator.builtin((96, 160))  # a tiny portrait frame: every group must fit or clip cleanly
    with torch.no_grad():
        out = gen(torch.from_numpy(rest_params()))
    assert out.shape == (1, 4, 160, 96)
    with pytest.raises(ValueError, match="unknown output profile"):
        FrameGenerator.builtin("4k-ish")


@pytest.mark.parametrize("batch", [1, 3])
def test_sampling_in_bands_equals_one_call(batch: int) -> None:
    """The CPU path cuts a single frame's warp into one band of rows per thread (torch parallelizes
    grid_sample over the batch only); the values are those of one call, for any height."""
    import torch.nn.functional as F

    from engine.avatar.groups import _sample_in_bands

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        gen = torch.Generator().manual_seed(0)
        canvas = torch.rand(batch, 4, 37, 29, generator=gen).contiguous(memory_format=torch.channels_last)
        grid = torch.rand(batch, 23, 31, 2, generator=gen) * 2.4 - 1.2  # some samples fall outside
        ref = F.grid_sample(canvas, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        got = _sample_in_bands(canvas, grid)
        assert got.shape == ref.shape
        assert torch.equal(got, ref)
    finally:
        torch.set_num_threads(before)
