"""How many sessions this engine can serve well, measured in the running engine; the admission rule.

What a session costs is read from the process itself, every ``sample_s``: the CPU time of each of its
threads (``/proc/self/task/*/stat``), grouped by the stage the thread works for (its name: ``render``,
``asr``, ``piper``, ``llm-decode``, ``vad-…``, the loop's default executor where aiortc encodes and
decodes, the event loop itself; threads started natively by a model runtime — onnxruntime's, torch's or
CTranslate2's intra-op pools — count as ``native``). With no session open the samples give the engine's
idle baseline; with sessions open and at least one of them talking, (busy − baseline) / sessions is one
session's cost, in cores. Until enough such samples exist the cost is a prior built from the
configuration (the stage costs measured on the 2-core machine and the H200, docs/PERFORMANCE.md), and
the measured cost takes over in proportion to the samples it rests on. What other processes keep busy on
the machine (``/proc/stat`` minus this process) is measured and reported, and taken off the available
cores with ``capacity.count_other_processes`` (a shared machine). ``capacity.min_sessions`` (1) are
always admitted.

Capacity = ⌊(cores × target_utilization [− others] − baseline) / cost of one session⌋, at most
``server.max_sessions``. Where the process has initialized CUDA, GPU memory is a second resource the
same way (measured growth per session). A session past the capacity is refused (HTTP 503, Retry-After,
the resource named) rather than admitted into a stream that would degrade everyone's.

The event loop is a third resource, of one core whatever the machine: every session's signalling, RTP
packets and pacing run on it, and Python runs one thread at a time. Its cost per session is the loop
thread's CPU the same way (idle floor, then (busy − floor) / sessions), against ``target_utilization`` of
one core. How late it runs (a probe's oversleep, ``loop_lag``) is reported beside it: a loop that is
late delays every session's audio at once.

The sessions' video pace is a fourth, measured from the service itself rather than estimated: frames the
open sessions dropped as late (each track drops a frame one period late instead of queueing it) per second
over the last ``capacity.pace_window_s``. Above ``capacity.late_frames_per_s`` the engine admits no further
session, whatever the costs above say: on the 16-core H100 box the CPU estimate saw room for ~25 sessions
a 4-session engine while its frames were already late (docs/PERFORMANCE.md, "2026-12-06 afternoon").
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.config import CapacityConfig
from engine.cores import machine_cpu_times, usable_cpu
from engine.native import model_nice

log = logging.getLogger(__name__)


# Prior costs: ms of one core per second of media while a session talks (voice) or streams (video),
# from docs/PERFORMANCE.md (2-core machine, `idolcast bench --render`'s delivery rows at 720p, the upper
# end of six runs: CPU render 5.1 ms, RGBA -> I420 of the damaged boxes 1.0 ms, aiortc's VP8 6.8 ms a
# frame; the bundled LLM on 2 cores keeps about one core busy while it generates).
PRIOR_VIDEO_MS_PER_FRAME_720P = {"render": 5.1, "convert": 1.0, "encode": 6.8}
PRIOR_VOICE_MS_PER_S = {"llm": 450.0, "asr": 80.0, "tts": 90.0, "vad": 10.0, "loop": 30.0}
PRIOR_GPU_GIB_PER_SESSION = 0.25
PRIOR_LOOP_CORES_PER_SESSION = {"voice": 0.03, "video": 0.03}  # RTP in and out, pacing, events
PIXELS_720P = 1280 * 720


def prior_costs(settings: Any) -> dict[str, float]:
    """One session's CPU cost per stage, in cores, from the configuration alone."""
    costs = {k: v / 1000.0 for k, v in PRIOR_VOICE_MS_PER_S.items()}
    if getattr(settings.llm, "backend", "") == "openai" or str(
        getattr(settings.llm, "device", "")
    ).startswith("cuda"):
        costs["llm"] = 0.05  # decoding happens elsewhere (a server, the GPU); the CPU only feeds it
    if str(getattr(settings.asr, "device", "")).startswith("cuda"):
        costs["asr"] = 0.01
    if settings.avatar.enabled:
        from engine.avatar.profiles import profile_size

        profile = str(settings.avatar.profile)  # 'auto' until the engine has measured: assume the larger
        w, h = profile_size("720p" if profile == "auto" else profile)
        scale = (w * h) / PIXELS_720P
        per_frame = dict(PRIOR_VIDEO_MS_PER_FRAME_720P)
        if "cuda" in str(settings.avatar.backend):
            per_frame["render"] = 0.0  # on the GPU (0.23 ms a frame batched, not CPU time)
        for stage, ms in per_frame.items():
            costs[stage] = ms * scale * 30 / 1000.0
    return costs


