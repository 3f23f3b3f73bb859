"""The bundled tiny.en's decode cost and WER by encoder window, on ten styled bench questions.

The questions are the bench's own (Piper, one host style each: fast, high, quiet, slow, noisy, ...), resampled
to 16 kHz and decoded alone by ``WhisperDecoder`` with the given CTranslate2 threads.

    .venv/bin/python scripts/asr_window.py THREADS [WINDOW_S ...]   # e.g. 1 10 8 6 5 4
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
from scipy.signal import resample_poly

from engine.asr.ct2_whisper import resolve_model_path
from engine.asr.wer import wer
from engine.asr.whisper_decoder import WhisperDecoder
from engine.bench.voice import DEFAULT_QUESTIONS
from engine.bench.voices import STYLES, apply_style, synthesis_scale
from engine.config import Settings
from engine.progress import ConsoleProgress
from engine.tts.factory import load_tts


async def questions() -> list[tuple[str, np.ndarray]]:
    settings = Settings()
    voices = {}
    out = []
    for i, text in enumerate(DEFAULT_QUESTIONS[:10]):
        style = STYLES[i % len(STYLES)]
        scale = round(synthesis_scale(style), 3)
        if scale not in voices:
            config = settings.tts.model_copy(update={"length_scale": settings.tts.length_scale * scale})
            voices[scale] = load_tts(config, ConsoleProgress())
        spoken = await voices[scale].synthesize(text)
        pcm = apply_style(spoken.pcm, style, i)
        out.append((text, resample_poly(pcm.astype(np.float32) / 32768.0, 1, 3).astype(np.float32)))
    return out


def main(args: list[str]) -> None:
    threads = int(args[0]) if args else 1
    windows = [float(a) for a in args[1:]] or [10.0, 6.0]
    qs = asyncio.run(questions())
    decoder = WhisperDecoder.load(
        str(resolve_model_path("bundled:tiny.en")), device="cpu", compute_type="int8", cpu_threads=threads
    )
    for window in windows:
        decoder.decode(qs[0][1], window_s=window)  # warm-up
        runs = [(decoder.decode(audio, window_s=window), text) for text, audio in qs]
        encode = np.mean([d.encode_ms for d, _ in runs])
        generate = np.mean([d.generate_ms for d, _ in runs])
        errors = np.mean([wer(text, d.text) for d, text in runs])
        print(
            f"{threads} thread(s), window {window:g} s: encode {encode:.1f} ms, generate {generate:.1f} ms, WER {errors:.3f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
