"""Per-turn timestamps on the session clock, and the Prometheus histograms built from them."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields

from prometheus_client import CollectorRegistry, Counter, Histogram

log = logging.getLogger(__name__)

STAGES = (
    "speech_end",  # the host stopped speaking (VAD, from the audio itself)
    "end_of_turn",  # the silence was long enough: the turn is over
    "asr_final",  # the final transcript is known
    "llm_first_token",
    "first_chunk_text",  # the first clause is ready for TTS
    "tts_first_audio",  # its audio is synthesized
    "first_audio_sent",  # the first reply audio frame left the audio track
)


@dataclass
class TurnTimings:
    turn_id: int
    source: str
    user_text: str = ""
    speech_end: float | None = None
    end_of_turn: float | None = None
    asr_final: float | None = None
    llm_first_token: float | None = None
    first_chunk_text: float | None = None
    tts_first_audio: float | None = None
    first_audio_sent: float | None = None
    interrupted: bool = False
    early_reply: bool = False  # the reply started on the pause, before the end of the turn
    llm: dict[str, float] | None = None  # the in-process model's work (see reply._llm_stats)
    turn_end: dict[str, object] | None = None  # the pause's end-of-turn judgement (session/turn_end.py)
    asr: dict[str, float | bool] | None = None  # the final transcript's costs (asr/stream.py final_cost)
    # silences inside the reply, ms: a chunk that reached the playout after the one before had ended
    silences_ms: list[float] = field(default_factory=list)
    error: str | None = None

    def mark(self, stage: str, t: float) -> None:
        if stage not in STAGES:
            raise KeyError(stage)
        if getattr(self, stage) is None:
            setattr(self, stage, t)

    @property
    def origin(self) -> float | None:
        """The turn's zero: end of speech for voice, arrival of the text otherwise."""
        return self.speech_end if self.speech_end is not None else self.end_of_turn

    def relative_ms(self) -> dict[str, float]:
        """Milliseconds from the turn's origin to each stage that happened."""
        o = self.origin
        if o is None:
            return {}
        out: dict[str, float] = {}
        for name in STAGES:
            v = getattr(self, name)
            if v is not None:
                out[name] = round((v - o) * 1000.0, 1)
        return out

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["relative_ms"] = self.relative_ms()
        return d


class TurnMetrics:
    """Prometheus histograms: ms from the turn's origin to each stage."""

    BUCKETS = (50, 100, 200, 300, 400, 500, 600, 800, 1000, 1200, 1500, 2000, 3000, 5000, 10000)

    def __init__(self, registry: CollectorRegistry) -> None:
        self.stage_ms = Histogram(
            "idolcast_turn_stage_ms",
            "Milliseconds from the end of the host's speech (or the text's arrival) to each stage",
            ["stage", "source"],
            buckets=self.BUCKETS,
            registry=registry,
        )
        self.turns = Counter(
            "idolcast_turns_total", "Completed turns", ["source", "outcome"], registry=registry
        )

    def observe(self, timings: TurnTimings) -> None:
        for stage, ms in timings.relative_ms().items():
            if stage != "speech_end":
                self.stage_ms.labels(stage=stage, source=timings.source).observe(ms)
        outcome = "error" if timings.error else ("interrupted" if timings.interrupted else "ok")
        self.turns.labels(source=timings.source, outcome=outcome).inc()
        llm = timings.llm or {}
        log.info(
            "turn %d (%s) %s%s: %s%s%s",
            timings.turn_id,
            timings.source,
            outcome,
            " (early reply)" if timings.early_reply else "",
            " ".join(f"{k}={v:.0f}ms" for k, v in timings.relative_ms().items()),
            (
                f" | prompt {llm['prompt_ms']:.0f}ms, llm prefilled {llm['prefilled_tokens']:.0f}/"
                f"{llm['prompt_tokens']:.0f} tokens ({llm.get('shifted_tokens', 0):.0f} moved), first piece {llm['ttft_ms']:.0f}ms, "
                f"{llm['tokens_per_s']:.1f} tok/s"
                if llm
                else ""
            ),
            asr_note(timings.asr),
        )


def asr_note(cost: dict[str, float | bool] | None) -> str:
    """The final transcript's costs for the turn's log line ('' where the stream told none)."""
    if not cost:
        return ""
    how = "the pause's decode" if cost.get("speculated") else "decoded at the end"
    parts = [
        f"{name.removesuffix('_ms')} {cost[name]:.0f}ms"
        for name in ("queued_ms", "decode_ms", "encode_ms", "generate_ms")
        if name in cost
    ]
    if "tokens" in cost:
        parts.append(f"{cost['tokens']:.0f} tokens")
    return f" | asr final after {cost.get('waited_ms', 0):.0f}ms ({how}: {', '.join(parts)})"


STAGE_FIELDS = tuple(f.name for f in fields(TurnTimings) if f.name in STAGES)
