"""The multi-session bench's bookkeeping: pooling sessions, and when a service level counts as held."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from engine.bench.sessions import (
    ServiceLevel,
    _session_entry,
    core_slices,
    host_cpu_split,
    pool,
    rotated,
    spread,
)
from engine.bench.stats import summarize
from engine.bench.voice import Question
from engine.cores import machine_cpu_times

pytestmark = pytest.mark.unit


def _client(v2v: list[float | None], fps_min: int | None = 30, lips: tuple[float, ...] = ()) -> dict:
    return {
        "session_id": "s",
        "voice_to_voice_ms": summarize([v for v in v2v if v is not None]),
        "turns": [{"voice_to_voice_ms": v} for v in v2v],
        "fps_mean": 30.0 if fps_min is not None else None,
        "fps_min_1s": fps_min,
        "lipsync_offset_ms": {"mean": None, "p95": None, "n": 0},
        "lipsync_per_reply": [{"offset_ms": x, "confidence": 1.0} for x in lips],
    }


def test_pooled_turns_unanswered_refusals_and_the_lowest_second() -> None:
    per = [
        _session_entry(0, 3, _client([900.0, 1000.0, 1100.0], 29, (10.0, -20.0))),
        _session_entry(1, 3, _client([1200.0, None, 1300.0], 27, (30.0,))),
        _session_entry(2, 3, RuntimeError('offer refused: 503 {"resource": "cpu"}')),
    ]
    p = pool(per)
    assert p["voice_to_voice_ms"]["n"] == 5 and p["voice_to_voice_ms"]["max"] == 1300.0
    assert p["unanswered"] == 1 + 3  # the turn that got no reply, and the refused host's three
    assert p["refused"] == 1 and p["failed"] == 0 and "503" in p["refusals"][0]
    assert p["fps_min_1s"] == 27
    assert p["lipsync_abs_p95_ms"] == pytest.approx(float(np.percentile([10, 20, 30], 95)), abs=0.1)
    level = ServiceLevel(v2v_p95_ms=2000.0)
    broken = level.check(p, with_video=True)
    assert any("refused" in b for b in broken) and any("unanswered" in b for b in broken)
    assert not any("fps" in b for b in broken) and not any("P95" in b for b in broken)


def test_each_stage_is_pooled_over_every_sessions_turns() -> None:
    a, b = _client([900.0, 1000.0]), _client([1200.0])
    a["turns"][0]["stages_ms"] = {"end_of_turn": 200.0, "llm_first_token": 400.0}
    a["turns"][1]["stages_ms"] = {"end_of_turn": 220.0, "llm_first_token": 500.0}
    b["turns"][0]["stages_ms"] = {"end_of_turn": 600.0}  # its LLM never answered (no stage)
    per = [_session_entry(0, 2, a), _session_entry(1, 1, b), _session_entry(2, 1, RuntimeError("refused"))]
    stages = pool(per)["stages_ms"]
    assert stages["end_of_turn"]["n"] == 3 and stages["end_of_turn"]["max"] == 600.0
    assert stages["llm_first_token"]["n"] == 2 and stages["llm_first_token"]["p50"] == pytest.approx(450.0)
    assert per[1]["stages_ms"] == [{"end_of_turn": 600.0}]


def test_the_final_transcripts_costs_are_pooled_over_every_sessions_turns() -> None:
    a, b = _client([900.0, 1000.0]), _client([1200.0])
    a["turns"][0]["asr"] = {"waited_ms": 400.0, "speculated": True, "queued_ms": 300.0, "tokens": 9.0}
    a["turns"][1]["asr"] = {"waited_ms": 20.0, "speculated": True, "queued_ms": 1.0, "tokens": 11.0}
    b["turns"][0]["asr"] = {"waited_ms": 90.0, "speculated": False, "queued_ms": 2.0, "decode_ms": 80.0}
    costs = pool([_session_entry(0, 2, a), _session_entry(1, 1, b)])["asr_final_ms"]
    assert costs["n"] == 3 and costs["speculated"] == pytest.approx(2 / 3, abs=1e-3)
    assert costs["waited_ms"]["max"] == 400.0 and costs["waited_ms"]["p50"] == 90.0
    assert costs["decode_ms"]["n"] == 1 and costs["tokens"]["n"] == 2


def test_the_way_there_and_back_is_pooled_over_every_sessions_turns() -> None:
    a, b = _client([900.0, 1000.0]), _client([1200.0])
    a["turns"][0] |= {"uplink_ms": 20.0, "downlink_ms": 40.0}
    a["turns"][1] |= {"uplink_ms": 30.0, "downlink_ms": 5000.0}
    b["turns"][0] |= {"uplink_ms": None, "downlink_ms": 60.0}  # no clock shared: no uplink
    per = [_session_entry(0, 2, a), _session_entry(1, 1, b)]
    p = pool(per)
    assert per[0]["downlink_ms"] == [40.0, 5000.0] and per[1]["uplink_ms"] == [None]
    assert (
        p["downlink_ms"]["n"] == 3 and p["downlink_ms"]["max"] == 5000.0 and p["downlink_ms"]["p50"] == 60.0
    )
    assert p["uplink_ms"]["n"] == 2


def test_a_session_without_video_breaks_the_fps_level_only_when_video_is_expected() -> None:
    per = [_session_entry(0, 2, _client([800.0, 900.0], None)), _session_entry(1, 2, _client([850.0, 950.0]))]
    p = pool(per)
    assert p["fps_min_1s"] == 0  # one session got no video at all
    assert ServiceLevel(v2v_p95_ms=1000.0).check(p, with_video=True) == ["lowest 1 s window 0 fps < 27"]
    assert ServiceLevel(v2v_p95_ms=1000.0).check(p, with_video=False) == []
    assert ServiceLevel(v2v_p95_ms=900.0).check(p, with_video=False)[0].startswith("voice-to-voice P95")


def test_each_host_asks_the_questions_in_its_own_order() -> None:
    qs = [Question(t, np.zeros(1, np.int16)) for t in "abc"]
    assert [q.text for q in rotated(qs, 1)] == ["b", "c", "a"]
    assert [q.text for q in rotated(qs, 4)] == ["b", "c", "a"]
    assert rotated([], 2) == []


@pytest.mark.unit
def test_each_client_process_gets_its_own_cores() -> None:
    assert core_slices(range(16), 8) == [{2 * k, 2 * k + 1} for k in range(8)]
    assert core_slices(range(16), 16) == [{k} for k in range(16)]
    assert core_slices([0, 1], 4) == [{0}, {1}, {0}, {1}]  # fewer cores than processes: shared
    assert core_slices(range(5), 2) == [{0, 1}, {2, 3}]  # never two workers on one core while enough exist


def test_sessions_spread_over_the_engines_in_turn_each_host_in_its_own_order() -> None:
    qs = [Question(t, np.zeros(1, np.int16)) for t in "abc"]
    plan = spread(["http://e0", "http://e1"], qs, 5, stagger_s=0.5)
    assert [(i, url, d) for i, url, _, d in plan] == [
        (0, "http://e0", 0.0),
        (1, "http://e1", 0.5),
        (2, "http://e0", 1.0),
        (3, "http://e1", 1.5),
        (4, "http://e0", 2.0),
    ]
    assert [q.text for q in plan[1][2]] == ["b", "c", "a"]
    assert {url for _, url, _, _ in spread("http://one", qs, 3, 1.0)} == {"http://one"}
    with pytest.raises(ValueError, match="no engine"):
        spread([], qs, 2, 1.0)


def test_the_boxs_cpu_is_split_by_kind_between_two_readings(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    stat.write_text(f"cpu  {100 * hz} 0 {50 * hz} {800 * hz} 0 0 0 {50 * hz} 0 0\ncpu0 1 2 3\n")
    before = machine_cpu_times(stat)
    assert before is not None and before["user"] == 100.0 and before["steal"] == 50.0
    stat.write_text(f"cpu  {130 * hz} 0 {70 * hz} {830 * hz} 0 0 0 {70 * hz} 0 0\n")  # 10 s on 10 cores
    split = host_cpu_split(0.0, before, 10.0, machine_cpu_times(stat))
    assert split is not None
    assert (split["user"], split["system"], split["idle"], split["steal"]) == (0.3, 0.2, 0.3, 0.2)
    assert split["busy_cores"] == 7.0 and split["seconds"] == 10.0
    assert host_cpu_split(0.0, None, 10.0, before) is None
    assert machine_cpu_times(tmp_path / "absent") is None
