"""Stage latencies on the GPU machine through the engine's own backends, each stage alone.

    python -m engine.bench.gpu_stages --llm --asr --tokenizer /var/tmp/idolcast/tokenizer --out $OUT/stages.json
    python -m engine.bench.gpu_stages --tts .voice/en_US-joe-medium.onnx --out $OUT/tts.json

* LLM: ``TransformersLLM`` on ``random:qwen2.5-1.5b`` (bf16), once with the CUDA-graph decode path and once
  without (``llm.cuda_graphs = false``: the DynamicCache path), the bench's settings (temperature 0.7,
  ``max_new_tokens`` 32). Per reply: TTFT (worker start to the first text piece), the time until the chunker
  cuts the first chunk (first_chunk_max_words = 5), and decode tokens/s after the first piece. Turn 1 of each
  conversation prefills the whole prompt; later turns reuse the cached prefix.
  On the graph path also a second turn's reply beside 3 threads of pure Python (``beside_busy_turn2_*``) and
  the torch calls two replies make (``torch_calls_two_replies``, every thread).
* ASR: ``TorchWhisperASR`` on ``random:small`` (fp16, CUDA graphs): a final decode of 1.6 s of loud audio
  (the length of a bench question), cut at :func:`engine.asr.torch_whisper.random_decode_tokens`; with the
  encoder replayed as a CUDA graph and eager (``asr.encoder_graphs``), each alone, and the graph's beside 3
  threads of pure Python (what other sessions' threads are to a decode: each torch call waits for the GIL;
  ``--asr-eager-busy`` times the eager one there too, 31 s a decode on an H100 host); torch calls a decode.
* TTS: the Piper voice on the host CPU, the first chunk of a reply (5 words), 1, 4 and 8 ONNX threads.

Medians of ``--repeats`` after one warm-up. A short table is printed last; everything goes to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.bench.gil import busy_threads, torch_calls

SYSTEM = (
    "You are Aiko, a cheerful virtual idol co-hosting a live stream. "
    "Answer in one or two short, friendly spoken sentences."
)
QUESTIONS = (
    "What is your favorite color?",
    "How are you feeling today?",
    "Can you tell me a fun fact?",
    "What game should we play next?",
)
FIRST_CHUNK = "Oh, I really love pink!"


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


async def _reply(llm: Any, messages: list[Any], key: str) -> dict[str, Any]:
    from engine.text.chunker import ReplyChunker
    from engine.tts.config import TTSConfig

    chunker = ReplyChunker.from_config(TTSConfig())
    t0 = time.perf_counter()
    first_chunk = None
    text = ""
    async for piece in llm.stream(messages, cache_key=key):
        text += piece
        if first_chunk is None and chunker.feed(piece):
            first_chunk = time.perf_counter() - t0
    s = llm.last_call
    decode = (s.generated_tokens - 1) / max(s.elapsed_s - (s.ttft_s or 0.0), 1e-9)
    return {
        "encoded_ms": (s.encoded_s or 0.0) * 1e3,
        "prefill_queued_ms": (s.prefill_queued_s or 0.0) * 1e3,
        "first_token_ms": (s.first_token_s or 0.0) * 1e3,
        "ttft_ms": (s.ttft_s or 0.0) * 1e3,
        "first_chunk_ms": (first_chunk if first_chunk is not None else float("nan")) * 1e3,
        "decode_tok_s": decode,
        "tokens": s.generated_tokens,
        "prompt_tokens": s.prompt_tokens,
        "prefilled_tokens": s.prefilled_tokens,
        "text": text,
    }


def bench_llm(tokenizer: str, repeats: int) -> dict[str, Any]:
    import torch

    from engine.llm.config import LLMConfig
    from engine.llm.transformers_backend import TransformersLLM

    out: dict[str, Any] = {}
    for name, graphs in (("graph", True), ("eager", False)):
        config = LLMConfig.model_validate(
            {
                "model": "random:qwen2.5-1.5b",
                "tokenizer": tokenizer,
                "device": "cuda",
                "dtype": "bfloat16",
                "max_new_tokens": 32,
                "cuda_graphs": graphs,
            }
        )
        t0 = time.perf_counter()
        llm = TransformersLLM(config)
        load_s = time.perf_counter() - t0

        async def run(llm: Any = llm) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            await _reply(llm, [{"role": "user", "content": "warm up"}], "warm")
            cold: list[dict[str, Any]] = []
            warm: list[dict[str, Any]] = []
            for r in range(repeats):
                history: list[Any] = [{"role": "system", "content": SYSTEM}]
                for i, q in enumerate(QUESTIONS[:2]):
                    history.append({"role": "user", "content": q})
                    res = await _reply(llm, list(history), f"conv{r}")
                    (cold if i == 0 else warm).append(res)
                    history.append({"role": "assistant", "content": res["text"]})
            return cold, warm

        cold, warm = asyncio.run(run())
        out[name] = {
            "describe": llm.describe(),
            "load_s": round(load_s, 2),
            **{
                f"{label}_{k}": _median([r[k] for r in rows])
                for label, rows in (("turn1", cold), ("turn2", warm))
                for k in (
                    "encoded_ms",
                    "prefill_queued_ms",
                    "first_token_ms",
                    "ttft_ms",
                    "first_chunk_ms",
                    "decode_tok_s",
                    "prompt_tokens",
                    "prefilled_tokens",
                )
            },
            "sample_reply": cold[0]["text"],
        }
        if graphs:
            out[name].update(_llm_beside_busy(llm, busy=3))
        del llm
        torch.cuda.empty_cache()
    return out


def _llm_beside_busy(llm: Any, busy: int) -> dict[str, Any]:
    """A second turn's reply (its conversation's prefix evaluated) beside ``busy`` threads of pure Python,
    and the torch calls such a reply makes on all threads: the GIL's toll on the LLM (see bench_asr)."""
    from engine.config import ServerConfig

    async def second_turn(key: str) -> dict[str, Any]:
        history: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTIONS[0]},
        ]
        first = await _reply(llm, list(history), key)
        history += [
            {"role": "assistant", "content": first["text"]},
            {"role": "user", "content": QUESTIONS[1]},
        ]
        return await _reply(llm, history, key)

    asyncio.run(second_turn("busy-warm"))
    calls = torch_calls(lambda: asyncio.run(second_turn("busy-count")), all_threads=True)
    with busy_threads(busy, ServerConfig().gil_switch_ms):
        rows = [asyncio.run(second_turn(f"busy{i}")) for i in range(3)]
    return {
        "torch_calls_two_replies": calls,
        "beside_busy_threads": busy,
        **{
            f"beside_busy_turn2_{k}": _median([r[k] for r in rows])
            for k in ("first_token_ms", "first_chunk_ms", "decode_tok_s", "tokens")
        },
    }


