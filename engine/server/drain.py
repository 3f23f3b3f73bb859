"""Graceful drain: what ``idolcast serve`` does on SIGTERM (a pod being rescheduled, ``docker stop``).

1. **Stop admitting**: ``Engine.draining`` is set, so ``POST /api/offer`` (and every other way
   of opening a session) answers 503 with the reason, and ``GET /api/health?ready=1`` (the
   readiness probe) answers 503 ``{"admitting": false, "draining": true}``: the load balancer
   stops sending viewers here. ``/api/health`` itself stays 200 (liveness: the process is fine).
2. **Tell the hosts**: every session's event stream gets ``{"type": "draining", "deadline_s":
   …, "message": …}`` (the console shows it; a studio's controller can move the show).
3. **Let running sessions finish**, up to ``server.drain_timeout_s``: the drain ends as soon as
   the last session is closed (by its host, or its peer going away); turns keep being answered
   meanwhile. At the deadline the remaining sessions are closed.
4. **Flush memory write-backs** (the persona bank's queue), then the normal shutdown (peers,
   models, the store), and the process exits 0.

A second SIGTERM or SIGINT during the drain skips what is left of the wait (steps 3 → 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from engine.events import Draining
from engine.server.diagnostics import install_dump_signal
from engine.server.engine import Engine
from engine.transport import encoders

log = logging.getLogger(__name__)

DRAIN_MESSAGE = "the engine is shutting down (draining): it takes no new sessions; connect to another replica"


async def drain(
    engine: Engine, timeout_s: float, hurry: asyncio.Event | None = None
) -> dict[str, float | int]:
    """Steps 1-4 above, up to the shutdown; returns what happened (for the log)."""
    loop = asyncio.get_running_loop()
    start = loop.time()  # the process's time, deliberately: the drain deadline is no session's media time
    engine.draining = DRAIN_MESSAGE
    running = len(engine.sessions)
    log.warning("draining: %d session(s) may run for up to %.0f s", running, timeout_s)
    for session in list(engine.sessions.values()):
        session.bus.publish(Draining(t=session.clock.now(), deadline_s=timeout_s, message=DRAIN_MESSAGE))
    hurry = hurry or asyncio.Event()
    while engine.sessions and loop.time() - start < timeout_s and not hurry.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(hurry.wait(), 0.2)
    left = len(engine.sessions)
    if left:
        log.warning("drain deadline: closing %d session(s) still running", left)
    for sid in list(engine.sessions):
        await engine.close_session(sid)
    flush = getattr(engine.persona, "flush", None)
    if flush is not None:
        try:
            async with asyncio.timeout(max(5.0, timeout_s)):
                await flush()
        except TimeoutError:
            log.error("drain: persona write-back did not finish in time")
    took = loop.time() - start
    log.warning("drained in %.1f s (%d session(s) ran, %d closed at the deadline)", took, running, left)
    return {"seconds": took, "sessions": running, "closed_at_deadline": left}


async def serve_until_signalled(app: web.Application, engine: Engine, host: str, port: int) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then drain (above) and shut down cleanly.

    The engine process's loop starts here, so its default executor (aiortc's encoders) is sized here too."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(encoders.media_executor(engine.settings.server.max_sessions))
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.warning("%s during the drain: not waiting any longer", sig.name)
            hurry.set()
        else:
            log.warning("%s: draining", sig.name)
            stop.set()

    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        install_dump_signal(loop)  # kill -USR1: every thread's and task's stack on stderr
        await stop.wait()
        await drain(engine, engine.settings.server.drain_timeout_s, hurry)
    finally:
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
