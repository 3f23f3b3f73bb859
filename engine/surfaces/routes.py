"""HTTP routes of the streamer surfaces, and the per-session wiring (``register_surfaces``).

Routes (all JSON errors through :mod:`engine.server.errors`; ``{sid}`` may be ``latest``)::

    GET    /console/ /obs/ /overlay/            the pages (web/console, web/obs, web/overlay)
    GET    /api/streams                         open sessions, newest first, with what they carry
    GET    /api/surfaces/options                expressions, gestures, output profiles
    GET    /api/sessions/{sid}/clock            the session clock's now (overlay clock sync)
    POST   /api/sessions/{sid}/chat             ChatIn → the chat queue (same as MQTT chat/in)
    GET    /api/sessions/{sid}/chat             chat queue stats
    POST   /api/sessions/{sid}/profile|persona  {"name"}; 501 until the session supports it
    POST   /api/whip                            WHIP: a new session whose mic is the pushed audio
    POST   /api/sessions/{sid}/whip             WHIP: push audio into an existing session
    DELETE /api/whip/{id}   PATCH → 405
    POST   /api/sessions/{sid}/whep             WHEP: pull the session's audio (+ video; ?alpha=packed: colour|alpha)
    DELETE /api/whep/{id}   PATCH → 405
    POST|GET|DELETE /api/sessions/{sid}/rtmp    start ({"url"?}) / status / stop RTMP egress
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from engine.avatar.profiles import PROFILES
from engine.events import PersonaChanged, ProfileChanged
from engine.server.engine import Engine
from engine.server.errors import APIError, read_json, require_str
from engine.server.webrtc import PeerManager
from engine.session.session import Session
from engine.surfaces.hub import Surfaces
from engine.surfaces.payloads import ChatIn
from engine.surfaces.rtmp import target_allowed
from engine.surfaces.sdp_http import answer_response, patch_not_supported, read_offer
from engine.text.tags import EXPRESSIONS, GESTURES
from persona.card import CardError, load_named_card

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
SURFACES_KEY = web.AppKey("surfaces", Surfaces)


def _hub(request: web.Request) -> Surfaces:
    return request.app[SURFACES_KEY]


def _session(request: web.Request) -> Session:
    session = _hub(request).find_session(request.match_info["sid"])
    if session is None:
        raise APIError(404, f"no session '{request.match_info['sid']}'")
    return session


async def streams(request: web.Request) -> web.Response:
    return web.json_response({"sessions": _hub(request).describe_sessions()})


async def options(request: web.Request) -> web.Response:
    settings = _hub(request).engine.settings
    return web.json_response(
        {
            "expressions": list(EXPRESSIONS),
            "gestures": list(GESTURES),
            "profiles": list(PROFILES),
            "profile": settings.avatar.profile,
            "packed_alpha": settings.avatar.packed_alpha,
        }
    )


async def clock(request: web.Request) -> web.Response:
    session = _session(request)
    delay = _hub(request).engine.settings.surfaces.playout_delay_ms
    return web.json_response(
        {"session_id": session.id, "now": session.clock.now(), "playout_delay_ms": delay}
    )


async def chat_post(request: web.Request) -> web.Response:
    session = _session(request)
    try:
        msg = ChatIn.model_validate(await read_json(request))
    except ValidationError as e:
        err = e.errors()[0]
        raise APIError(400, f"'{'.'.join(str(p) for p in err['loc'])}': {err['msg']}") from None
    verdict = _hub(request).chat(session.id, msg)
    return web.json_response({"verdict": verdict}, status=202 if verdict == "accepted" else 200)


async def chat_stats(request: web.Request) -> web.Response:
    session = _session(request)
    queue = _hub(request).chats.get(session.id)
    stats: dict[str, Any] = dict(queue.stats) if queue else {}
    return web.json_response({"pending": queue.pending if queue else 0, "stats": stats})


async def profile(request: web.Request) -> web.Response:
    session = _session(request)
    name = require_str(await read_json(request), "name", 32)
    if name not in PROFILES:
        raise APIError(400, f"unknown output profile '{name}' (one of {', '.join(PROFILES)})")
    try:
        session.set_output_profile(name)
    except ValueError as e:
        raise APIError(409, str(e)) from None
    session.bus.publish(ProfileChanged(t=session.clock.now(), name=name))
    return web.json_response({"profile": name})


async def persona(request: web.Request) -> web.Response:
    session = _session(request)
    name = require_str(await read_json(request), "name", 64)
    cards_dir = Path(_hub(request).engine.settings.persona.cards_dir)
    try:  # by name only (builtin:NAME or a card in persona.cards_dir), read in a thread
        card = await asyncio.to_thread(load_named_card, name, cards_dir)
        switch = getattr(session.prompt, "switch_persona", None)
        if switch is None:
            raise APIError(501, "persona switching needs the persona memory bank (persona.enabled)")
        await switch(card)
    except (KeyError, ValueError, CardError) as e:
        raise APIError(400, f"cannot switch to that persona: {e}") from None
    session.bus.publish(PersonaChanged(t=session.clock.now(), name=name))
    return web.json_response({"persona": name})


# ---- WHIP / WHEP ---------------------------------------------------------------------------------


async def whip_new(request: web.Request) -> web.Response:
    hub = _hub(request)
    ingest, sdp = await hub.whip.new_session(await read_offer(request))
    return answer_response(sdp, f"/api/whip/{ingest.id}", hub.engine.settings.server.ice_servers)


async def whip_into(request: web.Request) -> web.Response:
    hub = _hub(request)
    session = _session(request)
    ingest, sdp = await hub.whip.into_session(session, await read_offer(request))
    return answer_response(sdp, f"/api/whip/{ingest.id}", hub.engine.settings.server.ice_servers)


async def whip_delete(request: web.Request) -> web.Response:
    hub = _hub(request)
    if not await hub.whip.close(request.match_info["rid"]):
        raise APIError(404, f"no WHIP resource '{request.match_info['rid']}'")
    return web.Response(status=200)


async def whep_new(request: web.Request) -> web.Response:
    hub = _hub(request)
    session = _session(request)
    alpha = request.query.get("alpha")
    if alpha not in (None, "packed"):
        raise APIError(400, f"alpha={alpha!r}: expected 'packed' (colour | alpha side by side) or nothing")
    viewer, sdp = await hub.whep.answer(session, await read_offer(request), video=alpha)
    return answer_response(sdp, f"/api/whep/{viewer.id}", hub.engine.settings.server.ice_servers)


async def whep_delete(request: web.Request) -> web.Response:
    hub = _hub(request)
    if not await hub.whep.close(request.match_info["rid"]):
        raise APIError(404, f"no WHEP resource '{request.match_info['rid']}'")
    return web.Response(status=200)


async def patch(request: web.Request) -> web.Response:
    return patch_not_supported()


# ---- RTMP ----------------------------------------------------------------------------------------


async def rtmp_start(request: web.Request) -> web.Response:
    hub = _hub(request)
    session = _session(request)
    body = await read_json(request) if request.can_read_body else {}
    config = hub.engine.settings.surfaces.rtmp
    url = body.get("url") or config.url
    if not isinstance(url, str) or not url:
        raise APIError(400, "'url' is required (or set surfaces.rtmp.url)")
    if url != config.url and not target_allowed(url, config):
        raise APIError(
            403, "that RTMP host is not allowed (surfaces.rtmp.allowed_hosts, or set surfaces.rtmp.url)"
        )
    try:
        streamer = await hub.start_rtmp(session, url)
    except ValueError as e:
        raise APIError(400, str(e)) from None
    return web.json_response(streamer.status(), status=201)


async def rtmp_status(request: web.Request) -> web.Response:
    streamer = _hub(request).rtmp.get(_session(request).id)
    return web.json_response(streamer.status() if streamer else {"state": "off"})


async def rtmp_stop(request: web.Request) -> web.Response:
    if not await _hub(request).stop_rtmp(_session(request).id):
        raise APIError(404, "no RTMP stream for this session")
    return web.json_response({"state": "stopped"})


# ---- pages ---------------------------------------------------------------------------------------


def _page(folder: str) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(WEB_DIR / folder / "index.html")

    return handler


def register_surfaces(app: web.Application, engine: Engine, peers: PeerManager) -> Surfaces:
    hub = Surfaces(engine, peers)
    app[SURFACES_KEY] = hub
    r = app.router
    for folder in ("console", "obs", "overlay"):
        r.add_get(f"/{folder}/", _page(folder))
        r.add_get(f"/{folder}", _page(folder))
    r.add_get("/api/streams", streams)
    r.add_get("/api/surfaces/options", options)
    r.add_get("/api/sessions/{sid}/clock", clock)
    r.add_post("/api/sessions/{sid}/chat", chat_post)
    r.add_get("/api/sessions/{sid}/chat", chat_stats)
    r.add_post("/api/sessions/{sid}/profile", profile)
    r.add_post("/api/sessions/{sid}/persona", persona)
    r.add_post("/api/whip", whip_new)
    r.add_post("/api/sessions/{sid}/whip", whip_into)
    r.add_delete("/api/whip/{rid}", whip_delete)
    r.add_patch("/api/whip/{rid}", patch)
    r.add_post("/api/sessions/{sid}/whep", whep_new)
    r.add_delete("/api/whep/{rid}", whep_delete)
    r.add_patch("/api/whep/{rid}", patch)
    r.add_post("/api/sessions/{sid}/rtmp", rtmp_start)
    r.add_get("/api/sessions/{sid}/rtmp", rtmp_status)
    r.add_delete("/api/sessions/{sid}/rtmp", rtmp_stop)

    async def on_startup(app: web.Application) -> None:
        await hub.start()

    async def on_cleanup(app: web.Application) -> None:
        await hub.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return hub