def _decode_times(decoder: Any, audio: np.ndarray, repeats: int) -> dict[str, Any]:
    times, enc, gen, toks = [], [], [], []
    text = ""
    for _ in range(repeats):
        t = time.perf_counter()
        d = decoder.decode(audio)
        times.append((time.perf_counter() - t) * 1e3)
        enc.append(d.encode_ms)
        gen.append(d.generate_ms)
        toks.append(d.tokens)
        text = d.text
    return {
        "final_decode_ms": _median(times),
        "encode_ms": _median(enc),
        "decode_steps_ms": _median(gen),
        "tokens": toks[0] if toks else 0,
        "sample_text": text,
    }


def bench_asr(tokenizer: str, repeats: int, busy: int = 3, eager_beside_busy: bool = False) -> dict[str, Any]:
    """The final decode with the encoder as a CUDA graph and eager, each alone, and the graph's (the eager
    one's too with ``eager_beside_busy``) beside ``busy`` threads that hold the GIL whenever they get it
    (the engine's switch interval, 5 ms)."""
    from engine.asr.config import ASRConfig
    from engine.asr.torch_whisper import TorchWhisperASR
    from engine.config import ServerConfig

    out: dict[str, Any] = {"busy_threads": busy}
    rng = np.random.default_rng(0)
    audio = np.concatenate([np.zeros(4000), 0.2 * rng.standard_normal(int(1.6 * 16000)), np.zeros(8000)])
    audio = audio.astype(np.float32)
    out["audio_s"] = round(len(audio) / 16000, 2)
    for name, graphs in (("graph_encoder", True), ("eager_encoder", False)):
        config = ASRConfig.model_validate(
            {
                "backend": "transformers",
                "model": "random:small",
                "tokenizer": tokenizer,
                "device": "cuda",
                "encoder_graphs": graphs,
            }
        )
        t0 = time.perf_counter()
        asr = TorchWhisperASR.load(config)
        row: dict[str, Any] = {"describe": asr.describe(), "load_s": round(time.perf_counter() - t0, 2)}
        asr.decoder.decode(audio)
        row["torch_calls_a_decode"] = torch_calls(functools.partial(asr.decoder.decode, audio))
        row["alone"] = _decode_times(asr.decoder, audio, repeats)
        if graphs or eager_beside_busy:  # the eager one: 31 s a decode on an H100 host (2026-12-08)
            with busy_threads(busy, ServerConfig().gil_switch_ms):
                row["beside_busy"] = _decode_times(asr.decoder, audio, repeats)
        asr.close()
        del asr
        import torch

        torch.cuda.empty_cache()
        out[name] = row
    return out


