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
    POST   /api/persona           {"card": "builtin:NAME" | NAME | {card fields}}  switch live: NAME is
                                  a card file in persona.cards_dir (never a path); an object is an
                                  uploaded card (at most 64 KB)

Errors are ``{"error": message}`` with 400 (bad JSON or values), 404 (unknown id) or 501
(no live persona to switch). Work runs in a thread: the event loop never waits on SQLite or
the embedding model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from persona import api
from persona.bank import MemoryNotFound
from persona.card import CardError, load_named_card, parse_card
from persona.store import normalize_username

Getter = Callable[[], Any]  # returns a LivePersona (e.g. the PersonaPromptProvider), or None


def _err(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


MAX_CARD_BYTES = 64 * 1024
MAX_ID = 2**63 - 1  # SQLite's integer range


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.text() or "null")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError("request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("request body must be a JSON object")
    return data


def _int(value: Any, name: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"'{name}' must be an integer, got {str(value)[:40]!r}") from None
    if not -MAX_ID <= number <= MAX_ID:
        raise ValueError(f"'{name}' is out of range")
    return number


def register_routes(app: web.Application, store_getter: Getter, cards_dir: Path = Path("var/cards")) -> None:
    """The memory and persona routes; ``POST /api/persona`` picks cards by name from ``cards_dir``."""

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
        if not isinstance(b.get("username"), str) or not normalize_username(b["username"]):
            raise ValueError("'username' (a non-blank string) is required")
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
        if len(await request.read()) > MAX_CARD_BYTES:
            raise ValueError(f"the card is too large (limit {MAX_CARD_BYTES} bytes)")
        b = await _body(request)
        ref = b.get("card")
        if isinstance(ref, str):
            card = await asyncio.to_thread(load_named_card, ref, cards_dir, MAX_CARD_BYTES)
        elif isinstance(ref, dict):
            card = await asyncio.to_thread(parse_card, ref, "uploaded card", False)
        else:
            raise ValueError(
                "'card' is required: builtin:NAME, NAME of a card in the card folder, or a card object"
            )
        target = live()
        await target.switch_persona(card)
        return {"persona": card.id, "name": card.name}

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
