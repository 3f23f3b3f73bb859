"""Reachable media: the UDP ports WebRTC uses, and the STUN/TURN servers given to the pages.

**Port range.** aioice (aiortc's ICE, 0.13 here) binds every host candidate to port 0, an
ephemeral port the OS picks, and has no option for a range. A container or a pod can only
publish known ports, so :func:`use_port_range` wraps aioice's candidate gathering
(``Connection.get_component_candidates``): while it runs, a UDP bind to port 0 is redirected
to the first free port of ``[lo, hi]`` (starting at a random offset); a full range fails the
gathering with a clear error. Each session binds one port per local interface address (aiortc
bundles audio and video), so give ``sessions × addresses`` ports at least. TURN allocations
are outgoing and need no published port.

**TURN.** ``server.ice_servers`` (``stun:``/``turn:``/``turns:`` URLs, with
``ice_username``/``ice_credential`` for the TURN ones) configures the engine's own peer and is
served to the pages at ``GET /api/ice-servers`` in the browser's ``RTCIceServer`` shape.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import functools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aioice.ice
from aiohttp import web
from aiortc import RTCIceServer

log = logging.getLogger(__name__)
_RANGE: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "idolcast_ice_range", default=None
)
_range: tuple[int, int] | None = None
_ORIGINAL = aioice.ice.Connection.get_component_candidates


class PortRangeExhausted(OSError):
    """Every UDP port of the configured range is taken."""


class ICESettings(Protocol):
    """The ``[server]`` keys ICE reads (``engine.config.ServerConfig`` has them): the stage never
    imports the settings model."""

    ice_servers: list[str]
    ice_username: str
    ice_credential: str
    ice_port_min: int
    ice_port_max: int


def ice_servers(cfg: ICESettings) -> list[dict[str, Any]]:
    """The configured servers as the browser's ``RTCIceServer`` dictionaries."""
    out: list[dict[str, Any]] = []
    for url in cfg.ice_servers:
        entry: dict[str, Any] = {"urls": url}
        if url.startswith(("turn:", "turns:")) and cfg.ice_username:
            entry |= {"username": cfg.ice_username, "credential": cfg.ice_credential}
        out.append(entry)
    return out


def rtc_ice_servers(cfg: ICESettings) -> list[RTCIceServer]:
    return [
        RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
        for s in ice_servers(cfg)
    ]


def use_port_range(lo: int, hi: int) -> None:
    """Bind WebRTC host candidates in ``[lo, hi]`` from now on (0, 0: the OS's choice again)."""
    global _range
    if (lo, hi) == (0, 0):
        _range = None
        return
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"server.ice_port_min..ice_port_max must be a range in 1024..65535, got {lo}..{hi}")
    _range = (lo, hi)
    aioice.ice.Connection.get_component_candidates = _gather_in_range  # type: ignore[method-assign]


def configure(cfg: ICESettings) -> None:
    use_port_range(cfg.ice_port_min, cfg.ice_port_max)


async def _gather_in_range(self: aioice.ice.Connection, *args: Any, **kwargs: Any) -> Any:
    if _range is None:
        return await _ORIGINAL(self, *args, **kwargs)
    loop = asyncio.get_running_loop()
    if not getattr(loop, "_idolcast_ranged", False):
        loop.create_datagram_endpoint = functools.partial(_ranged_endpoint, loop.create_datagram_endpoint)  # type: ignore[method-assign]
        loop._idolcast_ranged = True  # type: ignore[attr-defined]
    token = _RANGE.set(_range)
    try:
        return await _ORIGINAL(self, *args, **kwargs)
    finally:
        _RANGE.reset(token)


async def _ranged_endpoint(
    original: Callable[..., Awaitable[Any]], factory: Any, *args: Any, **kwargs: Any
) -> Any:
    span = _RANGE.get()
    local = kwargs.get("local_addr")
    if span is None or not local or local[1] != 0:
        return await original(factory, *args, **kwargs)
    lo, hi = span
    n = hi - lo + 1
    start = random.randrange(n)
    for i in range(n):
        port = lo + (start + i) % n
        try:
            return await original(factory, *args, **{**kwargs, "local_addr": (local[0], port)})
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
    log.error(
        "WebRTC: every UDP port in %d..%d is in use on %s: widen server.ice_port_min..max", lo, hi, local[0]
    )
    raise PortRangeExhausted(errno.EADDRINUSE, f"every UDP port in {lo}..{hi} is in use on {local[0]}")


async def ice_servers_route(request: web.Request) -> web.Response:
    """``GET /api/ice-servers``: what the pages pass to ``new RTCPeerConnection({iceServers})``."""
    cfg: ICESettings = request.app[ICE_CONFIG_KEY]
    return web.json_response({"iceServers": ice_servers(cfg)})


ICE_CONFIG_KEY = web.AppKey("ice_config", ICESettings)


def register_ice_routes(app: web.Application, cfg: ICESettings) -> None:
    app[ICE_CONFIG_KEY] = cfg
    app.router.add_get("/api/ice-servers", ice_servers_route)
