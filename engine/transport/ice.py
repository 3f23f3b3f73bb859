"""Reachable media: the UDP ports WebRTC uses, and the STUN/TURN servers given to the pages.

**Port range.** aioice (aiortc's ICE, 0.13 here) binds every host candidate to port 0, an
ephemeral port the OS picks, and has no option for a range. A container or a pod can only
publish known ports, so :func:`use_port_range` wraps aioice's candidate gathering
(``Connection.get_component_candidates``): while it runs, a UDP bind to port 0 is redirected
to the first free port of ``[lo, hi]`` (starting at a random offset); a full range fails the
gathering with a clear error. Each session binds one port per local interface address (aiortc
bundles audio and video), so give ``sessions × addresses`` ports at least. TURN allocations
are outgoing and need no published port.

**Draining.** The same wrapper has every candidate's socket read all its waiting datagrams when
it is ready, not one per turn of the event loop (engine/transport/datagrams.py says why: with many
sessions the backlog made ICE consent answers seconds late).

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
from dataclasses import dataclass
from typing import Any, Protocol

import aioice.ice
from aiohttp import web
from aiortc import RTCIceServer

from engine.transport.datagrams import drain_when_ready

log = logging.getLogger(__name__)
_range: tuple[int, int] | None = None
_ORIGINAL = aioice.ice.Connection.get_component_candidates


@dataclass(frozen=True)
class _Gathering:
    span: tuple[int, int] | None  # the port range of this gathering, if any


_GATHERING: contextvars.ContextVar[_Gathering | None] = contextvars.ContextVar(
    "idolcast_ice_gathering", default=None
)


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
    install()


def install() -> None:
    """Wrap aioice's candidate gathering (once): its sockets drain per wake, and bind in the range if set."""
    aioice.ice.Connection.get_component_candidates = _gather  # type: ignore[method-assign]


def configure(cfg: ICESettings) -> None:
    install()
    use_port_range(cfg.ice_port_min, cfg.ice_port_max)


async def _gather(self: aioice.ice.Connection, *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    if not getattr(loop, "_idolcast_gathering", False):
        loop.create_datagram_endpoint = functools.partial(_endpoint, loop.create_datagram_endpoint)  # type: ignore[method-assign]
        loop._idolcast_gathering = True  # type: ignore[attr-defined]
    token = _GATHERING.set(_Gathering(_range))
    try:
        return await _ORIGINAL(self, *args, **kwargs)
    finally:
        _GATHERING.reset(token)


async def _endpoint(original: Callable[..., Awaitable[Any]], factory: Any, *args: Any, **kwargs: Any) -> Any:
    """``loop.create_datagram_endpoint`` while aioice gathers: ranged, then drained (engine/transport/datagrams.py)."""
    gathering = _GATHERING.get()
    if gathering is None:
        return await original(factory, *args, **kwargs)
    transport, protocol = await _ranged(original, gathering.span, factory, *args, **kwargs)
    drain_when_ready(transport)
    return transport, protocol


async def _ranged(
    original: Callable[..., Awaitable[Any]],
    span: tuple[int, int] | None,
    factory: Any,
    *args: Any,
    **kwargs: Any,
) -> Any:
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
