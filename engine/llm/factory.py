"""Choose and build the language model from configuration."""

from __future__ import annotations

from engine.llm.base import LLM, LLMError
from engine.llm.config import LLMConfig
from engine.progress import Progress, silent_progress


def resolve_backend(config: LLMConfig) -> str:
    """The backend ``llm.backend`` means here: 'auto' is llama.cpp for a GGUF model on the CPU, transformers
    on an NVIDIA GPU (its CUDA-graph decode) or for other model formats."""
    if config.backend != "auto":
        return config.backend
    from engine.llm.hf_models import pick_device, resolve_source

    source = resolve_source(config.model)
    if source.kind != "gguf" or pick_device(config.device) == "cuda":
        return "transformers"
    return "llama.cpp"


def load_llm(config: LLMConfig, progress: Progress = silent_progress) -> LLM:
    """Build the configured backend. Blocking (the in-process backends load weights): run it in an
    executor. Raises :class:`LLMError` with the key and the reason when it cannot."""
    backend = resolve_backend(config)
    if backend == "llama.cpp":
        from engine.llm.llama_cpp_backend import LlamaCppLLM

        return LlamaCppLLM(config, progress)
    if backend == "transformers":
        from engine.llm.transformers_backend import TransformersLLM

        return TransformersLLM(config, progress)
    if config.backend == "openai":
        from engine.llm.openai_backend import OpenAICompatibleLLM

        return OpenAICompatibleLLM(config)
    raise LLMError(
        f"llm.backend: unknown backend {config.backend!r} (expected 'auto', 'llama.cpp', 'transformers' or "
        "'openai')"
    )


async def close_llm(llm: LLM) -> None:
    """Release what a backend holds open (the HTTP pool of the OpenAI backend, llama.cpp's contexts)."""
    aclose = getattr(llm, "aclose", None)
    if aclose is not None:
        await aclose()
    close = getattr(llm, "close", None)
    if close is not None:
        close()


def describe(config: LLMConfig) -> str:
    """One line for ``idolcast doctor`` without loading anything: what would run, and whether it can."""
    if config.backend == "openai":
        key = "with an API key" if config.api_key else "no API key"
        return f"openai-compatible endpoint {config.base_url}, model {config.model!r} ({key})"
    from engine.llm.hf_models import gguf_cache_dir, resolve_source

    try:
        source = resolve_source(config.model)
        backend = resolve_backend(config)
    except LLMError as e:
        return f"{config.backend}: NOT USABLE: {e}"
    if backend == "llama.cpp":
        import importlib.util

        built = importlib.util.find_spec("llama_cpp") is not None
        state = "llama-cpp-python installed" if built else "NOT USABLE: llama-cpp-python is not installed"
        return f"llama.cpp {source.label} from GGUF {source.gguf_file} ({state}; cpu)"
    where = f"device {config.device}, dtype {config.dtype}"
    if source.kind == "random":
        return f"transformers {source.label}: random weights, benchmarks only ({where})"
    if source.kind == "gguf":
        cached = (gguf_cache_dir(source, config.cache_dir) / "model.safetensors").exists()
        state = "dequantized copy cached" if cached else "first load dequantizes (~25-60 s)"
        return f"transformers {source.label} from GGUF {source.gguf_file} ({state}; {where})"
    if source.kind == "hub":
        return f"transformers {source.location} from the Hugging Face Hub (downloads on first use; {where})"
    return f"transformers {source.location} ({where})"
