"""Routes of the credentials: who am I, the page cookie, and the viewer tokens (host scope).

GET    /api/auth              {"scope": host|viewer}
POST   /api/auth/session      {}  with Authorization: Bearer → the same-origin cookie of that scope
DELETE /api/auth/session      drops the cookies
GET    /api/tokens            the viewer tokens (without their secrets)
POST   /api/tokens            {"label"?} → 201 {"id", "token", "label", "scope": "viewer"} (shown once)
DELETE /api/tokens/{id}       revoke
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from engine.server.errors import APIError, read_json
from engine.server.guard import CREDENTIALS_KEY, HOST_COOKIE, SCOPE_KEY, VIEWER_COOKIE, bearer


async def whoami(request: web.Request) -> web.Response:
    return web.json_response({"scope": request.get(SCOPE_KEY)})


async def cookie_session(request: web.Request) -> web.Response:
    """Trade a bearer token for an HttpOnly same-origin cookie (so the page's WebSocket carries it)."""
    await read_json(request)
    token = bearer(request)
    if not token:
        raise APIError(400, "send the token as Authorization: Bearer <token>")
    scope = request.get(SCOPE_KEY)
    response = web.json_response({"scope": scope})
    name = HOST_COOKIE if scope == "host" else VIEWER_COOKIE
    response.set_cookie(name, token, httponly=True, samesite="Strict", path="/")
    return response


async def drop_cookies(request: web.Request) -> web.Response:
    response = web.json_response({"scope": None})
    for name in (HOST_COOKIE, VIEWER_COOKIE):
        response.del_cookie(name, path="/")
    return response


async def list_tokens(request: web.Request) -> web.Response:
    creds = request.app[CREDENTIALS_KEY]
    return web.json_response({"tokens": [v.public() for v in creds.viewers.values()]})


async def create_token(request: web.Request) -> web.Response:
    data = await read_json(request)
    label = data.get("label", "")
    if not isinstance(label, str) or len(label) > 64:
        raise APIError(400, "'label' must be a string of at most 64 characters")
    creds = request.app[CREDENTIALS_KEY]
    try:
        viewer, secret = await asyncio.to_thread(creds.create_viewer, label.strip())
    except ValueError as e:
        raise APIError(409, str(e)) from None
    return web.json_response(viewer.public() | {"token": secret}, status=201)


async def revoke_token(request: web.Request) -> web.Response:
    creds = request.app[CREDENTIALS_KEY]
    tid = request.match_info["tid"]
    if not await asyncio.to_thread(creds.revoke_viewer, tid):
        raise APIError(404, f"no viewer token '{tid[:32]}'")
    return web.json_response({"revoked": tid})


def register_auth_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/auth", whoami)
    r.add_post("/api/auth/session", cookie_session)
    r.add_delete("/api/auth/session", drop_cookies)
    r.add_get("/api/tokens", list_tokens)
    r.add_post("/api/tokens", create_token)
    r.add_delete("/api/tokens/{tid}", revoke_token)