# ---- reading the process's CPU time per thread ---------------------------------------------------------

_STAGE_OF_PREFIX = (
    ("render", "render"),
    ("vad-", "vad"),
    ("asr", "asr"),
    ("piper", "tts"),
    ("llm", "llm"),
    ("asyncio_", "encode"),  # the loop's default executor: aiortc's encoders and decoders
    ("ThreadPoolExecutor", "encode"),
    ("MainThread", "loop"),
)


def stage_of_thread(name: str | None, nicer: bool | None = None) -> str:
    """The stage a thread's CPU counts to, by its Python name. A native thread (``name`` None: a runtime's
    pool, ONNX Runtime's, an OpenMP team, CUDA's) counts by who started it, told by the nice it inherited
    (engine/native.py): ``nicer`` True, a model thread (``native_models``); False, the loop, the render or
    an encoder (``native_media``); None, unknown (``native``: model threads are not nicer)."""
    if name is None:
        return "native" if nicer is None else ("native_models" if nicer else "native_media")
    for prefix, stage in _STAGE_OF_PREFIX:
        if name.startswith(prefix):
            return stage
    return "other"


class ProcCPU:
    """CPU seconds used so far by this process, per stage (Linux ``/proc``; process total elsewhere)."""

    def __init__(self) -> None:
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._proc = os.path.isdir("/proc/self/task")

    def read(self) -> dict[str, float]:
        if not self._proc:
            t = os.times()
            return {"other": t.user + t.system}
        names = {t.native_id: t.name for t in threading.enumerate()}
        # a native thread inherits the nice of the thread that started it: the process's own (the loop's)
        # or the models' (server.model_nice steps more); with model_nice 0 the two cannot be told apart
        base = os.getpriority(os.PRIO_PROCESS, os.getpid()) if model_nice() > 0 else None
        out: dict[str, float] = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            secs = (int(fields[11]) + int(fields[12])) / self._tick  # utime, stime
            nicer = None if base is None else int(fields[16]) > base  # field 19 of stat: nice
            stage = stage_of_thread(names.get(int(tid)), nicer)
            out[stage] = out.get(stage, 0.0) + secs
        # threads that ended took their time with them: the process total keeps it
        t = os.times()
        out["ended"] = max(0.0, t.user + t.system - sum(out.values()))
        return out


def machine_busy_cores_s() -> float | None:
    """CPU seconds the whole machine has been busy (all processes; ``/proc/stat``), or None elsewhere."""
    times = machine_cpu_times()
    return None if times is None else sum(times.values()) - times["idle"] - times.get("iowait", 0.0)


def machine_cores() -> float:
    """The CPU this engine may use, in cores (its affinity capped by a container's quota and server.cpus:
    engine/cores.py)."""
    return usable_cpu()


def _gpu_memory() -> tuple[float, float] | None:
    """(used, total) GiB of the current CUDA device, only if this process already initialized CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30, total / 2**30


class LoopLag:
    """How late the event loop wakes up: a probe sleeps ``probe_s`` and records how much longer it took."""

    def __init__(self, window_s: float = 10.0, probe_s: float = 0.1) -> None:
        self.window_s = window_s
        self.probe_s = probe_s
        self._samples: deque[tuple[float, float]] = deque()  # (t, lag in seconds)
        self._lock = threading.Lock()
        # the largest lag since the sessions open now began (reset_worst), and when it ended (Unix seconds):
        # a stall outside the window still shows
        self.worst_s = 0.0
        self.worst_at: float | None = None

    async def watch(self) -> None:
        """Probe the running loop until cancelled: sleep ``probe_s``, record how much later it woke."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.probe_s)
            end = loop.time()
            self.record(end, end - start - self.probe_s)

    def record(self, now: float, lag_s: float) -> None:
        with self._lock:
            self._samples.append((now, max(0.0, lag_s)))
            if lag_s > self.worst_s:
                self.worst_s, self.worst_at = lag_s, time.time()
            while self._samples and self._samples[0][0] < now - self.window_s:
                self._samples.popleft()

    def reset_worst(self) -> None:
        """Forget the largest lag (the first session of a busy spell opens: what came before is loading)."""
        with self._lock:
            self.worst_s, self.worst_at = 0.0, None

    def summary_ms(self) -> dict[str, float | None]:
        """P50, P90 and the largest lag over the window, in ms (None: no probe yet); the largest since
        :meth:`reset_worst` too (``worst``, with ``worst_at``: when it ended, in Unix seconds)."""
        with self._lock:
            lags = [lag for _, lag in self._samples]
            worst, worst_at = self.worst_s, self.worst_at
        if not lags:
            return {"p50": None, "p90": None, "max": None, "worst": None, "worst_at": None}
        return {
            "p50": round(1000.0 * _quantile(lags, 0.5), 1),
            "p90": round(1000.0 * _quantile(lags, 0.9), 1),
            "max": round(1000.0 * max(lags), 1),
            "worst": round(1000.0 * worst, 1),
            "worst_at": round(worst_at, 2) if worst_at is not None else None,
        }


