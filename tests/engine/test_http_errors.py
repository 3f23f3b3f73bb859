"""Bad input gets a clear 4xx and harms nothing; a loading engine says so."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp import web

from engine.app import create_app, new_engine
from engine.config import load_settings
from engine.server.credentials import Credentials
from tests.engine.conftest import free_port

pytestmark = pytest.mark.unit
TOKEN = "test-host-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def bare_url() -> AsyncIterator[str]:
    """A server whose models are not loaded (nothing here needs them)."""
    settings = load_settings(environ={})
    settings.server.max_body_bytes = 4096
    engine = new_engine(settings)
    app = create_app(settings, engine, Credentials(TOKEN, None))
    app.on_startup.clear()  # do not start loading models
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_malformed_json_is_400_with_a_message(bare_url: str) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{bare_url}/api/offer", data=b"{not json", headers=JSON) as r:
            assert r.status == 400
            assert "malformed JSON" in (await r.json())["error"]
        async with http.post(f"{bare_url}/api/offer", json=[1, 2]) as r:
            assert r.status == 400 and "JSON object" in (await r.json())["error"]


async def test_malformed_sdp_is_400(bare_url: str) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{bare_url}/api/offer", json={"sdp": "hello", "type": "offer"}) as r:
            assert r.status == 400 and "malformed SDP" in (await r.json())["error"]
        async with http.post(f"{bare_url}/api/offer", json={"sdp": "v=0\r\n", "type": "answer"}) as r:
            assert r.status == 400 and "'type' must be 'offer'" in (await r.json())["error"]


async def test_oversized_body_is_413(bare_url: str) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{bare_url}/api/offer", data=b"x" * 10000, headers=JSON) as r:
            assert r.status == 413 and "too large" in (await r.json())["error"]


async def test_offer_while_loading_is_503_and_health_says_loading(bare_url: str) -> None:
    sdp = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{bare_url}/api/offer", json={"sdp": sdp, "type": "offer"}) as r:
            assert r.status == 503 and "loading" in (await r.json())["error"]
        async with http.get(f"{bare_url}/api/health") as r:
            assert (await r.json())["state"] == "loading"


async def test_unknown_session_is_404(bare_url: str) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{bare_url}/api/sessions/nope/say", json={"text": "hi"}) as r:
            assert r.status == 404 and "no session" in (await r.json())["error"]


async def test_metrics_and_page_are_served(bare_url: str) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.get(f"{bare_url}/metrics") as r:
            assert r.status == 200 and "idolcast_sessions" in await r.text()
        async with http.get(f"{bare_url}/") as r:
            assert r.status == 200 and "idolcast" in await r.text()


@pytest.fixture(params=[None, 5000], ids=["python's limit", "raised limit"])
def recursion_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """Python's recursion limit as it is, or raised as torch's compiler leaves it (2,000) and more: then the
    JSON parser no longer fails on the bodies below, and the engine's own depth bound must refuse them."""
    before = sys.getrecursionlimit()
    if request.param is not None:
        sys.setrecursionlimit(request.param)
    yield
    sys.setrecursionlimit(before)


@pytest.mark.usefixtures("recursion_limit")
async def test_deeply_nested_json_is_400_not_500(bare_url: str) -> None:
    deep = b"[" * 1500 + b"]" * 1500  # past the parser's recursion limit, inside the 4 KB body limit
    nested_object = b'{"text": ' + b"[" * 1200 + b"]" * 1200 + b"}"
    async with aiohttp.ClientSession(headers=AUTH | JSON) as http:
        for path in (
            "/api/offer",
            "/api/sessions/x/say",
            "/api/sessions/x/chat",
            "/api/tokens",
            "/api/memory",
        ):
            for body in (deep, nested_object):
                async with http.post(f"{bare_url}{path}", data=body) as r:
                    assert r.status in (400, 404, 501), (path, r.status)  # never 500
                    assert r.status != 500
        async with http.post(f"{bare_url}/api/offer", data=deep) as r:
            assert r.status == 400 and "nested too deeply" in (await r.json())["error"]
