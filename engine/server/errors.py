"""HTTP errors as JSON: every refusal says what was wrong, in one place."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}  # more fields of the JSON body (e.g. the resource a 503 ran out of)


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None
) -> web.Response:
    body = {"error": message, "status": status} | (extra or {})
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as e:
        return error_response(e.status, e.message, e.headers, e.extra)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app._client_max_size
        return error_response(413, f"request body too large (limit {limit} bytes)")
    except web.HTTPException as e:
        if e.status >= 400 and request.path.startswith("/api/"):
            return error_response(e.status, e.reason)
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal error (see the engine log)")


MAX_JSON_DEPTH = 32  # no body of the API nests deeper than a few levels


def nested_deeper_than(data: Any, limit: int) -> bool:
    """Whether ``data`` (parsed JSON) has lists or objects nested more than ``limit`` deep (iterative)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            stack.extend(
                (child, depth + 1) for child in (value.values() if isinstance(value, dict) else value)
            )
    return False


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or a 4xx that says why not."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise
    if not raw:
        raise APIError(400, "empty body: expected a JSON object")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"malformed JSON: {e}") from None
    except RecursionError:
        raise APIError(400, "malformed JSON: nested too deeply") from None
    # past the parser's recursion limit it fails above; that limit is process-wide and torch's compiler raises
    # it (to 2,000 while the avatar's features compile), so the bound is stated here too
    if nested_deeper_than(data, MAX_JSON_DEPTH):
        raise APIError(400, f"malformed JSON: nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    if not isinstance(data, dict):
        raise APIError(400, "expected a JSON object")
    return data


def require_str(data: dict[str, Any], key: str, max_len: int = 100_000) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise APIError(400, f"'{key}' must be a non-empty string")
    if len(value) > max_len:
        raise APIError(413, f"'{key}' is too long ({len(value)} > {max_len} characters)")
    return value