# ---- the estimate ---------------------------------------------------------------------------------------


@dataclass
class ResourceView:
    name: str
    unit: str
    available: float  # what the sessions may use (× target_utilization)
    total: float
    in_use: float
    baseline: float
    per_session: float
    per_session_measured: float | None
    samples: int
    capacity: int
    stages: dict[str, float] = field(default_factory=dict)  # cost of one session per stage (cpu)
    others: float = 0.0  # cores busy with other processes on the machine (taken off what is available)
    full: str | None = None  # why it is full, where the generic account of a budget does not say it

    @property
    def utilization(self) -> float:
        return self.in_use / self.total if self.total > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "total": round(self.total, 3),
            "available": round(self.available, 3),
            "in_use": round(self.in_use, 3),
            "utilization": round(self.utilization, 3),
            "baseline": round(self.baseline, 3),
            "others": round(self.others, 3),
            "per_session": round(self.per_session, 3),
            "per_session_measured": None
            if self.per_session_measured is None
            else round(self.per_session_measured, 3),
            "samples": self.samples,
            "capacity": self.capacity,
            "per_session_stages": {k: round(v, 3) for k, v in sorted(self.stages.items())},
        }


@dataclass
class Refusal:
    resource: str
    message: str
    retry_after_s: int


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)]


def _p90(values: list[float]) -> float:
    return _quantile(values, 0.9)


