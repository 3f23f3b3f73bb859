"""The door of the HTTP server: one middleware that every request passes before its handler.

In order, for every request:

1. **Host**: the ``Host`` header must name this server (loopback names, ``server.host`` when it is
   an address, ``server.allowed_hosts``): a DNS-rebinding page, whose requests carry its own name, is
   answered ``421``.
2. **Origin**: a state-changing request (anything but GET/HEAD/OPTIONS) and every WebSocket upgrade
   that carries an ``Origin`` must come from this server's own origin or ``server.allowed_origins``
   (``403`` otherwise). Browsers always send ``Origin`` on such requests; tools without one are judged
   by their credential alone.
3. **Content type**: a state-changing request must say ``Content-Type: application/json`` (``415``),
   except the WHIP/WHEP offers, whose protocol is ``application/sdp`` (checked by their handler).
   A cross-origin page can send neither without a CORS preflight, which is never granted by default.
4. **Credential**: ``Authorization: Bearer <token>``, or the same-origin cookie the console (host) or
   the OBS/overlay pages (viewer) were given when a browser on this machine opened them. No valid
   credential → ``401``; a viewer credential on a host route → ``403``. The cookie is ignored on
   requests a browser marks as cross-site or same-site (``Sec-Fetch-Site``).

CORS: none by default; origins in ``server.allowed_origins`` get ``Access-Control-Allow-Origin``
(no cookies: they must send a bearer token) and their preflights answered.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from engine.server.credentials import Credentials, Scope
from engine.server.errors import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CREDENTIALS_KEY = web.AppKey("credentials", Credentials)
SCOPE_KEY = web.RequestKey("scope", str)
HOST_COOKIE = "idolcast_host"
VIEWER_COOKIE = "idolcast_viewer"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Routes anyone may GET: the pages, their scripts, the health check, the API description.
PUBLIC = frozenset(
    {
        "/",
        "/console",
        "/console/",
        "/obs",
        "/obs/",
        "/overlay",
        "/overlay/",
        "/web",
        "/api/health",
        "/api/capacity",
        "/api/surfaces/options",
        "/api/openapi.json",
    }
)
# Routes a viewer token may use (the host token may use everything).
VIEWER_ROUTES = frozenset(
    {
        ("GET", "/api/auth"),
        ("POST", "/api/auth/session"),
        ("DELETE", "/api/auth/session"),
        ("GET", "/api/streams"),
        ("GET", "/api/ice-servers"),
        ("GET", "/api/sessions/{sid}/clock"),
        ("GET", "/api/sessions/{sid}/events"),
        ("POST", "/api/sessions/{sid}/whep"),
        ("DELETE", "/api/whep/{rid}"),
        ("PATCH", "/api/whep/{rid}"),
        ("GET", "/metrics"),
        ("GET", "/api/capacity"),  # read-only, for an autoscaler holding a viewer token
    }
)
# The protocol's own body type is SDP here (WHIP, WHEP); PATCH is answered 405.
SDP_ROUTES = frozenset(
    {
        ("POST", "/api/whip"),
        ("POST", "/api/sessions/{sid}/whip"),
        ("POST", "/api/sessions/{sid}/whep"),
        ("PATCH", "/api/whip/{rid}"),
        ("PATCH", "/api/whep/{rid}"),
    }
)
# Routes that also take ``surfaces.bearer_token`` (OBS's WHIP output has one token field).
WHIP_WHEP_ROUTES = SDP_ROUTES | {("DELETE", "/api/whip/{rid}"), ("DELETE", "/api/whep/{rid}")}
# Opening these pages from a browser on this machine hands it a cookie of this scope.
BOOTSTRAP: dict[str, Scope] = {
    "/": "host",
    "/console": "host",
    "/console/": "host",
    "/obs": "viewer",
    "/obs/": "viewer",
    "/overlay": "viewer",
    "/overlay/": "viewer",
    "/web/index.html": "host",
}


def host_name(host_header: str) -> str:
    """``Host`` without its port, lower-case (``[::1]:8080`` → ``::1``)."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def is_loopback(address: str | None) -> bool:
    if not address:
        return False
    if address.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def allowed_host_names(bind: str, extra: list[str]) -> frozenset[str]:
    names = set(LOOPBACK_NAMES) | {host_name(n) for n in extra}
    if bind not in ("", "0.0.0.0", "::"):
        names.add(host_name(bind) if not bind.count(":") > 1 else bind.lower())
    return frozenset(names)


