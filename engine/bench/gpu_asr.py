"""Whisper ASR on the GPU: eager ``generate`` against the static-KV CUDA-graph path (WhisperGraphDecoder).

    python -m engine.bench.gpu_asr --shapes tiny,small,large-v3-turbo --out $OUT/asr.json

Random-weight ``WhisperForConditionalGeneration`` models of the published shapes (fp16 by default, N(0, 0.02)
weights, nothing downloaded) are built on the device. The input is random log-mel features already on the
device (feature extraction is not timed). Final-transcript latency = encoder + ``--steps`` new tokens after
the 4-token prompt (sot, en, transcribe, notimestamps), no EOS (random weights): fixed work.

* eager: ``model.generate(input_features, decoder_input_ids=prompt, max_new_tokens=steps,
  min_new_tokens=steps)`` on a 30 s window (HF's encoder rejects any other length);
* graph: own encoder forward (the model's layers; positional table sliced) + cross K/V + greedy replays of
  one captured step; 30 s window, and a 10 s window (1,000 frames);
* parity: teacher-forced over prompt + ``--steps`` tokens (the eager greedy output), per-step relative L2
  error of the graph path's logits against HF's eager forward with its cache (same dtype), and of both against
  a float32 eager run of the same weights; top-1 agreement; greedy ids of both paths compared.

Times are CUDA-event medians over ``--repeats`` runs after warm-up. JSON to ``--out``; a table is printed.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from engine.asr.cuda_whisper_graph import (
    N_FRAMES,
    WhisperGraphDecoder,
    build_whisper,
    eager_teacher_forced,
    graph_teacher_forced,
    prompt_ids_for,
    rel_err,
)

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _time(fn: Callable[[], Any], repeats: int, warmup: int, device: torch.device) -> dict[str, float]:
    """Median/min/max milliseconds of ``fn`` (CUDA events on CUDA, else perf_counter)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "repeats": float(repeats),
    }


def _hf_accepts(model: nn.Module, features: torch.Tensor) -> str:
    """'yes', or HF's error message, for an input of another length than 3,000 frames."""
    try:
        with torch.no_grad():
            encoder: Any = cast(Any, model).model.encoder
            encoder(features)
        return "yes"
    except ValueError as exc:
        return f"no: {exc}"


