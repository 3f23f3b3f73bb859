"""``idolcast bench --turn-end``: how well the end of turn is judged from the words, on a labelled set.

Each utterance is synthesized in several host voices (engine/bench/voices.py), transcribed by the engine's
own ASR as the pause's speculative decode would be, and judged by each detector: the LLM's end-of-turn
probability in the conversation's context (the engine's way, engine/session/turn_end.py) at several
thresholds, and the old punctuation rule. *Finished* utterances are whole questions, requests and
statements; *cut-off* ones stop mid-sentence (the same sentences cut at about half their words, and
phrases that trail off). A false early end (a cut-off utterance judged finished) makes her talk over the
host; a missed finished one only costs the full silence.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.bench.voices import BY_NAME, apply_style, synthesis_scale
from engine.config import Settings
from engine.events import UserTurn
from engine.llm.prompt import SimplePromptProvider
from engine.progress import ConsoleProgress
from engine.session.turn_end import FINISHED_ENDINGS, ends_dangling

FINISHED = (
    "What is your favorite color?",
    "How are you feeling today?",
    "Can you tell me a fun fact?",
    "What game should we play next?",
    "Do you like music?",
    "Where would you like to travel?",
    "Tell me a joke about cats.",
    "Please say hello to everyone in the chat.",
    "What do you think about pineapple on pizza?",
    "Sing us a short song about the ocean.",
    "I just got home from work and I am really tired.",
    "We reached one thousand followers today!",
    "Thanks for the great stream, everyone.",
    "Which one do you like better, cats or dogs?",
    "Can you recommend a good book to read?",
    "My favorite food is ramen.",
)
TRAILING = (
    "So the thing about my brother is",
    "I was thinking that maybe we could",
    "Yesterday I went to the store and",
    "What I really wanted to ask you was",
    "Okay so if you could pick one",
    "The reason I started streaming is because",
    "Let me tell you about the time when",
    "I don't know if you remember but",
)
STYLES = ("plain", "fast", "high", "slow", "noisy", "low")
THRESHOLDS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)


def cut_off(sentence: str) -> str:
    """The first ~55 % of a sentence's words, without its closing punctuation."""
    words = sentence.rstrip("?.!").split()
    return " ".join(words[: max(2, round(len(words) * 0.55))])


def labelled_set() -> list[tuple[str, bool]]:
    items = [(t, True) for t in FINISHED]
    items += [(cut_off(t), False) for t in FINISHED]
    items += [(t, False) for t in TRAILING]
    return items


@dataclass
class Judged:
    text: str
    style: str
    finished: bool  # the label
    heard: str  # what the ASR made of it
    p: float
    llm_ms: float
    punctuation: bool


async def run_turn_end_bench(settings: Settings, styles: tuple[str, ...] = STYLES) -> dict[str, Any]:
    from scipy.signal import resample_poly

    from engine.asr.factory import load_asr
    from engine.llm.base import TurnEndScorer
    from engine.llm.factory import load_llm
    from engine.tts.piper_backend import load_piper

    progress = ConsoleProgress()
    asr = await asyncio.to_thread(load_asr, settings.asr, progress)
    llm = await asyncio.to_thread(load_llm, settings.llm, progress)
    if not isinstance(llm, TurnEndScorer):
        raise SystemExit(f"the configured LLM ({llm.describe()}) cannot score the end of a turn")
    voices: dict[float, Any] = {}
    prompt = SimplePromptProvider(settings.persona.system_prompt)
    items = labelled_set()
    judged: list[Judged] = []
    empty: list[dict[str, str]] = []
    for k, name in enumerate(styles):
        style = BY_NAME[name]
        scale = round(synthesis_scale(style), 3)
        if scale not in voices:
            tts_cfg = settings.tts.model_copy(update={"length_scale": settings.tts.length_scale * scale})
            voices[scale] = await asyncio.to_thread(load_piper, tts_cfg, progress)
        tts = voices[scale]
        for i, (text, finished) in enumerate(items):
            synth = await tts.synthesize(text)
            pcm = apply_style(synth.pcm, style, seed=1000 * k + i)
            audio16 = resample_poly(pcm.astype(np.float32) / 32768.0, 1, 3).astype(np.float32)  # 16 kHz
            stream = asr.new_stream()  # as the session's pause decodes it
            stream.append(audio16)
            heard = (await stream.final()).text.strip()
            if not heard:  # the session never scores an empty transcript: counted apart
                empty.append({"said": text, "style": name})
                continue
            turn = UserTurn(t=0.0, text=heard, source="voice", speaker="host", turn_id=0)
            messages = await prompt.build_prompt(turn)
            start = time.perf_counter()
            p = await llm.end_of_turn_probability(messages, cache_key="turn-end-bench")
            ms = (time.perf_counter() - start) * 1000
            judged.append(
                Judged(text, name, finished, heard, p, ms, heard.rstrip().endswith(FINISHED_ENDINGS))
            )
    return report(judged, llm.describe(), asr.describe()) | {"asr_heard_nothing": empty}


