"""Choose and build the language model from configuration."""

from __future__ import annotations

from engine.llm.base import LLM, LLMError
from engine.llm.config import LLMConfig
from engine.progress import Progress, silent_progress


def load_llm(config: LLMConfig, progress: Progress = silent_progress) -> LLM:
    """Build the configured backend. Blocking (the transformers backend loads weights): run it in an
    executor. Raises :class:`LLMError` with the key and the reason when it cannot."""
    if config.backend == "transformers":
        from engine.llm.transformers_backend import TransformersLLM

        return TransformersLLM(config, progress)
    if config.backend == "openai":
        from engine.llm.openai_backend import OpenAICompatibleLLM

        return OpenAICompatibleLLM(config)
    raise LLMError(f"llm.backend: unknown backend {config.backend!r} (expected 'transformers' or 'openai')")


async def close_llm(llm: LLM) -> None:
    """Release what a backend holds open (the HTTP pool of the OpenAI backend); a no-op otherwise."""
    aclose = getattr(llm, "aclose", None)
    if aclose is not None:
        await aclose()


def describe(config: LLMConfig) -> str:
    """One line for ``idolcast doctor`` without loading anything: what would run, and whether it can."""
    if config.backend == "openai":
        key = "with an API key" if config.api_key else "no API key"
        return f"openai-compatible endpoint {config.base_url}, model {config.model!r} ({key})"
    from engine.llm.hf_models import gguf_cache_dir, resolve_source

    try:
        source = resolve_source(config.model)
    except LLMError as e:
        return f"transformers: NOT USABLE: {e}"
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
