"""The HTTP face of the engine: the console page, signaling, the session API, events and metrics.

The surfaces (WHIP/WHEP/RTMP, chat, the OBS and overlay pages) and the persona's routes are added by the
application (engine/app.py): engine.server does not import them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from aiohttp import WSMsgType, web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.config import Settings
from engine.events import ExpressionCommand, GestureCommand, TurnSource
from engine.server.auth_routes import register_auth_routes
from engine.server.credentials import Credentials
from engine.server.engine import Engine
from engine.server.errors import APIError, json_errors, read_json, require_str
from engine.server.guard import CREDENTIALS_KEY, allowed_host_names, make_guard
from engine.server.openapi import openapi
from engine.server.webrtc import PeerManager
from engine.session.session import Session, SessionClosed
from engine.tasks import TaskOwner
from engine.text.tags import EXPRESSIONS, GESTURES
from engine.transport.ice import register_ice_routes

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
ENGINE_KEY = web.AppKey("engine", Engine)
PEERS_KEY = web.AppKey("peers", PeerManager)
MAX_MESSAGE_CHARS = 2000


def _engine(request: web.Request) -> Engine:
    return request.app[ENGINE_KEY]


def _session(request: web.Request) -> Session:
    sid = request.match_info["sid"]
    session = _engine(request).sessions.get(sid)
    if session is None:
        raise APIError(404, f"no session '{sid}'")
    return session


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(WEB_DIR / "console" / "index.html")  # the minimal page stays at /web/index.html


async def health(request: web.Request) -> web.Response:
    """Liveness (200 while the process works); with ``?ready=1``, readiness: 503 unless admitting."""
    engine = _engine(request)
    body = engine.status.as_dict() | {"sessions": len(engine.sessions)}
    body |= {"admitting": engine.admitting, "draining": engine.draining is not None}
    if engine.models is not None:
        body["models"] = engine.models.describe()
    ready = request.query.get("ready") not in (None, "", "0")
    return web.json_response(body, status=503 if ready and not engine.admitting else 200)


async def offer(request: web.Request) -> web.Response:
    data = await read_json(request)
    session, answer = await request.app[PEERS_KEY].answer(data.get("sdp"), data.get("type", "offer"))  # type: ignore[arg-type]
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session.id})


async def say(request: web.Request) -> web.Response:
    session = _session(request)
    data = await read_json(request)
    text = require_str(data, "text", MAX_MESSAGE_CHARS)
    speaker = data.get("speaker", "host")
    if not isinstance(speaker, str) or not speaker.strip() or len(speaker) > 64:
        raise APIError(400, "'speaker' must be a name of at most 64 characters")
    source: TurnSource = "host_text" if speaker == "host" else "chat"
    try:
        turn_id = await session.submit_text(text, speaker=speaker, source=source)
    except asyncio.QueueFull:
        raise APIError(429, "too many turns waiting; try again in a moment") from None
    except SessionClosed:
        raise APIError(410, "session closed") from None
    return web.json_response({"turn_id": turn_id}, status=202)


async def interrupt(request: web.Request) -> web.Response:
    stopped = await _session(request).interrupt("host")
    return web.json_response({"interrupted": stopped})


async def expression(request: web.Request) -> web.Response:
    session = _session(request)
    name = require_str(await read_json(request), "name", 32)
    if name not in EXPRESSIONS:
        raise APIError(400, f"unknown expression '{name}' (one of {', '.join(EXPRESSIONS)})")
    session.command(ExpressionCommand(t=session.clock.now(), name=name))
    return web.json_response({"expression": name})


async def gesture(request: web.Request) -> web.Response:
    session = _session(request)
    name = require_str(await read_json(request), "name", 32)
    if name not in GESTURES:
        raise APIError(400, f"unknown gesture '{name}' (one of {', '.join(GESTURES)})")
    session.command(GestureCommand(t=session.clock.now(), name=name))
    return web.json_response({"gesture": name})


async def turns(request: web.Request) -> web.Response:
    session = _session(request)
    return web.json_response({"session_id": session.id, "turns": [t.to_dict() for t in session.turns]})


async def close(request: web.Request) -> web.Response:
    if not await _engine(request).close_session(request.match_info["sid"]):
        raise APIError(404, f"no session '{request.match_info['sid']}'")
    return web.json_response({"closed": True})


async def events(request: web.Request) -> web.StreamResponse:
    session = _session(request)
    ws = web.WebSocketResponse(heartbeat=20)
    await ws.prepare(request)

    async def drain_incoming() -> None:
        async for msg in ws:
            if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break

    owner = TaskOwner(f"events-{session.id}")  # this socket's two tasks, cancelled when it ends
    reader = owner.spawn(drain_incoming(), "reader")
    try:
        async with session.bus.subscribe() as queue:
            while not ws.closed:
                get = owner.spawn(queue.get(), "next")
                done, _ = await asyncio.wait({get, reader}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    break
                event = get.result()
                if event is None:
                    break
                await ws.send_str(json.dumps(event, default=str))
    finally:
        await owner.cancel_all()
        await ws.close()
    return ws


async def capacity(request: web.Request) -> web.Response:
    """Sessions, the estimated capacity and the resource that bounds it (engine/server/capacity.py); with
    video, how the render thread spends its batches (engine/avatar/live.py)."""
    engine = _engine(request)
    report = engine.capacity.report()
    if engine.render_pool is not None:
        report["render"] = engine.render_pool.stats.summary()
    return web.json_response(report)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(_engine(request).registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_server_app(
    settings: Settings, engine: Engine, credentials: Credentials | None = None
) -> web.Application:
    """The server's part of the web application (engine/app.py adds the rest). ``credentials``: who may
    do what (default: from the settings, the host token made on first start; raises
    :class:`~engine.server.credentials.CredentialError`)."""
    if credentials is None:
        credentials, _ = Credentials.from_settings(settings.server.host_token, settings.server.secrets_dir)
    server = settings.server
    guard = make_guard(
        credentials,
        allowed_host_names(server.host, server.allowed_hosts),
        frozenset(server.allowed_origins),
        server.console_bootstrap,
        lambda: settings.surfaces.bearer_token,
    )
    app = web.Application(middlewares=[guard, json_errors], client_max_size=server.max_body_bytes)
    app[CREDENTIALS_KEY] = credentials
    app[ENGINE_KEY] = engine
    app[PEERS_KEY] = PeerManager(engine)
    app.router.add_get("/", index)
    app.router.add_get("/api/health", health)
    app.router.add_post("/api/offer", offer)
    app.router.add_post("/api/sessions/{sid}/say", say)
    app.router.add_post("/api/sessions/{sid}/interrupt", interrupt)
    app.router.add_post("/api/sessions/{sid}/expression", expression)
    app.router.add_post("/api/sessions/{sid}/gesture", gesture)
    app.router.add_get("/api/sessions/{sid}/turns", turns)
    app.router.add_get("/api/sessions/{sid}/events", events)
    app.router.add_delete("/api/sessions/{sid}", close)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/capacity", capacity)
    app.router.add_static("/web/", WEB_DIR, show_index=False)
    register_auth_routes(app)
    app.router.add_get("/api/openapi.json", openapi)
    register_ice_routes(app, settings.server)

    async def on_startup(app: web.Application) -> None:
        engine.start_loading()

    async def on_shutdown(app: web.Application) -> None:
        await app[PEERS_KEY].close_all()
        await engine.shutdown()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app
