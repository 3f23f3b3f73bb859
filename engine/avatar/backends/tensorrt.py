"""TensorRT: engines built from the exported ONNX graph, with a manifest saying what each plan is for.

``build_trt_plans`` (run by ``idolcast build-trt`` on the GPU machine) writes
``<character>-<WxH>-b<batch>-<precision>.plan`` files and ``manifest.json``
(GPU name, TensorRT version, resolution, batch, precision, ONNX hash) into
``trt_plans/``. :meth:`TensorRTBackend.from_plans` loads the plans that match
this GPU, TensorRT version, character and profile, and says precisely why when
none does. ``tensorrt`` is imported lazily: it is not a dependency elsewhere.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.avatar.backends.base import BackendUnavailable
from engine.avatar.character import Character
from engine.avatar.export import INPUT_NAME, OUTPUT_NAME, export_onnx, onnx_hash
from engine.avatar.generator import FrameGenerator
from engine.avatar.loaders import load_character
from engine.avatar.params import NUM_PARAMS
from engine.avatar.profiles import profile_name, profile_size

MANIFEST = "manifest.json"


def _import_trt() -> Any:
    try:
        import tensorrt as trt
    except ImportError as e:
        raise BackendUnavailable(
            f"the tensorrt Python package does not import ({e}); install NVIDIA TensorRT (pip install tensorrt) "
            "on a CUDA machine"
        ) from e
    return trt


def _gpu_name() -> str:
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable("CUDA is not available, so no TensorRT engine can run here")
    return str(torch.cuda.get_device_name(0))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "character"


def build_trt_plans(
    profiles: list[str],
    batches: list[int],
    precision: str = "fp16",
    out_dir: str | Path = "trt_plans",
    character: str = "builtin:default",
    workspace_gib: float = 4.0,
) -> list[dict[str, Any]]:
    """Export and build one engine per (profile, batch); returns the manifest entries written."""
    if precision not in ("fp16", "fp32"):
        raise ValueError("precision must be 'fp16' or 'fp32'")
    trt = _import_trt()
    gpu = _gpu_name()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    char = load_character(character)
    logger = trt.Logger(trt.Logger.WARNING)
    manifest_path = out / MANIFEST
    entries: list[dict[str, Any]] = (
        json.loads(manifest_path.read_text())["plans"] if manifest_path.exists() else []
    )
    built = []
    for prof in profiles:
        gen = FrameGenerator(char, prof)
        for batch in batches:
            onnx_bytes = export_onnx(gen, batch)
            builder = trt.Builder(logger)
            network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
            parser = trt.OnnxParser(network, logger)
            if not parser.parse(onnx_bytes):
                errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
                raise RuntimeError(
                    f"TensorRT could not parse the generator graph ({prof}, batch {batch}): {errors}"
                )
            config = builder.create_builder_config()
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
            if precision == "fp16":
                config.set_flag(trt.BuilderFlag.FP16)
            t0 = time.perf_counter()
            plan = builder.build_serialized_network(network, config)
            if plan is None:
                raise RuntimeError(f"TensorRT failed to build an engine for {prof}, batch {batch}")
            w, h = gen.width, gen.height
            fname = f"{_slug(gen.name)}-{w}x{h}-b{batch}-{precision}.plan"
            (out / fname).write_bytes(bytes(plan))
            entry = {
                "file": fname,
                "character": character,
                "gpu": gpu,
                "tensorrt": trt.__version__,
                "width": w,
                "height": h,
                "batch": batch,
                "precision": precision,
                "onnx_sha256_16": onnx_hash(onnx_bytes),
                "build_s": round(time.perf_counter() - t0, 1),
            }
            entries = [e for e in entries if e.get("file") != fname] + [entry]
            built.append(entry)
    manifest_path.write_text(json.dumps({"plans": entries}, indent=2))
    return built


def find_plans(
    character: str,
    width: int,
    height: int,
    plan_dir: str | Path,
    gpu: str,
    trt_version: str,
    precision: str | None = None,
) -> list[dict[str, Any]]:
    """Manifest entries usable here, or BackendUnavailable saying exactly what did not match."""
    path = Path(plan_dir) / MANIFEST
    if not path.exists():
        raise BackendUnavailable(f"no {path}: build plans with `idolcast build-trt` on this GPU first")
    try:
        entries = json.loads(path.read_text())["plans"]
    except (ValueError, KeyError) as e:
        raise BackendUnavailable(f"{path} is not a plan manifest: {e}") from e
    checks = [
        ("character", character),
        ("width", width),
        ("height", height),
        ("gpu", gpu),
        ("tensorrt", trt_version),
    ]
    if precision:
        checks.append(("precision", precision))
    ok: list[dict[str, Any]] = []
    misses: list[str] = []
    for entry in entries:
        wrong = [f"{k}={entry.get(k)!r} (need {v!r})" for k, v in checks if entry.get(k) != v]
        if not (Path(plan_dir) / str(entry.get("file"))).exists():
            wrong.append("plan file missing")
        if wrong:
            misses.append(f"{entry.get('file')}: {', '.join(wrong)}")
        else:
            ok.append(entry)
    if not ok:
        why = "; ".join(misses) or "the manifest lists no plans"
        raise BackendUnavailable(f"no TensorRT plan in {plan_dir} matches {width}x{height} here: {why}")
    return ok


class TensorRTBackend:
    """Deserialized TensorRT engines (one per batch size), executed on torch CUDA tensors."""

    name = "tensorrt"

    def __init__(
        self,
        character: Character,
        profile: str | tuple[int, int],
        entries: list[dict[str, Any]],
        plan_dir: str | Path,
    ) -> None:
        import torch

        trt = _import_trt()
        self.width, self.height = profile_size(profile)
        self.profile = profile_name(self.width, self.height)
        self._torch = torch
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engines: dict[int, tuple[Any, Any, Any, Any]] = {}
        for e in entries:
            engine = self._runtime.deserialize_cuda_engine((Path(plan_dir) / e["file"]).read_bytes())
            if engine is None:
                raise BackendUnavailable(f"{e['file']}: TensorRT could not deserialize the plan")
            ctx = engine.create_execution_context()
            b = int(e["batch"])
            inp = torch.zeros(b, NUM_PARAMS, device="cuda")
            out = torch.zeros(b, 4, self.height, self.width, device="cuda")
            ctx.set_tensor_address(INPUT_NAME, inp.data_ptr())
            ctx.set_tensor_address(OUTPUT_NAME, out.data_ptr())
            self._engines[b] = (engine, ctx, inp, out)
        self.batches = sorted(self._engines)
        del character

    @classmethod
    def from_plans(
        cls,
        character: Character | str,
        profile: str | tuple[int, int],
        plan_dir: str | Path = "trt_plans",
        character_key: str = "builtin:default",
    ) -> TensorRTBackend:
        trt = _import_trt()
        w, h = profile_size(profile)
        char = load_character(character) if isinstance(character, str) else character
        key = character if isinstance(character, str) else character_key
        entries = find_plans(key, w, h, plan_dir, _gpu_name(), trt.__version__)
        return cls(char, profile, entries, plan_dir)

    def render_tensor(self, params: np.ndarray) -> Any:
        torch = self._torch
        p = torch.as_tensor(np.asarray(params, dtype=np.float32)).reshape(-1, NUM_PARAMS)
        b = p.shape[0]
        if b not in self._engines:
            raise ValueError(
                f"no TensorRT plan for batch {b} (built: {self.batches}); build one with idolcast build-trt"
            )
        _, ctx, inp, out = self._engines[b]
        inp.copy_(p, non_blocking=True)
        stream = torch.cuda.current_stream()
        if not ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        from engine.avatar.generator import to_uint8

        return to_uint8(out)

    def render(self, params: np.ndarray) -> np.ndarray:
        frames = self.render_tensor(params)
        result: np.ndarray = frames.cpu().numpy()
        return result
