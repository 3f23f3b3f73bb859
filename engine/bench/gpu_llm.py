"""LLM decode on the GPU: eager ``generate`` against the static-KV CUDA-graph path (GraphDecoder).

    python -m engine.bench.gpu_llm --shapes 0.5B,1.5B,7B --out $OUT/llm.json

Qwen2.5-shaped random-weight models (bf16, N(0, 0.02) weights, nothing downloaded) are built directly on the
device. For each shape it measures, with a random prompt of ``--prompt-len`` tokens:

* eager ``generate`` (greedy, ``--new-tokens`` forced by ``min_new_tokens``): TTFT = ``generate`` of one new
  token; decode tokens/s = (new_tokens - 1) / (time of the full generate - TTFT);
* graph path: TTFT = prefill of the whole prompt + argmax of its logits + the host reading the token; decode
  tokens/s over the remaining new_tokens - 1 replayed steps (argmax fed back on the device, one sync at the
  end), and the same with the host reading every token (as a streaming consumer does); also TTFT when all
  but the last ``--tail`` prompt tokens are already cached (a persona prefix reused across turns);
* parity: teacher-forced ``--parity-steps`` steps after the prompt, per-step relative L2 error of the graph
  path's logits against eager bf16, and of both against an eager float32 run of the same weights.

A short table is printed last; everything goes to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.llm.cuda_graph_decode import GraphDecoder
from engine.llm.cuda_reference import QWEN25_SHAPES, build_qwen2, eager_teacher_forced, rel_err

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _median_time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    return statistics.median(_timed(fn, device)[0] for _ in range(repeats))


def _eager(model: nn.Module, prompt: torch.Tensor, new_tokens: int, repeats: int) -> dict[str, float]:
    device = prompt.device
    mask = torch.ones_like(prompt)
    config: Any = model.config
    eos = int(config.eos_token_id or 0)

    def gen(n: int) -> Callable[[], Any]:
        return lambda: model.generate(  # type: ignore[operator]
            prompt,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )

    gen(4)()  # warm-up
    ttft = _median_time(gen(1), device, repeats)
    full_times = []
    for _ in range(max(1, repeats - 1)):
        t, out = _timed(gen(new_tokens), device)
        assert out.shape[1] == prompt.shape[1] + new_tokens, out.shape
        full_times.append(t)
    full = statistics.median(full_times)
    return {
        "ttft_ms": ttft * 1e3,
        "total_s": full,
        "decode_tok_s": (new_tokens - 1) / max(full - ttft, 1e-9),
        "e2e_tok_s": new_tokens / full,
    }


def _graph(
    dec: GraphDecoder, prompt: torch.Tensor, new_tokens: int, repeats: int, tail: int
) -> dict[str, float]:
    device = prompt.device
    n = prompt.shape[1]

    def ttft_run() -> int:
        dec.reset_to(0)
        return int(dec.prefill(prompt, 0).argmax(-1)[0])

    def ttft_cached() -> int:
        dec.reset_to(n - tail)
        logits, reused = dec.prefill_cached(prompt)
        assert reused == n - tail, reused
        return int(logits.argmax(-1)[0])

    def decode(read_each: bool) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            dec.reset_to(n - 1)
            tok = dec.step(int(prompt[0, -1])).argmax(-1)  # the last prompt token again, at its position
            toks: list[Any] = []
            for _ in range(new_tokens - 1):
                tok = dec.step(tok).argmax(-1)
                toks.append(int(tok[0]) if read_each else tok)
            return toks

        return run

    ttft_run()  # warm-up (allocator, cuBLAS handles for the prefill shapes)
    ttft = _median_time(ttft_run, device, repeats)
    ttft_c = _median_time(ttft_cached, device, repeats)
    decode(False)()
    t_dec = _median_time(decode(False), device, repeats)
    t_dec_sync = _median_time(decode(True), device, repeats)
    # Each decode run is new_tokens replayed steps (the first re-feeds the last prompt token).
    return {
        "ttft_ms": ttft * 1e3,
        "ttft_cached_prefix_ms": ttft_c * 1e3,
        "step_ms": t_dec / new_tokens * 1e3,
        "decode_tok_s": new_tokens / t_dec,
        "decode_tok_s_host_reads_each": new_tokens / t_dec_sync,
        "e2e_tok_s": new_tokens / (ttft + t_dec * (new_tokens - 1) / new_tokens),
    }


def _parity(
    model: nn.Module, dec: GraphDecoder, prompt: torch.Tensor, steps: int, seed: int
) -> dict[str, Any]:
    config: Any = model.config
    vocab = int(config.vocab_size)
    gen = torch.Generator().manual_seed(seed + 1)
    feed = torch.randint(0, vocab, (1, steps), generator=gen).to(prompt.device)
    ref_first, ref_steps = eager_teacher_forced(model, prompt, feed)
    dec.reset_to(0)
    got = [dec.prefill(prompt, 0).float()]
    got += [dec.step(feed[:, i]).float() for i in range(steps)]
    ref = [ref_first.float(), *(r.float() for r in ref_steps)]
    errs = [rel_err(g, r) for g, r in zip(got, ref, strict=True)]
    top1 = [bool((g.argmax(-1) == r.argmax(-1)).all()) for g, r in zip(got, ref, strict=True)]
    out: dict[str, Any] = {
        "steps": steps,
        "graph_vs_eager_rel_err_per_step": errs,
        "graph_vs_eager_rel_err_max": max(errs),
        "graph_vs_eager_rel_err_mean": statistics.fmean(errs),
        "top1_agree": sum(top1) / len(top1),
    }
    # Yardstick 1: HF's own eager-attention implementation against its SDPA one (same weights, same dtype).
    try:
        model.set_attn_implementation("eager")  # type: ignore[operator]
        a_first, a_steps = eager_teacher_forced(model, prompt, feed)
        alt = [a_first.float(), *(r.float() for r in a_steps)]
        e_alt = [rel_err(a, r) for a, r in zip(alt, ref, strict=True)]
        out["hf_eager_attn_vs_hf_sdpa_rel_err_max"] = max(e_alt)
        out["hf_eager_attn_vs_hf_sdpa_rel_err_mean"] = statistics.fmean(e_alt)
    except Exception as exc:  # an API difference must not cost the rest of the run
        out["hf_eager_attn_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            model.set_attn_implementation("sdpa")  # type: ignore[operator]
        except Exception:
            pass
    if prompt.device.type == "cuda" and next(model.parameters()).dtype != torch.float32:
        # Yardstick 2: how far eager bf16 itself is from float32 on the same weights.
        del dec
        model.float()
        f_first, f_steps = eager_teacher_forced(model, prompt, feed)
        f32 = [f_first.float(), *(r.float() for r in f_steps)]
        e_eager = [rel_err(r, f) for r, f in zip(ref, f32, strict=True)]
        e_graph = [rel_err(g, f) for g, f in zip(got, f32, strict=True)]
        out["eager_bf16_vs_fp32_rel_err_max"] = max(e_eager)
        out["eager_bf16_vs_fp32_rel_err_mean"] = statistics.fmean(e_eager)
        out["graph_bf16_vs_fp32_rel_err_max"] = max(e_graph)
        out["graph_bf16_vs_fp32_rel_err_mean"] = statistics.fmean(e_graph)
    return out


def bench_shape(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    res: dict[str, Any] = {"shape": shape}
    t_build, model = _timed(lambda: build_qwen2(shape, device, dtype, seed=args.seed), device)
    res["build_s"] = t_build
    res["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    config: Any = model.config
    vocab = int(config.vocab_size)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, vocab, (1, args.prompt_len), generator=gen).to(device)
    res["eager"] = _eager(model, prompt, args.new_tokens, args.repeats)
    print(f"[{shape}] eager {res['eager']}", flush=True)
    max_len = args.prompt_len + max(args.new_tokens, args.parity_steps) + 8
    t_cap, dec = _timed(lambda: GraphDecoder(model, max_len=max_len), device)
    res["graph_capture_s"] = t_cap
    res["graph_used"] = dec.use_graph
    tail = max(1, min(args.tail, args.prompt_len - 1))
    res["graph"] = _graph(dec, prompt, args.new_tokens, args.repeats, tail)
    print(f"[{shape}] graph {res['graph']}", flush=True)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    res["graph"]["weights_read_gb_s"] = weight_bytes / (res["graph"]["step_ms"] * 1e-3) / 1e9
    res["speedup_decode"] = res["graph"]["decode_tok_s"] / res["eager"]["decode_tok_s"]
    res["speedup_ttft"] = res["eager"]["ttft_ms"] / res["graph"]["ttft_ms"]
    res["parity"] = _parity(model, dec, prompt, args.parity_steps, args.seed)
    print(f"[{shape}] parity max {res['parity']['graph_vs_eager_rel_err_max']:.3g}", flush=True)
    if device.type == "cuda":
        res["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return res


def _env(device: torch.device) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def _table(results: list[dict[str, Any]]) -> str:
    head = (
        "| shape | eager TTFT ms | graph TTFT ms | graph TTFT, cached prefix ms | eager tok/s | graph tok/s "
        "| graph tok/s (host reads each) | decode speedup | graph vs eager: rel err max (mean) "
        "| HF eager-attn vs HF sdpa max | eager bf16 vs fp32 max | graph bf16 vs fp32 max | top-1 agree |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['shape']} | error: {r['error']} |")
            continue
        e, g, p = r["eager"], r["graph"], r["parity"]
        yard = p.get("eager_bf16_vs_fp32_rel_err_max")
        spread = p.get("hf_eager_attn_vs_hf_sdpa_rel_err_max")
        g32 = p.get("graph_bf16_vs_fp32_rel_err_max")
        lines.append(
            f"| {r['shape']} | {e['ttft_ms']:.1f} | {g['ttft_ms']:.1f} | {g['ttft_cached_prefix_ms']:.1f} "
            f"| {e['decode_tok_s']:.1f} | {g['decode_tok_s']:.1f} | {g['decode_tok_s_host_reads_each']:.1f} "
            f"| {r['speedup_decode']:.1f}x | {p['graph_vs_eager_rel_err_max']:.2e} "
            f"({p['graph_vs_eager_rel_err_mean']:.2e}) | {'-' if spread is None else f'{spread:.2e}'} "
            f"| {'-' if yard is None else f'{yard:.2e}'} | {'-' if g32 is None else f'{g32:.2e}'} "
            f"| {p['top1_agree']:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="0.5B,1.5B,7B", help=f"comma list of {sorted(QWEN25_SHAPES)}")
    ap.add_argument("--out", type=Path, default=None, help="JSON results file")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--prompt-len", type=int, default=400)
    ap.add_argument("--tail", type=int, default=40, help="uncached prompt tail for the cached-prefix TTFT")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--parity-steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    device = torch.device(args.device)
    report: dict[str, Any] = {"env": _env(device), "args": {k: str(v) for k, v in vars(args).items()}}
    results: list[dict[str, Any]] = []
    report["results"] = results
    for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        try:
            results.append(bench_shape(shape, args))
        except Exception as exc:  # keep going: one device call must bring back every shape it can
            traceback.print_exc()
            results.append({"shape": shape, "error": f"{type(exc).__name__}: {exc}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["env"]))
    print(_table(results))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
