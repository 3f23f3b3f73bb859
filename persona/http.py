"""HTTP API of the memory bank and the persona (JSON in, JSON out).

    GET    /api/memory?subject=&kind=&all=1&limit=&offset=   list
    GET    /api/memory/search?q=&k=&speaker=                  search as a turn would
    POST   /api/memory            {"text", "kind"?, "subject"?, "importance"?}
    PATCH  /api/memory/{id}       {"text"?, "importance"?}
    DELETE /api/memory/{id}       forget one memory (and its history)
    POST   /api/memory/forget-viewer   {"username"}   right to be forgotten
    GET    /api/memory/export     the persona card with its memories
    POST   /api/memory/import     an export; ?replace=1 first deletes the persona's memories
    GET    /api/persona           the active card and its system prompt
    POST   /api/persona           {"card": "builtin:default" | path}  switch live

Errors are ``{"error": message}`` with 400 (bad JSON or values), 404 (unknown id) or 501
(no live persona to switch). Work runs in a thread: the event loop never waits on SQLite or
the embedding model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from persona import api
from persona.bank import MemoryNotFound
from persona.card import CardError

Getter = Callable[[], Any]  # returns a LivePersona (e.g. the PersonaPromptProvider), or None


def _err(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.text() or "null")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError("request body must be a JSON object")
    return data


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"'{name}' must be an integer, got {value!r}") from None


def register_routes(app: web.Application, store_getter: Getter) -> None:
    def live() -> Any:
        target = store_getter()
        if target is None:
            raise LookupError("no persona memory bank is running")
        return target

    def handler(
        fn: Callable[[web.Request], Awaitable[Any]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def wrapped(request: web.Request) -> web.Response:
            try:
                return web.json_response(await fn(request), dumps=lambda o: json.dumps(o, default=str))
            except (ValueError, TypeError, CardError) as e:
                return _err(400, str(e))
            except MemoryNotFound as e:
                return _err(404, str(e))
            except LookupError as e:
                return _err(501, str(e))

        return wrapped

    async def list_(request: web.Request) -> Any:
        q = request.query
        bank = live().bank
        return await asyncio.to_thread(
            api.list_memories,
            bank,
            subject=q.get("subject"),
            kind=q.get("kind"),
            include_superseded=q.get("all") in ("1", "true"),
            limit=_int(q.get("limit", 100), "limit"),
            offset=_int(q.get("offset", 0), "offset"),
        )

    async def search(request: web.Request) -> Any:
        q = request.query
        return await asyncio.to_thread(
            api.search_memories, live().bank, q.get("q", ""), _int(q.get("k", 5), "k"), q.get("speaker")
        )

    async def add(request: web.Request) -> Any:
        b = await _body(request)
        if not isinstance(b.get("text"), str):
            raise ValueError("'text' (string) is required")
        return await asyncio.to_thread(
            api.add_memory,
            live().bank,
            b["text"],
            str(b.get("kind", "viewer_fact")),
            str(b.get("subject", "")),
            float(b.get("importance", 0.5)),
        )

    async def edit(request: web.Request) -> Any:
        b = await _body(request)
        imp = b.get("importance")
        return await asyncio.to_thread(
            api.edit_memory,
            live().bank,
            _int(request.match_info["id"], "id"),
            b.get("text"),
            None if imp is None else float(imp),
        )

    async def forget(request: web.Request) -> Any:
        return await asyncio.to_thread(api.forget_memory, live().bank, _int(request.match_info["id"], "id"))

    async def forget_viewer(request: web.Request) -> Any:
        b = await _body(request)
        if not isinstance(b.get("username"), str):
            raise ValueError("'username' (string) is required")
        target = live()
        if hasattr(target, "forget_viewer"):
            report = dict(await target.forget_viewer(b["username"]))
            report["remaining_rows"] = await asyncio.to_thread(api.viewer_rows, target.bank, b["username"])
            return report
        return await asyncio.to_thread(api.forget_viewer, target.bank, b["username"])

    async def export(request: web.Request) -> Any:
        target = live()
        return await asyncio.to_thread(api.export_persona, target.bank, target.card)

    async def import_(request: web.Request) -> Any:
        b = await _body(request)
        replace = request.query.get("replace") in ("1", "true")
        return await asyncio.to_thread(api.import_persona, live().bank, b, replace)

    async def show(request: web.Request) -> Any:
        card = live().card
        return {"card": card.model_dump(mode="json"), "system_prompt": card.system_prompt()}

    async def switch(request: web.Request) -> Any:
        b = await _body(request)
        if not isinstance(b.get("card"), str):
            raise ValueError("'card' (string: builtin:NAME or a card file) is required")
        return await api.switch_persona(live(), b["card"])

    r = app.router
    r.add_get("/api/memory", handler(list_))
    r.add_get("/api/memory/search", handler(search))
    r.add_get("/api/memory/export", handler(export))
    r.add_post("/api/memory", handler(add))
    r.add_post("/api/memory/forget-viewer", handler(forget_viewer))
    r.add_post("/api/memory/import", handler(import_))
    r.add_patch("/api/memory/{id}", handler(edit))
    r.add_delete("/api/memory/{id}", handler(forget))
    r.add_get("/api/persona", handler(show))
    r.add_post("/api/persona", handler(switch))