def bench_tts(voice: str, repeats: int, threads_list: tuple[int, ...] = (1, 4, 8)) -> dict[str, Any]:
    """The first chunk's synthesis on the host's CPU at each thread count, and on the GPU where ONNX Runtime
    has its CUDA provider (onnxruntime-gpu): ``threads_N_first_chunk_ms``, ``cuda_first_chunk_ms``."""
    import onnxruntime

    from engine.progress import silent_progress
    from engine.tts.config import TTSConfig
    from engine.tts.piper_backend import CUDA_PROVIDER, load_piper

    out: dict[str, Any] = {}
    setups = [(f"threads_{n}", "cpu", n) for n in threads_list]
    if CUDA_PROVIDER in onnxruntime.get_available_providers():
        setups.append(("cuda", "cuda", 1))
    for name, device, threads in setups:
        config = TTSConfig(voice=voice, threads=threads, device=device)  # type: ignore[call-arg]
        tts = load_piper(config, silent_progress)

        async def run(tts: Any = tts) -> list[float]:
            await tts.synthesize(FIRST_CHUNK)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                await tts.synthesize(FIRST_CHUNK)
                times.append((time.perf_counter() - t) * 1e3)
            return times

        out[f"{name}_first_chunk_ms"] = _median(asyncio.run(run()))
    out["text"] = FIRST_CHUNK
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", action="store_true")
    ap.add_argument("--asr", action="store_true")
    ap.add_argument("--tts", default="", help="a Piper .onnx voice: time the first chunk's synthesis")
    ap.add_argument(
        "--tts-threads", default="1,4,8", help="the CPU thread counts --tts times (the GPU too where it can)"
    )
    ap.add_argument(
        "--asr-eager-busy", action="store_true", help="also time the eager encoder beside busy threads (slow)"
    )
    ap.add_argument("--tokenizer", default="/var/tmp/idolcast/tokenizer")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    import torch

    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    if args.llm:
        report["llm"] = bench_llm(args.tokenizer, args.repeats)
    if args.asr:
        report["asr"] = bench_asr(args.tokenizer, args.repeats, eager_beside_busy=args.asr_eager_busy)
    if args.tts:
        threads = tuple(int(n) for n in args.tts_threads.split(","))
        report["tts"] = bench_tts(args.tts, args.repeats, threads)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    for stage in ("llm", "asr", "tts"):
        for k, v in report.get(stage, {}).items():
            print(f"{stage} {k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
