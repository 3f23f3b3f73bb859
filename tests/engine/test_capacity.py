"""Admission by measured capacity: the estimate from the process's own CPU time, and the 503 past it."""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from pathlib import Path

import pytest

from engine.config import CapacityConfig, Settings, load_settings
from engine.native import as_model_thread, set_model_nice
from engine.server.capacity import CapacityMonitor, LoopLag, ProcCPU, stage_of_thread


class ScriptedCPU(ProcCPU):
    """The CPU-time input, scripted: cumulative CPU seconds per stage, advanced by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.total: dict[str, float] = {"loop": 0.0, "llm": 0.0, "encode": 0.0}

    def read(self) -> dict[str, float]:
        return dict(self.total)


def _settings() -> Settings:
    s = load_settings(environ={})
    s.avatar.enabled = False
    return s


def _monitor(
    config: CapacityConfig, sessions: list[int], talking: list[int]
) -> tuple[CapacityMonitor, ScriptedCPU, list[float]]:
    cpu, now = ScriptedCPU(), [0.0]
    m = CapacityMonitor(config, _settings(), lambda: sessions[0], lambda: talking[0], cpu, lambda: now[0])
    return m, cpu, now


@pytest.mark.unit
def test_a_pinned_idle_engine_replaces_the_measured_baseline() -> None:
    sessions, talking = [0], [0]
    config = CapacityConfig(cores=1.0, target_utilization=1.0, idle_cpu_cores=0.2, session_cpu_cores=0.35)
    m, cpu, now = _monitor(config, sessions, talking)
    m.sample()
    for _ in range(5):  # a busy "idle" engine (say, a client in the same process): 0.6 core measured
        now[0] += 1.0
        cpu.total["loop"] += 0.6
        m.sample()
    view = m.cpu_view()
    assert view.baseline == 0.2 and view.capacity == 2  # ⌊(1.0 − 0.2) / 0.35⌋, not ⌊(1.0 − 0.6) / 0.35⌋


@pytest.mark.unit
def test_measured_cost_replaces_the_prior_and_bounds_the_capacity() -> None:
    sessions, talking = [0], [0]
    m, cpu, now = _monitor(CapacityConfig(cores=2.0, min_samples=10, floor_fraction=0.0), sessions, talking)
    prior = sum(m.prior.values())
    assert m.cpu_view().per_session == pytest.approx(prior)  # nothing measured yet
    assert m.cpu_view().capacity == int(1.7 / prior)

    def second(loop: float, llm: float = 0.0, encode: float = 0.0) -> None:
        now[0] += 1.0
        cpu.total["loop"] += loop
        cpu.total["llm"] += llm
        cpu.total["encode"] += encode
        m.sample()

    m.sample()
    for _ in range(5):
        second(0.1)  # idle: the engine's own 0.1 core
    assert m.cpu_view().baseline == pytest.approx(0.1, abs=0.01)
    sessions[0] = talking[0] = 2
    for _ in range(5):
        second(0.1, llm=0.5, encode=0.2)  # two talking sessions: 0.7 core above the baseline
    half = m.cpu_view()
    assert half.per_session_measured == pytest.approx(0.35, abs=0.01)
    assert half.per_session == pytest.approx(0.5 * 0.35 + 0.5 * prior, abs=0.02)  # half-way to measured
    for _ in range(10):
        second(0.1, llm=0.5, encode=0.2)
    view = m.cpu_view()
    assert view.per_session == pytest.approx(0.35, abs=0.01)
    assert view.capacity == 4  # ⌊(2 cores × 0.85 − 0.1) / 0.35⌋
    assert view.stages["llm"] == pytest.approx(0.25, abs=0.01)
    assert m.refusal(3) is None
    refusal = m.refusal(4)
    assert refusal is not None and refusal.resource == "cpu" and "cpu is full" in refusal.message
    talking[0] = 0
    for _ in range(30):
        second(0.1, encode=0.04)  # quiet sessions are not what a session costs: no samples taken
    assert m.cpu_view().capacity == 4


@pytest.mark.unit
def test_other_processes_load_is_not_available() -> None:
    sessions, talking = [0], [0]
    m, cpu, now = _monitor(
        CapacityConfig(session_cpu_cores=0.5, count_other_processes=True), sessions, talking
    )
    m.cores = 4.0
    machine = [100.0]
    m._machine = lambda: machine[0]  # the machine's busy CPU seconds (all processes), scripted
    m.sample()
    for _ in range(20):
        now[0] += 1.0
        cpu.total["loop"] += 0.1
        machine[0] += 2.1  # this process 0.1 core, others 2.0
        m.sample()
    view = m.cpu_view()
    assert view.others == pytest.approx(2.0, abs=0.01)
    assert view.capacity == 2  # ⌊(4 × 0.85 − 2.0 − 0.1) / 0.5⌋
    refusal = m.refusal(2)
    assert refusal is not None and "other processes: 2.00" in refusal.message
    m.config = CapacityConfig(session_cpu_cores=0.5)  # measured and reported, not subtracted
    assert m.cpu_view().others == pytest.approx(2.0, abs=0.01) and m.cpu_view().capacity == 6


@pytest.mark.unit
def test_a_busy_event_loop_bounds_the_sessions_whatever_the_cores() -> None:
    sessions, talking = [0], [0]
    m, cpu, now = _monitor(CapacityConfig(cores=64.0, min_samples=5), sessions, talking)
    m.max_sessions = 64
    m.sample()
    for _ in range(5):
        now[0] += 1.0
        cpu.total["loop"] += 0.05  # the idle engine's loop
        m.sample()
    sessions[0] = talking[0] = 4
    for _ in range(10):
        now[0] += 1.0
        cpu.total["loop"] += 0.05 + 4 * 0.1  # each session keeps the loop 0.1 core busy
        cpu.total["llm"] += 4 * 0.2
        m.sample()
    loop = m.loop_view()
    assert loop.per_session == pytest.approx(0.1, abs=0.005) and loop.baseline == pytest.approx(
        0.05, abs=0.005
    )
    assert loop.capacity == 8  # ⌊(0.85 − 0.05) / 0.1⌋: one core, however many the machine has
    report = m.report()
    assert report["bounded_by"] == "event_loop" and report["capacity"] == 8
    assert m.cpu_view().capacity > 8
    r = m.refusal(8)
    assert r is not None and r.resource == "event_loop" and "event_loop is full" in r.message
    assert m.refusal(7) is None


@pytest.mark.unit
def test_frames_dropped_late_stop_admission_whatever_the_estimate() -> None:
    """The service itself measured: the open sessions' late frames over the window, against the bound."""
    sessions, talking, late = [4], [4], [0]
    cpu, now = ScriptedCPU(), [0.0]
    config = CapacityConfig(cores=64.0, late_frames_per_s=0.5, pace_window_s=10.0)
    m = CapacityMonitor(
        config, _settings(), lambda: sessions[0], lambda: talking[0], cpu, lambda: now[0], lambda: late[0]
    )
    m.max_sessions = 64

    def seconds(k: int, late_a_second: int) -> None:
        for _ in range(k):
            now[0] += 1.0
            late[0] += late_a_second
            m.sample()

    m.sample()
    seconds(10, 0)
    pace = m.pace_view()
    assert pace is not None and pace.in_use == 0.0 and pace.capacity == 64 and m.refusal(4) is None
    seconds(5, 3)  # 15 frames late in the last 10 s: 1.5 a second
    pace = m.pace_view()
    assert pace is not None and pace.in_use == pytest.approx(1.5) and pace.capacity == 4
    assert m.report()["bounded_by"] == "video_pace" and m.report()["capacity"] == 4
    assert m.cpu_view().capacity > 4  # the CPU estimate alone would admit more
    r = m.refusal(4)
    assert r is not None and r.resource == "video_pace"
    assert "dropped 1.5 frames/s as late over the last 10 s" in r.message
    assert m.refusal(3) is None  # one of them closed: room for one again
    sessions[0], late[0] = 3, late[0] - 9  # a closing session takes its count with it: not a negative count
    seconds(1, 0)
    pace = m.pace_view()
    assert pace is not None and pace.in_use == pytest.approx(1.5)
    seconds(10, 0)  # on time again: the late ones have left the window
    pace = m.pace_view()
    assert pace is not None and pace.in_use == 0.0 and m.refusal(3) is None
    without_video = CapacityMonitor(config, _settings(), lambda: 4, lambda: 4)
    assert without_video.pace_view() is None and "video_pace" not in without_video.report()["resources"]