def bench_shape(
    shape: str, device: torch.device, dtype: torch.dtype, steps: int, repeats: int, parity: bool
) -> dict[str, Any]:
    res: dict[str, Any] = {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "steps": steps}
    t0 = time.perf_counter()
    model = build_whisper(shape, device, dtype)
    m: Any = model
    cfg: Any = m.config
    res["build_s"] = time.perf_counter() - t0
    res["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    mels = int(cfg.num_mel_bins)
    prompt = prompt_ids_for(model)
    res["prompt"] = prompt
    gen = torch.Generator(device=device).manual_seed(0)
    feats30 = torch.randn(1, mels, N_FRAMES, generator=gen, device=device).to(dtype)
    feats10 = feats30[:, :, :1000].contiguous()
    prompt_t = torch.tensor([prompt], device=device)
    warm = 2

    def eager_generate() -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = m.generate(
                input_features=feats30,
                decoder_input_ids=prompt_t,
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                num_beams=1,
                return_timestamps=False,
            )
        return out

    def eager_encoder() -> None:
        with torch.no_grad():
            m.model.encoder(feats30)

    res["eager_generate"] = _time(eager_generate, max(3, repeats // 3), warm, device)
    res["eager_encoder_30s"] = _time(eager_encoder, repeats, warm, device)
    eager_ids = eager_generate()[:, -steps:]
    res["hf_accepts_10s_features"] = _hf_accepts(model, feats10)

    t0 = time.perf_counter()
    dec = WhisperGraphDecoder(model, max_len=len(prompt) + steps)
    dec.capture(N_FRAMES // 2)
    dec.capture(1000 // 2)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    res["graph_capture_s"] = time.perf_counter() - t0

    def graph_full(feats: torch.Tensor) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            dec.set_encoder(dec.encode(feats))
            return dec.greedy(prompt, steps)

        return run

    def encode_only(feats: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            dec.set_encoder(dec.encode(feats))

        return run

    res["graph_total_30s"] = _time(graph_full(feats30), repeats, warm, device)
    res["graph_total_10s"] = _time(graph_full(feats10), repeats, warm, device)
    res["graph_encoder_30s"] = _time(encode_only(feats30), repeats, warm, device)
    res["graph_encoder_10s"] = _time(encode_only(feats10), repeats, warm, device)
    dec.set_encoder(dec.encode(feats30))
    res["graph_decode_only_30s"] = _time(lambda: dec.greedy(prompt, steps), repeats, warm, device)
    graph_ids = graph_full(feats30)()
    res["greedy_ids_equal"] = int((graph_ids == eager_ids).sum()), int(eager_ids.numel())
    res["speedup_total_30s"] = res["eager_generate"]["median_ms"] / res["graph_total_30s"]["median_ms"]
    # Encoder parity: own forward vs HF's (30 s).
    with torch.no_grad():
        res["encoder_rel_err"] = rel_err(dec.encode(feats30), m.model.encoder(feats30).last_hidden_state)

    if parity:
        feed = torch.cat([prompt_t, eager_ids], dim=1)[:, : len(prompt) + steps - 1]
        ref = eager_teacher_forced(model, feats30, feed)
        got = graph_teacher_forced(dec, feats30, feed)
        errs = [rel_err(got[i], ref[i]) for i in range(feed.shape[1])]
        top1 = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
        model32 = copy.deepcopy(model).float()
        ref32 = eager_teacher_forced(model32, feats30.float(), feed)
        del model32
        res["parity"] = {
            "steps": feed.shape[1],
            "graph_vs_eager_max": max(errs),
            "graph_vs_eager_mean": statistics.fmean(errs),
            "top1_agreement": top1,
            "eager_vs_fp32_max": max(rel_err(ref[i], ref32[i]) for i in range(feed.shape[1])),
            "graph_vs_fp32_max": max(rel_err(got[i], ref32[i]) for i in range(feed.shape[1])),
        }
    # (dec and model are freed on return; the closures above hold them until then)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| shape | eager generate 30 s (ms) | eager encoder 30 s | graph total 30 s | graph total 10 s "
        "| graph encoder 30 s / 10 s | graph 24-step decode | speedup 30 s | parity max rel err (fp32 floor) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['shape']} | error: {r['error']} |")
            continue
        p = r.get("parity", {})
        rows.append(
            f"| {r['shape']} | {r['eager_generate']['median_ms']:.1f} | {r['eager_encoder_30s']['median_ms']:.1f} "
            f"| {r['graph_total_30s']['median_ms']:.1f} | {r['graph_total_10s']['median_ms']:.1f} "
            f"| {r['graph_encoder_30s']['median_ms']:.1f} / {r['graph_encoder_10s']['median_ms']:.1f} "
            f"| {r['graph_decode_only_30s']['median_ms']:.1f} | {r['speedup_total_30s']:.1f}x "
            f"| {p.get('graph_vs_eager_max', float('nan')):.2e} ({p.get('eager_vs_fp32_max', float('nan')):.2e}) |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="tiny,small,large-v3-turbo")
    ap.add_argument("--dtype", default="float16", choices=sorted(DTYPES))
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-parity", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    results: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        try:
            r = bench_shape(shape.strip(), device, dtype, args.steps, args.repeats, not args.no_parity)
        except Exception as exc:  # keep the other shapes' numbers
            traceback.print_exc()
            r = {"shape": shape, "error": f"{type(exc).__name__}: {exc}"}
        results.append(r)
        print(json.dumps(r), flush=True)
    table = _table(results)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"info": info, "results": results, "table": table}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
