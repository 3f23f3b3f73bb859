"""The OpenAPI description of the HTTP API, served at ``GET /api/openapi.json`` (public).

One table, written by hand next to the routes it describes; ``tests/engine/test_openapi.py`` checks
that every registered route is in it and fuzzes it with schemathesis (no input may give a 500).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

Json = dict[str, Any]


def _str(max_len: int = 2000, **extra: Any) -> Json:
    return {"type": "string", "maxLength": max_len, **extra}


def _obj(props: Json, required: tuple[str, ...] = ()) -> Json:
    body: Json = {"type": "object", "properties": props}
    if required:
        body["required"] = list(required)
    return body


SID = {"name": "sid", "in": "path", "required": True, "schema": _str(64)}
RID = {"name": "rid", "in": "path", "required": True, "schema": _str(64)}
MID = {"name": "id", "in": "path", "required": True, "schema": _str(40)}
TID = {"name": "tid", "in": "path", "required": True, "schema": _str(64)}
OFFER = _obj({"sdp": _str(65536), "type": {"type": "string", "enum": ["offer"]}}, ("sdp",))
CHAT = _obj(
    {"user": _str(64), "text": _str(2000), "role": {"type": "string", "enum": ["chat", "member", "host"]}}
)

# (method, path, scope, summary, JSON body schema or "sdp" or None, path parameters, query parameters)
ROUTES: list[tuple[str, str, str, str, Json | str | None, list[Json], list[Json]]] = [
    ("get", "/api/health", "public", "loading state and sessions", None, [], []),
    ("get", "/api/capacity", "public", "sessions and the estimated capacity", None, [], []),
    ("get", "/api/surfaces/options", "public", "expressions, gestures, output profiles", None, [], []),
    ("get", "/api/auth", "viewer", "the scope of the request's credential", None, [], []),
    ("post", "/api/auth/session", "viewer", "trade the bearer token for the page cookie", _obj({}), [], []),
    ("delete", "/api/auth/session", "viewer", "drop the page cookies", None, [], []),
    ("get", "/api/tokens", "host", "the viewer tokens", None, [], []),
    ("post", "/api/tokens", "host", "make a viewer token", _obj({"label": _str(64)}), [], []),
    ("delete", "/api/tokens/{tid}", "host", "revoke a viewer token", None, [TID], []),
    ("post", "/api/offer", "host", "a new session (WebRTC offer → answer)", OFFER, [], []),
    (
        "post",
        "/api/sessions/{sid}/say",
        "host",
        "a text turn",
        _obj({"text": _str(), "speaker": _str(64)}),
        [SID],
        [],
    ),
    ("post", "/api/sessions/{sid}/interrupt", "host", "stop the idol", _obj({}), [SID], []),
    (
        "post",
        "/api/sessions/{sid}/expression",
        "host",
        "set an expression",
        _obj({"name": _str(32)}),
        [SID],
        [],
    ),
    ("post", "/api/sessions/{sid}/gesture", "host", "play a gesture", _obj({"name": _str(32)}), [SID], []),
    ("get", "/api/sessions/{sid}/turns", "host", "per-turn timings", None, [SID], []),
    ("delete", "/api/sessions/{sid}", "host", "close the session", None, [SID], []),
    ("get", "/api/streams", "viewer", "open sessions, newest first", None, [], []),
    ("get", "/api/ice-servers", "viewer", "the STUN/TURN servers for the pages", None, [], []),
    ("get", "/api/sessions/{sid}/clock", "viewer", "the session clock", None, [SID], []),
    ("post", "/api/sessions/{sid}/chat", "host", "a chat message into the queue", CHAT, [SID], []),
    ("get", "/api/sessions/{sid}/chat", "host", "chat queue stats", None, [SID], []),
    (
        "post",
        "/api/sessions/{sid}/profile",
        "host",
        "switch the output profile",
        _obj({"name": _str(32)}),
        [SID],
        [],
    ),
    (
        "post",
        "/api/sessions/{sid}/persona",
        "host",
        "switch the persona by name",
        _obj({"name": _str(64)}),
        [SID],
        [],
    ),
    ("post", "/api/whip", "host", "WHIP: a new session from pushed audio", "sdp", [], []),
    ("post", "/api/sessions/{sid}/whip", "host", "WHIP into a session", "sdp", [SID], []),
    ("delete", "/api/whip/{rid}", "host", "end a WHIP ingest", None, [RID], []),
    ("post", "/api/sessions/{sid}/whep", "viewer", "WHEP: watch a session", "sdp", [SID], []),
    ("delete", "/api/whep/{rid}", "viewer", "leave (WHEP)", None, [RID], []),
    ("post", "/api/sessions/{sid}/rtmp", "host", "start RTMP egress", _obj({"url": _str(500)}), [SID], []),
    ("get", "/api/sessions/{sid}/rtmp", "host", "RTMP status", None, [SID], []),
    ("delete", "/api/sessions/{sid}/rtmp", "host", "stop RTMP egress", None, [SID], []),
    (
        "get",
        "/api/memory",
        "host",
        "list memories",
        None,
        [],
        [
            {"name": "subject", "in": "query", "schema": _str(64)},
            {"name": "kind", "in": "query", "schema": _str(32)},
            {"name": "limit", "in": "query", "schema": {"type": "integer"}},
            {"name": "offset", "in": "query", "schema": {"type": "integer"}},
        ],
    ),
    (
        "get",
        "/api/memory/search",
        "host",
        "search memories",
        None,
        [],
        [
            {"name": "q", "in": "query", "schema": _str(500)},
            {"name": "k", "in": "query", "schema": {"type": "integer"}},
        ],
    ),
    ("get", "/api/memory/export", "host", "the card with its memories", None, [], []),
    (
        "post",
        "/api/memory",
        "host",
        "add a memory",
        _obj(
            {"text": _str(), "kind": _str(32), "subject": _str(64), "importance": {"type": "number"}},
            ("text",),
        ),
        [],
        [],
    ),
    (
        "post",
        "/api/memory/forget-viewer",
        "host",
        "forget a viewer",
        _obj({"username": _str(64)}, ("username",)),
        [],
        [],
    ),
    ("post", "/api/memory/import", "host", "import an export", _obj({"format": _str(64)}), [], []),
    (
        "patch",
        "/api/memory/{id}",
        "host",
        "edit a memory",
        _obj({"text": _str(), "importance": {"type": "number"}}),
        [MID],
        [],
    ),
    ("delete", "/api/memory/{id}", "host", "forget one memory", None, [MID], []),
    ("get", "/api/persona", "host", "the active card and its system prompt", None, [], []),
    (
        "post",
        "/api/persona",
        "host",
        "switch persona (a card name or an uploaded card)",
        _obj({"card": {}}),
        [],
        [],
    ),
]


def openapi_document() -> Json:
    paths: Json = {}
    for method, path, scope, summary, body, params, query in ROUTES:
        op: Json = {
            "summary": summary,
            "description": f"scope: {scope}",
            "parameters": params + query,
            "responses": {"default": {"description": "JSON; errors are {error, status}"}},
        }
        if scope != "public":
            op["security"] = [{"bearer": []}]
        if body == "sdp":
            op["requestBody"] = {"required": True, "content": {"application/sdp": {"schema": _str(65536)}}}
        elif body is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "idolcast",
            "version": "1",
            "description": "see docs/api.md (scopes: public, viewer, host)",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())