@pytest.mark.unit
def test_loop_lag_is_summarized_over_its_window() -> None:
    lag = LoopLag(window_s=10.0)
    assert lag.summary_ms() == {"p50": None, "p90": None, "max": None, "worst": None, "worst_at": None}
    lag.record(0.0, 0.9)  # loading, before any session
    lag.reset_worst()
    for i in range(10):
        lag.record(float(i + 1), 0.001 * (i + 1))  # 1 … 10 ms
    before = time.time()
    lag.record(11.0, 0.3)  # a stall
    lag.record(12.0, 0.002)
    summary = lag.summary_ms()
    assert {k: summary[k] for k in ("p50", "p90", "max", "worst")} == {
        "p50": 6.0,
        "p90": 10.0,
        "max": 300.0,
        "worst": 300.0,
    }
    assert summary["worst_at"] is not None and before - 0.01 <= summary["worst_at"] <= time.time() + 0.01
    lag.record(25.0, 0.2)  # the earlier ones have left the window; the worst since the reset stays
    assert lag.summary_ms() | {"worst_at": None} == {
        "p50": 200.0,
        "p90": 200.0,
        "max": 200.0,
        "worst": 300.0,
        "worst_at": None,
    }


@pytest.mark.unit
def test_the_cap_and_admission_off() -> None:
    s = _settings()
    s.server.max_sessions = 3
    m = CapacityMonitor(CapacityConfig(cores=64.0), s, lambda: 0, lambda: 0)
    assert m.report()["capacity"] == 3 and m.report()["bounded_by"] == "max_sessions"
    r = m.refusal(3)
    assert r is not None and r.resource == "max_sessions"
    off = CapacityMonitor(CapacityConfig(cores=0.5, admission=False), s, lambda: 0, lambda: 0)
    assert off.refusal(2) is None and off.refusal(3) is not None
    assert off.report()["capacity"] == 0  # still reported, not enforced
    full = CapacityMonitor(CapacityConfig(cores=0.5), s, lambda: 0, lambda: 0)
    assert full.refusal(0) is None  # capacity.min_sessions: the first host is always served
    r = full.refusal(1)
    assert r is not None and r.resource == "cpu"


