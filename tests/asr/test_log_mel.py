"""LogMel computes transformers' Whisper features (its own front end, a matrix-product DFT)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from engine.asr.log_mel import LogMel


def _speech_like(samples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    audio = np.zeros(samples, dtype=np.float32)
    t = np.arange(24000) / 16000
    audio[3000:27000] = 0.3 * np.sin(2 * np.pi * 220 * t) * rng.uniform(0.5, 1.0, 24000)
    audio[27000:40000] = 0.05 * rng.standard_normal(13000)
    return audio


@pytest.mark.parametrize("mels", [80, 128])
def test_features_equal_the_extractors(mels: int) -> None:
    fe = WhisperFeatureExtractor(feature_size=mels)
    front = LogMel.from_extractor(fe)
    audio = _speech_like(160 * 1000, seed=mels)
    ref = fe(audio, sampling_rate=16000, return_tensors="pt", padding="max_length", max_length=len(audio))
    got = front(torch.from_numpy(audio)[None])
    assert got.shape == ref["input_features"].shape == (1, mels, 1000)
    assert float((got - ref["input_features"]).abs().max()) < 1e-4


def test_rows_are_their_own_and_silence_is_floored() -> None:
    fe = WhisperFeatureExtractor(feature_size=80)
    front = LogMel.from_extractor(fe)
    loud, quiet = _speech_like(16000 * 5, 1), 0.01 * _speech_like(16000 * 5, 2)
    both = front(torch.from_numpy(np.stack([loud, quiet])))
    for row, audio in enumerate((loud, quiet)):
        alone = front(torch.from_numpy(audio)[None])[0]
        assert torch.allclose(both[row], alone, atol=1e-5)  # the floor is each row's own maximum - 8
    silence = front(torch.zeros(1, 16000))
    assert torch.isfinite(silence).all()


def test_bad_shapes_are_refused() -> None:
    front = LogMel.from_extractor(WhisperFeatureExtractor(feature_size=80))
    with pytest.raises(ValueError, match="batch, samples"):
        front(torch.zeros(16000))
    with pytest.raises(ValueError, match="at least"):
        front(torch.zeros(1, 100))
    with pytest.raises(ValueError, match="mel filters"):
        LogMel(np.zeros((100, 80)))
