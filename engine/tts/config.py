from typing import Literal

from pydantic import BaseModel, Field


class TTSConfig(BaseModel):
    """Speech synthesis (Piper) with phoneme alignments."""

    backend: Literal["piper"] = "piper"
    voice: str = Field(default="bundled:joe", description="'bundled:joe' or a path to a Piper .onnx voice")
    length_scale: float = Field(default=1.0, gt=0.3, le=3.0, description="speaking speed (smaller = faster)")
    speaker_id: int | None = None
    first_chunk_min_words: int = Field(default=2, ge=1, le=20)
    max_chunk_words: int = Field(default=40, ge=5, le=200)
    first_chunk_max_words: int = Field(
        default=4,
        ge=2,
        le=200,
        description="the first chunk is cut after this many words even without punctuation (fast first audio)",
    )
    second_chunk_max_words: int = Field(
        default=10,
        ge=2,
        le=200,
        description="the second chunk also ends at a clause boundary and is cut after this many words: it has "
        "to be written and synthesized while the first plays (~1.4 s for 4 words), or the reply falls silent",
    )
    threads: int = Field(
        default=0,
        ge=0,
        le=64,
        description="ONNX Runtime threads for the voice; 0 = auto: 1 on up to 4 cores (the LLM needs the "
        "others), else half the cores, at most 8 (a short clause on the H200 host: ~200 ms on 1 thread, ~90 ms "
        "on 4, ~60 ms on 8)",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=8,
        description="voice workers, each with its own ONNX session (and tts.threads threads): the engine's "
        "sessions' chunks are synthesized this many at once instead of one after another (for an engine "
        "serving several sessions on a many-core box; 1 on a small machine)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="where the voice runs: 'cuda' = ONNX Runtime's CUDA provider (the onnxruntime-gpu package; "
        "an error where it is missing), 'auto' = CUDA where that provider and a GPU are there, else the CPU",
    )
    spinning: bool = Field(
        default=False,
        description="the voice's ONNX Runtime threads busy-wait between ops (ONNX Runtime's default) instead "
        "of sleeping: no faster on its own, and with several threads it burns their cores while other "
        "sessions need them (docs/PERFORMANCE.md)",
    )