@pytest.mark.unit
def test_thread_cpu_is_read_per_stage_from_the_running_process() -> None:
    assert stage_of_thread("render_0") == "render" and stage_of_thread("vad-abc_0") == "vad"
    assert stage_of_thread(None) == "native" and stage_of_thread("piper_0") == "tts"

    burnt, read = threading.Event(), threading.Event()

    def burn() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        burnt.set()
        read.wait(10)  # alive until its time has been read

    before = ProcCPU().read()
    t = threading.Thread(target=burn, name="render_test")
    t.start()
    assert burnt.wait(30)
    during = ProcCPU().read()
    read.set()
    t.join()
    assert during.get("render", 0.0) - before.get("render", 0.0) >= 0.25


@pytest.mark.unit
def test_a_native_pool_counts_to_the_models_or_the_media_by_the_thread_that_started_it() -> None:
    import onnxruntime as ort

    spec = importlib.util.find_spec("silero_vad")  # the model file only: importing it changes torch's threads
    assert spec is not None and spec.origin is not None
    model = Path(spec.origin).parent / "data" / "silero_vad.onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2  # one worker thread besides the caller's
    sessions: dict[str, ort.InferenceSession] = {}
    born: dict[str, set[str]] = {}

    def start(stage: str, model_thread: bool) -> None:
        if model_thread:
            as_model_thread()
        before = set(os.listdir("/proc/self/task"))
        sessions[stage] = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        born[stage] = set(os.listdir("/proc/self/task")) - before

    set_model_nice(5)
    try:
        for stage, model_thread in (("models", True), ("media", False)):
            t = threading.Thread(target=start, args=(stage, model_thread))
            t.start()
            t.join()
        assert born["models"] and born["media"]  # ONNX Runtime's pools, started with the sessions
        read = ProcCPU().read()
        assert "native_models" in read and "native_media" in read
        set_model_nice(0)  # model threads no nicer: the two cannot be told apart
        read = ProcCPU().read()
        assert "native" in read and "native_models" not in read
    finally:
        set_model_nice(0)