def route_of(request: web.Request) -> str | None:
    info = request.match_info
    if getattr(info, "http_exception", None) is not None:
        return None
    route = info.route
    return route.resource.canonical if route.resource is not None else None


def _refuse(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    response = error_response(status, message)
    if headers:
        response.headers.update(headers)
    return response


def bearer(request: web.Request) -> str:
    given = request.headers.get(hdrs.AUTHORIZATION, "")
    return given[7:].strip() if given[:7].lower() == "bearer " else ""


def presented_scope(request: web.Request, creds: Credentials, extra_token: str = "") -> Scope | None:
    """The scope of the credential the request carries (None: none, or none valid)."""
    token = bearer(request)
    if token:
        if extra_token and token == extra_token:
            return "host"
        return creds.check(token)
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return None  # a page on another origin (or port) made the browser send our cookie
    for name in (HOST_COOKIE, VIEWER_COOKIE):
        scope = creds.check(request.cookies.get(name, ""))
        if scope is not None:
            return scope
    return None


def make_guard(
    creds: Credentials,
    allowed_hosts: frozenset[str],
    allowed_origins: frozenset[str],
    bootstrap: bool,
    whip_token: Callable[[], str],
) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        raw_host = request.headers.get(hdrs.HOST, "")
        if host_name(raw_host) not in allowed_hosts:
            return _refuse(421, "this server does not answer to that host name (see server.allowed_hosts)")
        origin = request.headers.get(hdrs.ORIGIN)
        same_origin = f"{request.scheme}://{raw_host}".lower()
        origin_ok = origin is None or origin.lower() == same_origin or origin in allowed_origins
        cors = origin is not None and origin in allowed_origins
        if request.method == "OPTIONS":
            if not cors:
                return _refuse(403, "no cross-origin requests are allowed from this origin")
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Origin": origin or "",
                    "Access-Control-Allow-Methods": "GET, POST, PATCH, DELETE",
                    "Access-Control-Allow-Headers": "Authorization, Content-Type",
                    "Access-Control-Expose-Headers": "Location, Link",
                    "Access-Control-Max-Age": "600",
                    "Vary": "Origin",
                },
            )
        upgrade = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
        unsafe = request.method not in SAFE_METHODS
        if (unsafe or upgrade) and not origin_ok:
            return _refuse(
                403, f"requests from origin {origin!r} are not allowed (see server.allowed_origins)"
            )
        route = route_of(request)
        key = (request.method, route or "")
        has_body = request.method in ("POST", "PUT", "PATCH")
        if has_body and key not in SDP_ROUTES and request.content_type != "application/json":
            return _refuse(415, "state-changing requests need Content-Type: application/json")
        public = request.method in ("GET", "HEAD") and (route in PUBLIC or route is None)
        if not public:
            extra = whip_token() if key in WHIP_WHEP_ROUTES else ""
            scope = presented_scope(request, creds, extra)
            if scope is None:
                return _refuse(
                    401,
                    "a valid credential is required (Authorization: Bearer <token>; see docs/api.md)",
                    {"WWW-Authenticate": 'Bearer realm="idolcast"'},
                )
            if scope == "viewer" and key not in VIEWER_ROUTES:
                return _refuse(403, "this needs the host credential (a viewer token is read-only)")
            request[SCOPE_KEY] = scope
        response = await handler(request)
        if cors and not response.prepared:
            response.headers["Access-Control-Allow-Origin"] = origin or ""
            response.headers["Vary"] = "Origin"
        wanted = BOOTSTRAP.get(request.path) if bootstrap and request.method == "GET" else None
        if wanted == "viewer" and request.path.startswith("/obs") and request.query.get("own") == "1":
            wanted = "host"  # the OBS page that opens a session of its own (24/7 chat-driven streams)
        if (
            wanted is not None
            and response.status == 200
            and not response.prepared
            and is_loopback(request.remote)
            and is_loopback(host_name(raw_host))
        ):
            name, value = (
                (HOST_COOKIE, creds.host_token)
                if wanted == "host"
                else (VIEWER_COOKIE, creds.local_viewer_token)
            )
            response.set_cookie(name, value, httponly=True, samesite="Strict", path="/")
        return response

    return guard
