"""Whisper's log-mel features as a torch module of a dozen ops, on the model's device.

transformers' ``WhisperFeatureExtractor`` computes the same features on the host (``torch.stft`` on the CPU,
then the mel filters, log10, the floor 8 decades under the maximum). Every torch call there gives up the GIL
and waits to take it back: beside the other sessions' busy threads, a 10 s window's features took 200 ms to
1.1 s instead of 2-3 ms (2 cores, three pure-Python threads; ``docs/PERFORMANCE.md``). Here the STFT is a
matrix product with a windowed DFT basis instead of an FFT, so the whole front end (and the encoder after it)
can be captured in one CUDA graph: one launch for a decode's features and encoder.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class LogMel(nn.Module):
    """``[batch, samples]`` float32 audio at 16 kHz -> ``[batch, mels, samples // hop]`` log-mel features, as
    ``WhisperFeatureExtractor`` computes them for audio already padded to the window (centered frames,
    reflect padding, a periodic Hann window, the last frame dropped, per-row floor at max - 8, (x + 4) / 4)."""

    def __init__(self, mel_filters: np.ndarray, n_fft: int = 400, hop_length: int = 160) -> None:
        super().__init__()
        filters = np.asarray(mel_filters, dtype=np.float64)
        n_freq = n_fft // 2 + 1
        if filters.ndim != 2 or filters.shape[0] != n_freq:
            raise ValueError(f"mel filters of shape {filters.shape}: expected ({n_freq}, mels)")
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.n_freq = n_freq
        self.n_mels = int(filters.shape[1])
        self.basis: torch.Tensor
        self.filters: torch.Tensor
        n = np.arange(n_fft, dtype=np.float64)[:, None]
        k = np.arange(n_freq, dtype=np.float64)[None, :]
        window = 0.5 - 0.5 * np.cos(2.0 * math.pi * n / n_fft)  # periodic Hann, as torch.hann_window
        angle = 2.0 * math.pi * n * k / n_fft
        basis = np.concatenate([np.cos(angle) * window, -np.sin(angle) * window], axis=1)
        self.register_buffer("basis", torch.from_numpy(basis).float(), persistent=False)
        self.register_buffer("filters", torch.from_numpy(filters).float(), persistent=False)

    @classmethod
    def from_extractor(cls, feature_extractor: Any) -> LogMel:
        """The front end of a transformers ``WhisperFeatureExtractor`` (its filters, FFT size and hop)."""
        return cls(
            np.asarray(feature_extractor.mel_filters),
            n_fft=int(getattr(feature_extractor, "n_fft", 400)),
            hop_length=int(getattr(feature_extractor, "hop_length", 160)),
        )

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        if audio.dim() != 2:
            raise ValueError(f"audio must be [batch, samples], got {tuple(audio.shape)}")
        half = self.n_fft // 2
        if audio.shape[1] <= half:
            raise ValueError(f"at least {half + 1} samples, got {audio.shape[1]}")
        x = F.pad(audio.float().unsqueeze(1), (half, half), mode="reflect").squeeze(1)
        frames = x.unfold(-1, self.n_fft, self.hop_length)[:, :-1]  # [B, samples // hop, n_fft]
        spec = frames @ self.basis  # [B, T, 2 * n_freq]: real parts, then imaginary
        power = spec[..., : self.n_freq].square() + spec[..., self.n_freq :].square()
        log = (power @ self.filters).clamp_min(1e-10).log10()  # [B, T, mels]
        log = torch.maximum(log, log.amax(dim=(1, 2), keepdim=True) - 8.0)
        return ((log + 4.0) / 4.0).transpose(1, 2)
