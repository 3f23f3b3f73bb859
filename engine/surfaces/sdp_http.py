"""The HTTP shape shared by WHIP (RFC 9725) and WHEP (draft-ietf-wish-whep).

POST an SDP offer (``Content-Type: application/sdp``) → ``201 Created``, ``Location`` of the session
resource, the SDP answer as the body; ``DELETE`` on the resource ends it; ``PATCH`` (trickle ICE / ICE
restart) is not supported: our answers carry every candidate, so it gets ``405`` with ``Allow``.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from aiortc import RTCConfiguration, RTCIceServer

from engine.server.errors import APIError
from engine.server.peer import MAX_SDP_BYTES, validate_offer

SDP_TYPE = "application/sdp"


async def read_offer(request: web.Request) -> str:
    """The SDP offer of a WHIP/WHEP POST, or a 4xx that says what is wrong."""
    if request.content_type != SDP_TYPE:
        raise APIError(415, f"expected Content-Type {SDP_TYPE} (got {request.content_type or 'none'})")
    raw = await request.content.read(MAX_SDP_BYTES + 1)
    if len(raw) > MAX_SDP_BYTES:
        raise APIError(413, f"SDP too large (limit {MAX_SDP_BYTES} bytes)")
    try:
        sdp = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, "the SDP offer is not UTF-8 text") from None
    return validate_offer(sdp, "offer")


def answer_response(sdp: str, location: str, ice_servers: Iterable[str] = ()) -> web.Response:
    headers = {"Location": location, "Access-Control-Expose-Headers": "Location, Link"}
    links = [f'<{url}>; rel="ice-server"' for url in ice_servers]
    if links:
        headers["Link"] = ", ".join(links)
    return web.Response(status=201, body=sdp.encode(), content_type=SDP_TYPE, headers=headers)


def patch_not_supported() -> web.Response:
    return web.json_response(
        {
            "error": "trickle ICE and ICE restarts are not supported: the answer carries all candidates",
            "status": 405,
        },
        status=405,
        headers={"Allow": "DELETE"},
    )


def rtc_configuration(ice_servers: Iterable[str]) -> RTCConfiguration:
    return RTCConfiguration(iceServers=[RTCIceServer(urls=url) for url in ice_servers])