def _floor(idle: deque[tuple[float, float]]) -> float:
    """An idle floor: a low percentile of the idle samples (0 without any)."""
    values = sorted(b for _, b in idle)
    return values[len(values) // 5] if values else 0.0


def _fits(available: float, baseline: float, per: float, otherwise: int) -> int:
    """Sessions of ``per`` each that fit in ``available`` above ``baseline``."""
    return max(0, int((available - baseline) / per + 1e-9)) if per > 0 else otherwise


class CapacityMonitor:
    """Samples the engine's costs and answers "one more session?"; one per engine."""

    def __init__(
        self,
        config: CapacityConfig,
        settings: Any,
        sessions: Callable[[], int],
        talking: Callable[[], int],
        cpu: ProcCPU | None = None,
        clock: Callable[[], float] = time.monotonic,  # wall time, deliberately: CPU seconds per second
        late_frames: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.max_sessions = int(settings.server.max_sessions)
        self.cores = config.cores or machine_cores()
        self.prior = prior_costs(settings)
        self._sessions = sessions
        self._talking = talking
        self._late_frames = late_frames  # frames the open sessions' video tracks dropped as late, in all
        self._late_last: int | None = None
        self._late: deque[tuple[float, int]] = deque()  # (t, frames dropped late since the sample before)
        self._cpu = cpu or ProcCPU()
        self._clock = clock
        self._last: tuple[float, dict[str, float]] | None = None
        self._rate: dict[str, float] = {}  # cores per stage, last sample
        self._idle: deque[tuple[float, float]] = deque()  # (t, busy cores) with no session open
        # Other processes' load on the machine: measured, and subtracted where configured to be.
        self._machine: Callable[[], float | None] = machine_busy_cores_s
        self._last_machine: float | None = None
        self._others = 0.0
        self._baseline_gpu: float | None = None
        self._loaded: deque[tuple[float, float, dict[str, float]]] = deque()  # (t, cores/session, stages)
        self._gpu_per_session: deque[tuple[float, float]] = deque()
        self._loop_idle: deque[tuple[float, float]] = deque()  # (t, loop thread's cores) with no session
        self._loop_loaded: deque[tuple[float, float]] = deque()  # (t, loop cores per session)
        self.loop_lag = LoopLag()
        self.prior_loop = PRIOR_LOOP_CORES_PER_SESSION["voice"] + (
            PRIOR_LOOP_CORES_PER_SESSION["video"] if settings.avatar.enabled else 0.0
        )
        self._lock = threading.Lock()

    # -- sampling (in a worker thread: it reads /proc) --

    def sample(self) -> None:
        now, cpu = self._clock(), self._cpu.read()
        n, talking = self._sessions(), self._talking()
        gpu = _gpu_memory()
        late = self._late_frames() if self._late_frames is not None else None
        with self._lock:
            if late is not None:
                # a closing session takes its count with it: a fall is not a negative count
                if self._late_last is not None:
                    self._late.append((now, max(0, late - self._late_last)))
                self._late_last = late
            while self._late and self._late[0][0] < now - self.config.pace_window_s:
                self._late.popleft()
            last, self._last = self._last, (now, cpu)
            if last is None or now - last[0] <= 0:
                return
            dt = now - last[0]
            rate = {k: max(0.0, (v - last[1].get(k, 0.0)) / dt) for k, v in cpu.items()}
            self._rate = rate
            busy = sum(rate.values())
            machine, self._last_machine = self._last_machine, self._machine()
            if machine is not None and self._last_machine is not None:
                others = max(0.0, (self._last_machine - machine) / dt - busy)
                self._others = 0.7 * self._others + 0.3 * others  # smoothed: a one-second burst is not load
            loop = rate.get("loop", 0.0)
            if n == 0:  # idle: the engine's own floor
                self._idle.append((now, busy))
                self._loop_idle.append((now, loop))
                if gpu is not None:
                    self._baseline_gpu = gpu[0]
            elif talking > 0:
                base = self._baseline()
                share = max(0.0, busy - base) / n
                stages = {k: v / n for k, v in rate.items()}
                self._loaded.append((now, share, stages))
                self._loop_loaded.append((now, max(0.0, loop - _floor(self._loop_idle)) / n))
                if gpu is not None and self._baseline_gpu is not None:
                    self._gpu_per_session.append((now, max(0.0, gpu[0] - self._baseline_gpu) / n))
            horizon = now - self.config.history_s
            for q in (self._loaded, self._gpu_per_session, self._idle, self._loop_idle, self._loop_loaded):
                while q and q[0][0] < horizon:
                    q.popleft()

    # -- the estimate --

    def _baseline(self) -> float:
        """The idle engine's CPU: a low percentile of the idle samples (work that outlives a session,
        such as a memory write-back, runs in idle seconds too and is not the floor), or the pinned
        ``capacity.idle_cpu_cores``."""
        if self.config.idle_cpu_cores is not None:
            return self.config.idle_cpu_cores
        return _floor(self._idle)

    def _per_session(self, prior: float, measured: float | None, samples: int) -> float:
        """The prior until measured, then the measured cost in proportion to its samples (never below
        ``floor_fraction`` of the prior)."""
        if measured is None:
            return prior
        w = min(1.0, samples / self.config.min_samples)
        return max(self.config.floor_fraction * prior, w * measured + (1.0 - w) * prior)

    def cpu_view(self) -> ResourceView:
        cfg = self.config
        with self._lock:
            loaded = list(self._loaded)
            rate = dict(self._rate)
            baseline = self._baseline()
            others = self._others
        prior = sum(self.prior.values())
        measured = _p90([s for _, s, _ in loaded]) if loaded else None
        if cfg.session_cpu_cores is not None:
            per = cfg.session_cpu_cores
        else:
            per = self._per_session(prior, measured, len(loaded))
        stages: dict[str, float] = dict(self.prior)
        if loaded:
            keys = {k for _, _, st in loaded for k in st}
            stages = {k: sum(st.get(k, 0.0) for _, _, st in loaded) / len(loaded) for k in keys}
        taken = others if cfg.count_other_processes and cfg.cores is None else 0.0
        available = max(0.0, self.cores * cfg.target_utilization - taken)
        cap = _fits(available, baseline, per, self.max_sessions)
        return ResourceView(
            "cpu",
            "cores",
            available,
            self.cores,
            sum(rate.values()),
            baseline,
            per,
            measured,
            len(loaded),
            cap,
            stages,
            others,
        )

    def gpu_view(self) -> ResourceView | None:
        gpu = _gpu_memory()
        if gpu is None:
            return None
        used, total = gpu
        with self._lock:
            samples = [s for _, s in self._gpu_per_session]
            baseline = self._baseline_gpu if self._baseline_gpu is not None else used
        measured = max(samples) if samples else None
        per = max(measured or 0.0, PRIOR_GPU_GIB_PER_SESSION)
        available = total * self.config.target_utilization
        cap = max(0, int((available - baseline) / per))
        return ResourceView(
            "gpu_memory", "GiB", available, total, used, baseline, per, measured, len(samples), cap
        )

    def loop_view(self) -> ResourceView:
        """The event loop: one core, the loop thread's CPU per session (the prior until measured)."""
        cfg = self.config
        with self._lock:
            loaded = [s for _, s in self._loop_loaded]
            baseline = _floor(self._loop_idle)
            in_use = self._rate.get("loop", 0.0)
        measured = _p90(loaded) if loaded else None
        per = self._per_session(self.prior_loop, measured, len(loaded))
        available = cfg.target_utilization  # of one core
        cap = _fits(available, baseline, per, self.max_sessions)
        return ResourceView(
            "event_loop", "cores", available, 1.0, in_use, baseline, per, measured, len(loaded), cap
        )

    def pace_view(self) -> ResourceView | None:
        """The open sessions' video pace: frames dropped late per second over the window (None: no video)."""
        if self._late_frames is None:
            return None
        cfg = self.config
        n = self._sessions()
        with self._lock:
            samples = list(self._late)
        late = sum(k for _, k in samples) / cfg.pace_window_s if samples else 0.0
        full = late > cfg.late_frames_per_s and n > 0
        return ResourceView(
            "video_pace",
            "late frames/s",
            cfg.late_frames_per_s,
            cfg.late_frames_per_s,
            late,
            0.0,
            late / n if n else 0.0,
            late / n if n and samples else None,
            len(samples),
            n if full else self.max_sessions,
            full=f"the {n} open session(s) dropped {late:.1f} frames/s as late over the last "
            f"{cfg.pace_window_s:.0f} s (at most {cfg.late_frames_per_s:g} admit another)"
            if full
            else None,
        )

    def _views(self) -> list[ResourceView]:
        views = (self.cpu_view(), self.gpu_view(), self.loop_view(), self.pace_view())
        return [v for v in views if v is not None]

    def report(self) -> dict[str, Any]:
        """What ``/api/capacity`` answers."""
        views = self._views()
        bound = min(views, key=lambda v: v.capacity)
        capacity, bounding = bound.capacity, bound.name
        if self.max_sessions <= capacity:
            capacity, bounding = self.max_sessions, "max_sessions"
        return {
            "sessions": self._sessions(),
            "capacity": capacity,
            "bounded_by": bounding,
            "admission": self.config.admission,  # false: the estimate is reported, not enforced
            "max_sessions": self.max_sessions,
            "resources": {v.name: v.as_dict() for v in views},
            "event_loop_lag_ms": self.loop_lag.summary_ms(),
        }

    def refusal(self, open_sessions: int) -> Refusal | None:
        """Why one more session cannot be admitted now, or None if it can."""
        retry = self.config.retry_after_s
        if open_sessions >= self.max_sessions:
            return Refusal("max_sessions", f"too many sessions (max {self.max_sessions})", retry)
        if not self.config.admission:
            return None
        if open_sessions < self.config.min_sessions:
            return None
        for view in self._views():
            if open_sessions + 1 > view.capacity:
                if view.full is not None:
                    return Refusal(view.name, f"no room for another session: {view.full}", retry)
                return Refusal(
                    view.name,
                    f"no room for another session: {view.name} is full ({open_sessions} session(s) open; "
                    f"{view.available:.2f} {view.unit} usable (other processes: {view.others:.2f}), "
                    f"{view.baseline:.2f} idle baseline, "
                    f"~{view.per_session:.2f} {view.unit} per session → capacity {view.capacity})",
                    retry,
                )
        return None
