from typing import Literal

from pydantic import BaseModel, Field


class VADConfig(BaseModel):
    """Voice activity detection (silero, ONNX) on the host's 16 kHz mic audio."""

    threshold: float = Field(0.5, ge=0.05, le=0.95, description="speech probability that starts speech")
    hysteresis: float = Field(
        0.15, ge=0.0, le=0.5, description="speech goes on until the probability drops below threshold - this"
    )
    pause_ms: int = Field(
        64,
        ge=32,
        le=2000,
        description="silence that counts as a pause: the moment to decode speculatively and judge the words "
        "(the decision has to be in before end_of_turn_finished_ms to help)",
    )
    end_of_turn_silence_ms: int = Field(
        400, ge=100, le=5000, description="silence after speech that ends the host's turn"
    )
    end_of_turn_finished_ms: int = Field(
        200,
        ge=0,
        le=5000,
        description="silence that ends the turn when the words so far read as finished (see turn_detector): "
        "she answers sooner; 0 = always end_of_turn_silence_ms",
    )
    turn_detector: Literal["auto", "llm", "punctuation", "off"] = Field(
        "auto",
        description="how a pause's speculative transcript is judged finished: 'llm' = the reply LLM's "
        "probability of its end-of-turn marker after the words (llama.cpp, transformers); 'punctuation' = "
        "ends in '?' or '!'; 'auto' = llm where the backend can score, else punctuation",
    )
    end_of_turn_threshold: float = Field(
        0.05,
        gt=0.0,
        lt=1.0,
        description="the LLM's end-of-turn probability at or above which the words count as finished",
    )
    end_refine_ms: int = Field(
        160,
        ge=0,
        le=500,
        description="place the end of speech up to this much before silero flags silence, where the voice's "
        "loudness fell (silero lags the voice by 50-140 ms); the pause and end-of-turn silences count from it. "
        "0 = silero's time",
    )
    end_quiet_db: float = Field(
        -35.0, ge=-60.0, le=-6.0, description="a block this far below the turn's loudest is quiet"
    )
    early_reply: bool = Field(
        True,
        description="start the reply on the speculative transcript at the pause; it stays silent until "
        "the end of the turn confirms it, and is dropped if the host speaks again",
    )
    barge_in_full_silence: bool = Field(
        True,
        description="a turn that interrupted her ends only on the whole end_of_turn_silence_ms, never on "
        "end_of_turn_finished_ms: an interjection ('Wait, stop for a second.') can read as finished at its "
        "first pause and go on after it",
    )
    continue_within_ms: int = Field(
        1000,
        ge=0,
        le=5000,
        description="speech that starts this soon after the end of the host's turn and cuts her answer to it "
        "continues that turn: the answer is dropped and his words are answered together with the new ones "
        "(a sentence that read as finished at a pause: 'Which one do you like better, cats or dogs?'); "
        "0 = the new words are a turn of their own",
    )
    min_speech_ms: int = Field(150, ge=0, le=2000, description="speech shorter than this is ignored")
    barge_in_min_speech_ms: int = Field(
        64,
        ge=0,
        le=2000,
        description="speech this long while the idol talks interrupts her, counted in the VAD's 32 ms "
        "windows (shorter than a turn start, so she stops fast; a cough may stop her too)",
    )