def _score(judged: list[Judged], says_finished: list[bool]) -> dict[str, Any]:
    fin = [j for j, s in zip(judged, says_finished, strict=True) if j.finished]
    cut = [j for j, s in zip(judged, says_finished, strict=True) if not j.finished]
    right = sum(s == j.finished for j, s in zip(judged, says_finished, strict=True))
    early = sum(s for j, s in zip(judged, says_finished, strict=True) if not j.finished)
    caught = sum(s for j, s in zip(judged, says_finished, strict=True) if j.finished)
    return {
        "accuracy": round(right / len(judged), 3),
        "finished_recognised": f"{caught}/{len(fin)}",
        "false_early_ends": f"{early}/{len(cut)}",
    }


def report(judged: list[Judged], llm: str, asr: str) -> dict[str, Any]:
    ms = sorted(j.llm_ms for j in judged)
    by_threshold = {str(t): _score(judged, [j.p >= t for j in judged]) for t in THRESHOLDS}
    dangling = [ends_dangling(j.heard) for j in judged]
    engine_rule = {
        str(t): _score(judged, [j.p >= t and not d for j, d in zip(judged, dangling, strict=True)])
        for t in THRESHOLDS
    }
    return {
        "items": len(judged),
        "styles": sorted({j.style for j in judged}),
        "llm_model": llm,
        "asr": asr,
        "llm_score_ms": {
            "p50": round(statistics.median(ms), 1),
            "p95": round(ms[int(0.95 * (len(ms) - 1))], 1),
            "max": round(ms[-1], 1),
        },
        "llm": by_threshold,
        "llm_and_not_dangling": engine_rule,  # the engine's rule (vad.end_of_turn_threshold, default 0.05)
        "punctuation": _score(judged, [j.punctuation for j in judged]),
        "punctuation_and_not_dangling": _score(
            judged, [j.punctuation and not d for j, d in zip(judged, dangling, strict=True)]
        ),
        "false_early_examples": [
            {"said": j.text, "heard": j.heard, "style": j.style, "p": round(j.p, 4)}
            for j in judged
            if not j.finished and j.p >= 0.05 and not ends_dangling(j.heard)
        ],
        "missed_examples": [
            {"said": j.text, "heard": j.heard, "style": j.style, "p": round(j.p, 4)}
            for j in judged
            if j.finished and j.p < 0.05
        ][:20],
    }


def turn_end_table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['items']} utterances x voices {', '.join(r['styles'])}; {r['llm_model']}",
        f"LLM scoring: p50 {r['llm_score_ms']['p50']} ms, p95 {r['llm_score_ms']['p95']} ms",
        f"{'detector':<30} {'accuracy':>8} {'finished ok':>12} {'false early':>12}",
    ]
    rows = [(f"llm p >= {t}", x) for t, x in r["llm"].items()]
    rows += [(f"engine: p >= {t}, no dangling", x) for t, x in r["llm_and_not_dangling"].items()]
    rows += [
        ("punctuation (? !)", r["punctuation"]),
        ("punctuation, no dangling", r["punctuation_and_not_dangling"]),
    ]
    for name, x in rows:
        lines.append(
            f"{name:<30} {x['accuracy']:>8} {x['finished_recognised']:>12} {x['false_early_ends']:>12}"
        )
    return "\n".join(lines)
