from pydantic import BaseModel, Field


class VADConfig(BaseModel):
    """Voice activity detection (silero, ONNX) on the host's 16 kHz mic audio."""

    threshold: float = Field(0.5, ge=0.05, le=0.95, description="speech probability that starts speech")
    end_of_turn_silence_ms: int = Field(
        400, ge=100, le=5000, description="silence after speech that ends the host's turn"
    )
    min_speech_ms: int = Field(150, ge=0, le=2000, description="speech shorter than this is ignored")
    barge_in_min_speech_ms: int = Field(
        200, ge=0, le=2000, description="speech this long while the idol talks interrupts her"
    )
