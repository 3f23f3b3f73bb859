"""Any OpenAI-compatible server (vLLM, llama.cpp server, Ollama, ``transformers serve``).

``POST {base_url}/chat/completions`` with ``stream: true``; the reply arrives as server-sent
events (``data: {json}`` lines, ``data: [DONE]`` at the end). Closing the stream (or cancelling
its consumer) closes the HTTP connection, which is how these servers learn to abort the request.

Sampling: ``temperature``, ``top_p``, ``max_tokens`` and ``frequency_penalty`` are standard and
accepted everywhere (``transformers serve`` refuses unknown fields; it maps ``frequency_penalty``
to ``repetition_penalty = 1 + value``, which is where our default derivation comes from).
Server-specific fields go through ``LLMConfig.extra_body``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from engine.llm.base import ChatMessage, LLMError
from engine.llm.config import LLMConfig

ERROR_TEXT_CHARS = 300


def _short(text: str, limit: int = ERROR_TEXT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_text(raw: str) -> str:
    """The server's error message: OpenAI's ``{"error": {"message": ...}}``, FastAPI's ``detail``, or the text."""
    try:
        data = json.loads(raw)
    except ValueError:
        return _short(raw) or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return _short(err if isinstance(err, str) else json.dumps(err))
    return _short(raw)


class OpenAICompatibleLLM:
    """:class:`~engine.llm.base.LLM` over an OpenAI-compatible ``/chat/completions`` endpoint.

    The server keeps its own KV/prefix cache (vLLM's prefix caching, llama.cpp's slot cache), so
    ``cache_key`` is not sent. Call :meth:`aclose` at shutdown to close the connection pool.
    """

    def __init__(self, config: LLMConfig) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._model_name: str | None = None if config.model.startswith("bundled:") else config.model

    # ---- the LLM protocol ---------------------------------------------------------------

    def stream(self, messages: list[ChatMessage], cache_key: str | None = None) -> AsyncIterator[str]:
        return self._stream(list(messages))

    async def prewarm(self, messages: list[ChatMessage], cache_key: str | None = None) -> int:
        return 0  # the server keeps (or not) its own prefix cache

    def describe(self) -> str:
        model = self._model_name or "(the server's first model)"
        return f"openai-compatible {model} at {self.config.base_url}"

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    # ---- the request --------------------------------------------------------------------

    def request_body(self, messages: list[ChatMessage], model: str) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "max_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
        }
        penalty = cfg.frequency_penalty
        if penalty is None:
            penalty = round(min(2.0, cfg.repetition_penalty - 1.0), 3)
        if penalty:
            body["frequency_penalty"] = penalty
        for key, value in cfg.extra_body.items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def _timeout(self) -> aiohttp.ClientTimeout:
        t = self.config.request_timeout_s
        return aiohttp.ClientTimeout(total=None, connect=t, sock_connect=t, sock_read=t)

    async def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession()
            self._session_loop = loop
        return self._session

    def _where(self) -> str:
        parts = urlsplit(self.config.base_url)
        return f"{parts.scheme}://{parts.netloc}"

    async def _resolve_model(self, session: aiohttp.ClientSession) -> str:
        """With a 'bundled:*' model setting, ask the server for its models and use the first."""
        if self._model_name is not None:
            return self._model_name
        url = self.config.base_url.rstrip("/") + "/models"
        async with session.get(url, headers=self._headers(), timeout=self._timeout()) as resp:
            raw = await resp.text()
            if resp.status != 200:
                raise LLMError(f"llm: {url} answered HTTP {resp.status}: {_error_text(raw)} (set llm.model)")
        try:
            self._model_name = str(json.loads(raw)["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise LLMError(f"llm: {url} listed no model ({_short(raw)}); set llm.model") from e
        return self._model_name

    async def _stream(self, messages: list[ChatMessage]) -> AsyncIterator[str]:
        session = await self._get_session()
        try:
            model = await self._resolve_model(session)
            resp = await session.post(
                self.url,
                json=self.request_body(messages, model),
                headers=self._headers(),
                timeout=self._timeout(),
            )
        except aiohttp.ClientConnectorError as e:
            raise LLMError(
                f"llm: cannot connect to {self._where()} ({e.os_error or e}): is the server running?"
            ) from e
        except TimeoutError as e:
            raise LLMError(
                f"llm: {self.url} did not answer within {self.config.request_timeout_s:g} s"
            ) from e
        except aiohttp.ClientError as e:
            raise LLMError(f"llm: request to {self.url} failed: {e!r}") from e
        finished = False
        try:
            if resp.status != 200:
                raw = await resp.text(errors="replace")
                raise LLMError(f"llm: {self.url} answered HTTP {resp.status}: {_error_text(raw)}")
            if resp.content_type == "application/json":  # the server ignored stream=true
                data = await resp.json()
                yield _message_text(data, stream=False)
                finished = True
                return
            async for piece in _sse_pieces(resp):
                yield piece
            finished = True
        except TimeoutError as e:
            raise LLMError(
                f"llm: {self.url} went silent for {self.config.request_timeout_s:g} s mid-stream"
            ) from e
        except aiohttp.ClientError as e:
            raise LLMError(f"llm: stream from {self.url} broke: {e!r}") from e
        finally:
            if finished:
                resp.release()
            else:
                resp.close()  # drop the connection: the server aborts generation


def _message_text(data: Any, *, stream: bool) -> str:
    """The text of one chunk (``choices[0].delta.content``) or whole reply (``.message.content``)."""
    if not isinstance(data, dict):
        raise LLMError(f"llm: malformed stream: expected a JSON object, got {_short(json.dumps(data))}")
    if "error" in data:
        raise LLMError(f"llm: the server reported an error mid-stream: {_error_text(json.dumps(data))}")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise LLMError(f"llm: malformed stream: no 'choices' in {_short(json.dumps(data))}")
    if not choices:
        return ""  # e.g. a final usage-only chunk
    part = choices[0].get("delta" if stream else "message") or {}
    content = part.get("content") if isinstance(part, dict) else None
    return content if isinstance(content, str) else ""


async def _sse_pieces(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """Text pieces from a server-sent-event body; ends at ``[DONE]``, raises LLMError on garbage."""
    data_lines: list[str] = []
    saw_finish = False
    async for raw_line in resp.content:
        line = raw_line.decode("utf-8", errors="replace").rstrip("\r\n")
        if line.startswith("data:"):
            data_lines.append(line[5:].removeprefix(" "))
            continue
        if line.startswith((":", "event:", "id:", "retry:")):
            continue  # comments (keep-alives) and fields we do not use
        if line:
            raise LLMError(f"llm: malformed stream: unexpected line {_short(line, 120)!r}")
        if not data_lines:
            continue
        payload, data_lines = "\n".join(data_lines), []
        if payload.strip() == "[DONE]":
            return
        try:
            data = json.loads(payload)
        except ValueError as e:
            raise LLMError(f"llm: malformed stream: not JSON: {_short(payload, 120)!r}") from e
        text = _message_text(data, stream=True)
        if data.get("choices") and data["choices"][0].get("finish_reason"):
            saw_finish = True
        if text:
            yield text
    if data_lines and "\n".join(data_lines).strip() == "[DONE]":
        return
    if not saw_finish:
        raise LLMError("llm: the stream ended before [DONE] (server crashed or connection cut)")
