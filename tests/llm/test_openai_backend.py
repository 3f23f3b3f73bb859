"""The OpenAI-compatible client against a real aiohttp server.

The streaming server below implements ``/v1/chat/completions`` (and ``/v1/models``) on top of the
real :class:`TransformersLLM`, so the client is tested end to end against a real model over HTTP.
The error cases use tiny handlers that misbehave on purpose.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from engine.llm.base import LLMError
from engine.llm.config import LLMConfig
from engine.llm.factory import close_llm, describe, load_llm
from engine.llm.openai_backend import OpenAICompatibleLLM
from engine.llm.streaming import WorkerStream
from engine.llm.transformers_backend import TransformersLLM
from tests.llm.conftest import chat, collect, first_pieces

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class ServerLog:
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    streams: list[WorkerStream] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)


def model_server(llm: TransformersLLM, log: ServerLog) -> web.Application:
    """An OpenAI-style streaming chat server backed by the real model."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "smollm2-test", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        log.bodies.append(body)
        log.headers.append(dict(request.headers))
        backend = llm.with_options(
            max_new_tokens=body.get("max_tokens", 16),
            temperature=body.get("temperature", 1.0),
            top_p=body.get("top_p", 1.0),
            repetition_penalty=1.0 + body.get("frequency_penalty", 0.0),  # as `transformers serve` maps it
        )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        stream = backend.stream(body["messages"])
        log.streams.append(stream)

        async def send(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        try:
            await send({"role": "assistant"})
            await resp.write(b": keep-alive comment\n\n")
            async for piece in stream:
                await send({"content": piece})
            await send({}, "stop")
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            log.disconnected.set()
            raise
        finally:
            await stream.aclose()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    return app


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
    """Start an app on a free port; returns its base URL (``http://127.0.0.1:PORT/v1``)."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


def one_route(handler: Handler) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


def client(base_url: str, **changes: Any) -> OpenAICompatibleLLM:
    fields: dict[str, Any] = {
        "backend": "openai",
        "base_url": base_url,
        "model": "smollm2-test",
        "temperature": 0.0,
    }
    llm = load_llm(LLMConfig.model_validate(fields | changes))
    assert isinstance(llm, OpenAICompatibleLLM)
    return llm


# ---- end to end against the real model ---------------------------------------------------


@pytest.mark.integration
async def test_streams_the_real_model_over_http(smollm: TransformersLLM, serve: Any) -> None:
    log = ServerLog()
    url = await serve(model_server(smollm, log))
    llm = client(url, model="bundled:smollm2-135m", max_new_tokens=12, api_key="sekrit")
    messages = chat("What is the capital of France?", system="You are a helpful assistant. Answer briefly.")
    try:
        pieces = await collect(llm.stream(messages, cache_key="ignored"))
    finally:
        await close_llm(llm)
    direct = await collect(smollm.with_options(max_new_tokens=12).stream(messages))
    assert "".join(pieces) == "".join(direct) and "Paris" in "".join(pieces)
    assert len(pieces) > 1
    body = log.bodies[0]
    assert body["model"] == "smollm2-test"  # 'bundled:*' asked the server for its first model
    assert body["stream"] is True and body["max_tokens"] == 12 and body["temperature"] == 0.0
    assert body["frequency_penalty"] == pytest.approx(0.3)  # from repetition_penalty 1.3
    assert log.headers[0]["Authorization"] == "Bearer sekrit"
    assert "smollm2-test" in llm.describe()


@pytest.mark.integration
async def test_closing_the_iterator_aborts_the_request(smollm: TransformersLLM, serve: Any) -> None:
    log = ServerLog()
    url = await serve(model_server(smollm, log))
    llm = client(url, max_new_tokens=400, no_repeat_ngram_size=0)
    stream = llm.stream(chat("Tell me a very long story about a dragon."))
    await first_pieces(stream, 2)
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(log.disconnected.wait(), 10.0)
    thread = log.streams[0].thread
    assert thread is not None
    await asyncio.to_thread(thread.join, 5.0)
    assert not thread.is_alive()
    await close_llm(llm)


# ---- failures -----------------------------------------------------------------------------


@pytest.mark.unit
async def test_server_error_is_reported_with_its_text(serve: Any) -> None:
    async def fail(request: web.Request) -> web.Response:
        return web.json_response(
            {"error": {"message": "CUDA out of memory", "type": "server_error"}}, status=500
        )

    llm = client(await serve(one_route(fail)))
    with pytest.raises(LLMError, match=r"HTTP 500: CUDA out of memory"):
        await collect(llm.stream(chat("hi")))
    await close_llm(llm)


@pytest.mark.unit
async def test_long_error_bodies_are_truncated(serve: Any) -> None:
    async def fail(request: web.Request) -> web.Response:
        return web.Response(text="<html>" + "x" * 5000, status=502)

    llm = client(await serve(one_route(fail)))
    with pytest.raises(LLMError, match="HTTP 502") as info:
        await collect(llm.stream(chat("hi")))
    assert len(str(info.value)) < 400
    await close_llm(llm)


@pytest.mark.unit
async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = client(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(LLMError, match=rf"cannot connect to http://127.0.0.1:{port}"):
        await collect(llm.stream(chat("hi")))
    await close_llm(llm)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"data: {not json\n\n", "malformed stream: not JSON"),
        (b"<html><body>proxy error</body></html>\n", "malformed stream: unexpected line"),
        (b'data: {"foo": 1}\n\n', "malformed stream: no 'choices'"),
        (b'data: {"error": {"message": "engine died"}}\n\n', "mid-stream: engine died"),
        (b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n', "ended before \\[DONE\\]"),
    ],
)
async def test_garbage_streams_are_refused(serve: Any, payload: bytes, message: str) -> None:
    async def garbage(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(payload)
        return resp

    llm = client(await serve(one_route(garbage)))
    with pytest.raises(LLMError, match=message):
        await collect(llm.stream(chat("hi")))
    await close_llm(llm)


@pytest.mark.unit
async def test_a_non_streaming_answer_is_accepted(serve: Any) -> None:
    async def whole(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": "Hello!"}}]})

    llm = client(await serve(one_route(whole)))
    assert await collect(llm.stream(chat("hi"))) == ["Hello!"]
    await close_llm(llm)


@pytest.mark.unit
def test_request_body_and_describe() -> None:
    llm = OpenAICompatibleLLM(
        LLMConfig(
            backend="openai",
            model="m",
            repetition_penalty=1.0,
            extra_body={"top_p": None, "repeat_penalty": 1.2},
        )
    )
    body = llm.request_body(chat("hi"), "m")
    assert "frequency_penalty" not in body and "top_p" not in body and body["repeat_penalty"] == 1.2
    explicit = OpenAICompatibleLLM(LLMConfig(backend="openai", frequency_penalty=0.5))
    assert explicit.request_body([], "m")["frequency_penalty"] == 0.5
    assert describe(LLMConfig(backend="openai", api_key="k")).endswith("(with an API key)")
    assert "GGUF" in describe(LLMConfig())
    assert "NOT USABLE" in describe(LLMConfig(model="bundled:nope"))
