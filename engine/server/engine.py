"""The running engine: shared models (loaded once, with progress), the sessions, the metrics."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from engine.avatar.delivery import resolve_profile
from engine.avatar.live import RenderPool, renderer_factory
from engine.config import Settings
from engine.heap import CollectionPauses, freeze_loaded_heap
from engine.llm.prompt import PromptProvider
from engine.models import EngineModels, load_models
from engine.native import model_executor
from engine.server.capacity import CapacityMonitor
from engine.server.stalls import StallWatch
from engine.session.face import attach_avatar
from engine.session.session import Session
from engine.session.timings import TurnMetrics
from engine.tasks import TaskOwner
from engine.transport.video_out import IdolVideoTrack

log = logging.getLogger(__name__)
LOAD_LOG_S = 5.0  # seconds between the load lines while sessions are open

PromptFactory = Callable[[str], PromptProvider]
SessionHook = Callable[[Session], Awaitable[None]]


@dataclass
class LoadStatus:
    state: str = "loading"  # loading | ready | failed
    stage: str = ""
    message: str = "starting"
    fraction: float | None = None
    error: str | None = None
    log: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "stage": self.stage,
            "message": self.message,
            "fraction": self.fraction,
            "error": self.error,
        }


# Opens the persona's prompt provider over its memory bank (blocking); the application hands it in
# (engine/app.py), so the server never imports persona.
PersonaOpener = Callable[[Settings, EngineModels], Any]


async def close_models(models: EngineModels) -> None:
    """Release what the models hold: the ASR's and TTS's worker threads (their running jobs finish) and
    the LLM's connections (the OpenAI backend's HTTP pool). A llama.cpp model's memory is left to the
    process exit: freeing it here (LlamaCppLLM.close) crashed the process in llama_cpp's free_model
    (SIGSEGV after a SIGTERM drain, tests/engine/test_drain.py, about one run in three)."""
    for model in (models.asr, models.tts):
        close = getattr(model, "close", None)
        if close is not None:
            close()
    aclose = getattr(models.llm, "aclose", None)
    if aclose is not None:
        await aclose()


class EngineBusy(Exception):
    """No room for another session: ``resource`` is full (``max_sessions``, ``cpu``, ``gpu_memory``)."""

    def __init__(self, message: str, resource: str = "max_sessions", retry_after_s: int = 30) -> None:
        super().__init__(message)
        self.resource = resource
        self.retry_after_s = retry_after_s


class EngineNotReady(Exception):
    pass


class Engine:
    def __init__(
        self,
        settings: Settings,
        models: EngineModels | None = None,
        open_persona: PersonaOpener | None = None,
    ) -> None:
        self.settings = settings
        self.models = models
        self._owns_models = models is None  # models it loads it closes; models it is handed, their owner does
        self.status = LoadStatus(state="ready" if models else "loading", message="ready" if models else "")
        self.sessions: dict[str, Session] = {}
        self.draining: str | None = None  # why no new session is admitted (engine/server/drain.py)
        self.registry = CollectorRegistry()
        self.turn_metrics = TurnMetrics(self.registry)
        self._sessions_gauge = Gauge("idolcast_sessions", "Open sessions", registry=self.registry)
        self.capacity = CapacityMonitor(
            settings.capacity,
            settings,
            sessions=lambda: len(self.sessions),
            talking=lambda: sum(1 for s in list(self.sessions.values()) if s.speaking()),
            late_frames=self._late_frames if settings.avatar.enabled else None,
        )
        Gauge("idolcast_sessions_active", "Open sessions", registry=self.registry).set_function(
            lambda: len(self.sessions)
        )
        self._capacity_gauge = Gauge(
            "idolcast_sessions_capacity",
            "Sessions this engine estimates it can serve well (GET /api/capacity says what bounds it)",
            registry=self.registry,
        )
        self._utilization_gauge = Gauge(
            "idolcast_resource_utilization",
            "Share of a resource in use (cpu: busy cores / cores; gpu_memory: used / total)",
            ["resource"],
            registry=self.registry,
        )
        self._capacity_gauge.set(settings.server.max_sessions)
        Gauge(
            "idolcast_event_loop_lag_ms",
            "How late the event loop woke up, P90 over the last 10 s (it paces every session's media)",
            registry=self.registry,
        ).set_function(lambda: self.capacity.loop_lag.summary_ms()["p90"] or 0.0)
        self.gc_pauses = CollectionPauses(self.registry)
        self.gc_pauses.watch()
        # a session's video frame overdue, said while it is (engine/server/stalls.py); started with a session
        self.stalls = StallWatch(self._paced_tracks, settings.server.stall_report_ms / 1000.0)
        self._owner = TaskOwner("engine")
        self._ready = asyncio.Event()
        if models is not None:
            self._ready.set()
        self.prompt_factory: PromptFactory | None = None
        # One idol, one memory: every session talks to the same persona and memory bank.
        self.persona: Any = None
        self._open_persona = open_persona
        self.on_session_created: list[SessionHook] = []
        self.on_session_closed: list[SessionHook] = []
        self.render_pool: RenderPool | None = None
        if settings.avatar.enabled:
            if models is not None:  # handed loaded models: ready now ('auto' measures here, once a process)
                self._resolve_profile()
            self.render_pool = RenderPool(
                renderer_factory(settings.avatar, max_batch=settings.server.max_sessions),
                gather_s=settings.avatar.render_gather_ms / 1000.0,
                finish_threads=settings.avatar.finish_threads,
            )

    # ---- loading -----------------------------------------------------------------------------

    def _late_frames(self) -> int:
        """Frames the open sessions dropped as late, in all (read from the capacity sampler's thread)."""
        return sum(s.late_frames() for s in list(self.sessions.values()))

    def _paced_tracks(self) -> list[tuple[str, IdolVideoTrack]]:
        """The open sessions' video tracks (read from the stall watch's thread)."""
        return [
            (sid, s.video_track)
            for sid, s in list(self.sessions.items())
            if isinstance(s.video_track, IdolVideoTrack)
        ]

    def _progress(self, stage: str, message: str, fraction: float | None = None) -> None:
        self.status.stage, self.status.message, self.status.fraction = stage, message, fraction
        self.status.log.append(f"[{stage}] {message}")
        del self.status.log[:-50]
        log.info("[%s] %s", stage, message)

    def start_loading(self) -> None:
        self._owner.spawn(self._watch_capacity(), "capacity")
        self._owner.spawn(self.capacity.loop_lag.watch(), "loop-lag")
        if self.models is None:
            self._owner.spawn(self._load(), "load-models")

    def _resolve_profile(self) -> None:
        avatar = self.settings.avatar
        avatar.profile = resolve_profile(avatar.profile, avatar.character, avatar.cpu_kernels)  # type: ignore[assignment]

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()

        def progress(stage: str, message: str, fraction: float | None = None) -> None:
            loop.call_soon_threadsafe(self._progress, stage, message, fraction)

        try:
            # in a model thread: the runtimes' own pools, started as they load, inherit its priority
            loader = model_executor(1, "load")
            try:
                self.models = await loop.run_in_executor(loader, load_models, self.settings, progress)
            finally:
                loader.shutdown(wait=False)
            if self.render_pool is not None:
                if self.settings.avatar.profile == "auto":
                    compiling = (
                        ""
                        if self.settings.avatar.cpu_kernels == "off"
                        else ("; the face's features compiled first, ~45 s the first start on a machine")
                    )
                    self._progress(
                        "avatar", f"measuring what 720p video costs here (avatar.profile = auto{compiling})"
                    )
                    await asyncio.to_thread(self._resolve_profile)
                self._progress("avatar", f"preparing the character at {self.settings.avatar.profile}")
                await self.render_pool.prepare(self.settings.avatar.profile, progress)
            if self.settings.persona.enabled:
                self._progress("persona", "opening the persona memory bank")
                await self.load_persona()
        except Exception as e:
            log.exception("loading models failed")
            self.status.state, self.status.error = "failed", f"{type(e).__name__}: {e}"
            return
        # what is loaded now is never garbage: later collections skip it (engine/heap.py). Once, before any
        # session; a collection holds every Python thread whichever thread runs it, so a worker would not help
        freeze_loaded_heap()
        self.status.state, self.status.message, self.status.fraction = "ready", "ready", 1.0
        self._ready.set()

    async def _watch_capacity(self) -> None:
        """Sample the costs (in a worker thread: it reads /proc), keep the gauges current; while sessions are
        open, one log line every ``LOAD_LOG_S`` (sessions, CPU, the loop's share and lateness)."""
        logged = 0.0
        while True:
            try:
                await asyncio.to_thread(self.capacity.sample)
                report = self.capacity.report()
                self._capacity_gauge.set(report["capacity"])
                for name, r in report["resources"].items():
                    self._utilization_gauge.labels(resource=name).set(r["utilization"])
                now = time.monotonic()
                if self.sessions and now - logged >= LOAD_LOG_S:
                    logged = now
                    res, lag = report["resources"], report["event_loop_lag_ms"]
                    log.info(
                        "load: %d session(s), cpu %.2f of %.0f cores, event loop %.2f core, lag p90 %s max %s ms",
                        len(self.sessions),
                        res["cpu"]["in_use"],
                        res["cpu"]["total"],
                        res["event_loop"]["in_use"],
                        lag["p90"],
                        lag["max"],
                    )
            except Exception:
                log.exception("capacity sample failed")
            await asyncio.sleep(self.settings.capacity.sample_s)

    # ---- sessions ------------------------------------------------------------------------------

    @property
    def admitting(self) -> bool:
        """Ready for new sessions: models loaded and not draining (the readiness probe)."""
        return self.status.state == "ready" and self.models is not None and self.draining is None

    async def create_session(self) -> Session:
        if self.draining:
            raise EngineNotReady(self.draining)
        if self.status.state == "failed":
            raise EngineNotReady(f"the engine failed to load: {self.status.error}")
        if self.models is None:
            raise EngineNotReady(f"the engine is still loading ({self.status.message or 'starting'})")
        refusal = self.capacity.refusal(len(self.sessions))
        if refusal is not None:
            log.warning("session refused: %s", refusal.message)
            raise EngineBusy(refusal.message, refusal.resource, refusal.retry_after_s)
        sid = uuid.uuid4().hex[:12]
        prompt = self.prompt_factory(sid) if self.prompt_factory else None
        # The session's media is built with it, before anyone sees it: its audio track (in Session) and
        # its face (video source + track), both tappable from birth (engine/transport/taps.py).
        session = Session(sid, self.settings, self.models, prompt=prompt, metrics=self.turn_metrics)
        if self.render_pool is not None:
            attach_avatar(session, self.render_pool)
        if not self.sessions:  # a busy spell begins: the loop's worst lag is counted from here
            self.capacity.loop_lag.reset_worst()
        self.sessions[sid] = session
        self._sessions_gauge.set(len(self.sessions))
        self.stalls.start()
        for hook in self.on_session_created:
            await hook(session)
        return session

    async def close_session(self, sid: str) -> bool:
        session = self.sessions.pop(sid, None)
        if session is None:
            return False
        self._sessions_gauge.set(len(self.sessions))
        for hook in self.on_session_closed:
            try:
                await hook(session)
            except Exception:
                log.exception("session-closed hook failed")
        await session.close()
        return True

    async def load_persona(self) -> None:
        """Open the persona memory bank; every session created afterwards talks through it."""
        assert self.models is not None
        if self._open_persona is None:
            raise RuntimeError("persona.enabled, but this engine was given no persona (see engine/app.py)")
        self.persona = await asyncio.to_thread(self._open_persona, self.settings, self.models)
        persona = self.persona
        self.prompt_factory = lambda sid: persona

    async def shutdown(self) -> None:
        self.gc_pauses.stop()
        self.stalls.stop()
        for sid in list(self.sessions):
            await self.close_session(sid)
        await self._owner.cancel_all()
        if self.render_pool is not None:
            self.render_pool.close()
        if self.persona is not None:
            await self.persona.close()
        if self._owns_models and self.models is not None:
            await close_models(self.models)
