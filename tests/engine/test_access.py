"""Locked doors (issue 11): credentials, scopes, Origin, Host and Content-Type, on a real server.

The server here has no models (nothing needs them): the door answers before any handler runs.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from engine.app import create_app, new_engine, serve
from engine.config import load_settings
from engine.server.credentials import Credentials, load_or_create_host_token
from tests.engine.conftest import free_port

pytestmark = pytest.mark.unit
TOKEN = "host-token-for-the-access-tests"
HOST = {"Authorization": f"Bearer {TOKEN}"}
OFFER = {"sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "type": "offer"}

# Every state-changing or data-reading route, with a body it would accept.
HOST_ROUTES: list[tuple[str, str, object]] = [
    ("POST", "/api/offer", OFFER),
    ("POST", "/api/sessions/latest/say", {"text": "hi"}),
    ("POST", "/api/sessions/latest/interrupt", {}),
    ("POST", "/api/sessions/latest/expression", {"name": "happy"}),
    ("POST", "/api/sessions/latest/gesture", {"name": "wave"}),
    ("POST", "/api/sessions/latest/chat", {"user": "x", "text": "hi", "role": "host"}),
    ("POST", "/api/sessions/latest/profile", {"name": "portrait"}),
    ("POST", "/api/sessions/latest/persona", {"name": "default"}),
    ("POST", "/api/sessions/latest/rtmp", {"url": "rtmp://attacker.example/live/x"}),
    ("GET", "/api/sessions/latest/rtmp", None),
    ("DELETE", "/api/sessions/latest/rtmp", None),
    ("GET", "/api/sessions/latest/turns", None),
    ("GET", "/api/sessions/latest/chat", None),
    ("DELETE", "/api/sessions/abc", None),
    ("POST", "/api/memory", {"text": "csrf-planted: the host is a liar"}),
    ("GET", "/api/memory", None),
    ("GET", "/api/memory/search?q=osaka", None),
    ("GET", "/api/memory/export", None),
    ("POST", "/api/memory/import?replace=1", {"format": "idolcast-persona"}),
    ("PATCH", "/api/memory/1", {"text": "x"}),
    ("DELETE", "/api/memory/1", None),
    ("POST", "/api/memory/forget-viewer", {"username": ""}),
    ("GET", "/api/persona", None),
    ("POST", "/api/persona", {"card": "builtin:default"}),
    ("GET", "/api/tokens", None),
    ("POST", "/api/tokens", {"label": "obs"}),
    ("DELETE", "/api/tokens/abc", None),
]


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[str]:
    settings = load_settings(environ={})
    settings.server.secrets_dir = str(tmp_path / "secrets")
    app = create_app(settings, new_engine(settings), Credentials(TOKEN, tmp_path / "secrets"))
    app.on_startup.clear()  # no models
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def send(
    http: aiohttp.ClientSession, method: str, url: str, body: object, **headers: str
) -> tuple[int, dict[str, object]]:
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **headers} if body is not None else dict(headers)
    async with http.request(method, url, data=data, headers=hdrs) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text.startswith("{") else {})


async def test_every_route_without_a_credential_is_401(door: str) -> None:
    async with aiohttp.ClientSession() as http:
        for method, path, body in HOST_ROUTES:
            status, answer = await send(http, method, door + path, body)
            assert status == 401, (method, path, status, answer)
            assert "credential" in str(answer["error"])
        for path in ("/api/streams", "/api/sessions/latest/clock", "/metrics"):
            status, _ = await send(http, "GET", door + path, None)
            assert status == 401, path
        # what stays open: the pages, the scripts, the health check
        for path in ("/", "/console/", "/obs/", "/overlay/", "/web/shared/api.js", "/api/health"):
            async with http.get(door + path) as r:
                assert r.status == 200, path


async def test_a_wrong_token_is_401_and_the_host_token_passes_the_door(door: str) -> None:
    async with aiohttp.ClientSession() as http:
        status, _ = await send(http, "GET", door + "/api/streams", None, Authorization="Bearer nope")
        assert status == 401
        status, answer = await send(http, "GET", door + "/api/streams", None, **HOST)
        assert status == 200 and answer == {"sessions": []}
        status, answer = await send(http, "GET", door + "/api/auth", None, **HOST)
        assert answer == {"scope": "host"}
        # past the door, the handler answers (here: the session does not exist)
        status, answer = await send(http, "POST", door + "/api/sessions/nope/say", {"text": "hi"}, **HOST)
        assert status == 404


async def test_viewer_token_reads_but_is_403_on_host_routes_and_can_be_revoked(door: str) -> None:
    async with aiohttp.ClientSession() as http:
        status, made = await send(http, "POST", door + "/api/tokens", {"label": "obs pc"}, **HOST)
        assert status == 201 and made["scope"] == "viewer" and made["label"] == "obs pc"
        viewer = {"Authorization": f"Bearer {made['token']}"}
        status, listed = await send(http, "GET", door + "/api/tokens", None, **HOST)
        assert [t["id"] for t in listed["tokens"]] == [made["id"]]  # type: ignore[index]
        assert made["token"] not in json.dumps(listed)  # the secret is shown once, never listed
        for method, path, body in HOST_ROUTES:
            status, answer = await send(http, method, door + path, body, **viewer)
            assert status == 403, (method, path, status, answer)
        status, answer = await send(http, "GET", door + "/api/streams", None, **viewer)
        assert status == 200
        status, answer = await send(http, "GET", door + "/api/auth", None, **viewer)
        assert answer == {"scope": "viewer"}
        status, _ = await send(http, "DELETE", door + f"/api/tokens/{made['id']}", None, **HOST)
        assert status == 200
        status, _ = await send(http, "GET", door + "/api/streams", None, **viewer)
        assert status == 401
        status, _ = await send(http, "DELETE", door + f"/api/tokens/{made['id']}", None, **HOST)
        assert status == 404


async def test_viewer_tokens_survive_a_restart_as_digests(tmp_path: Path) -> None:
    creds = Credentials(TOKEN, tmp_path)
    viewer, secret = creds.create_viewer("overlay")
    stored = (tmp_path / "viewer_tokens.json").read_text()
    assert secret not in stored and viewer.id in stored
    assert stat.S_IMODE(os.stat(tmp_path / "viewer_tokens.json").st_mode) == 0o600
    again = Credentials(TOKEN, tmp_path)
    assert again.check(secret) == "viewer" and again.check(TOKEN) == "host" and again.check("x") is None


async def test_foreign_origin_is_403_even_with_the_host_token(door: str) -> None:
    async with aiohttp.ClientSession() as http:
        for origin in ("http://attacker.example", "http://127.0.0.1:1", "null"):
            for method, path, body in HOST_ROUTES:
                if method == "GET":
                    continue
                status, answer = await send(http, method, door + path, body, Origin=origin, **HOST)
                assert status == 403 and "origin" in str(answer["error"]), (origin, path, status)
        status, _ = await send(http, "GET", door + "/api/streams", None, Origin=door, **HOST)
        assert status == 200  # its own origin is fine
        ws_url = door.replace("http", "ws") + "/api/sessions/latest/events"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url, origin="http://attacker.example", headers=HOST)
        assert refused.value.status == 403


async def test_state_changes_need_json_content_type(door: str) -> None:
    async with aiohttp.ClientSession(headers=HOST) as http:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            for method, path, body in HOST_ROUTES:
                if method not in ("POST", "PATCH"):
                    continue
                async with http.request(
                    method, door + path, data=json.dumps(body).encode(), headers={"Content-Type": ctype}
                ) as r:
                    assert r.status == 415, (ctype, path, r.status)
                    assert "application/json" in (await r.json())["error"]


async def test_dns_rebinding_host_is_refused(door: str) -> None:
    async with aiohttp.ClientSession() as http:
        for host in ("attacker.example", "attacker.example:8080", "127.0.0.1.nip.io"):
            async with http.get(door + "/api/health", headers={"Host": host}) as r:
                assert r.status == 421, host
            async with http.get(door + "/console/", headers={"Host": host}) as r:
                assert r.status == 421 and "Set-Cookie" not in r.headers
        for host in ("localhost", "127.0.0.1", f"localhost:{door.rsplit(':', 1)[1]}"):
            async with http.get(door + "/api/health", headers={"Host": host}) as r:
                assert r.status == 200, host


async def test_console_bootstrap_cookie_is_same_origin_only(door: str) -> None:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(door + "/obs/") as r:
            cookie = r.cookies["idolcast_viewer"]
            assert cookie["httponly"] and cookie["samesite"] == "Strict"
        status, answer = await send(http, "GET", door + "/api/auth", None)
        assert answer == {"scope": "viewer"}
        status, _ = await send(http, "POST", door + "/api/memory", {"text": "x"})
        assert status == 403
        async with http.get(door + "/obs/?own=1") as r:  # the OBS page opening its own session
            assert r.cookies["idolcast_host"].value == TOKEN
        jar.clear()
        async with http.get(door + "/console/") as r:
            assert r.cookies["idolcast_host"].value == TOKEN
        status, answer = await send(
            http, "GET", door + "/api/auth", None, **{"Sec-Fetch-Site": "same-origin"}
        )
        assert answer == {"scope": "host"}
        # a page on another port of 127.0.0.1 is same-site: the browser sends the cookie, we ignore it
        for site in ("same-site", "cross-site"):
            status, _ = await send(http, "GET", door + "/api/memory/export", None, **{"Sec-Fetch-Site": site})
            assert status == 401, site


async def test_a_token_in_the_page_address_becomes_a_cookie(door: str) -> None:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        status, _ = await send(http, "POST", door + "/api/auth/session", {})
        assert status == 401
        status, answer = await send(http, "POST", door + "/api/auth/session", {}, **HOST)
        assert status == 200 and answer == {"scope": "host"}
        status, answer = await send(http, "GET", door + "/api/auth", None)
        assert answer == {"scope": "host"}


async def test_host_token_is_made_once_private_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "var" / "secrets"
    token, created = load_or_create_host_token(folder)
    assert created and len(token) >= 32
    assert stat.S_IMODE(os.stat(folder / "host_token").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert load_or_create_host_token(folder) == (token, False)
    creds, created = Credentials.from_settings("", str(folder))
    assert creds.host_token == token and not created


def test_binding_beyond_loopback_refuses_without_a_usable_credential(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(environ={})
    settings.server.host = "0.0.0.0"
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.server.secrets_dir = str(blocker / "secrets")  # cannot be created
    assert serve(settings) == 1
    assert "refusing to start" in capsys.readouterr().err
    settings.server.host_token = "short"
    settings.server.secrets_dir = str(tmp_path)
    assert serve(settings) == 1
    assert "at least 16" in capsys.readouterr().err


async def test_the_event_socket_needs_a_credential(door: str) -> None:
    ws_url = door.replace("http", "ws") + "/api/sessions/latest/events"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url)
        assert refused.value.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as missing:  # past the door: no session yet
            await http.ws_connect(ws_url, headers=HOST)
        assert missing.value.status == 404


def test_doctor_shows_the_host_token_and_where_it_lives(tmp_path: Path) -> None:
    from engine.doctor import describe_access

    settings = load_settings(environ={})
    settings.server.secrets_dir = str(tmp_path)
    assert "made on the first start" in describe_access(settings)[0]
    token, _ = load_or_create_host_token(tmp_path)
    lines = describe_access(settings)
    assert token in lines[0] and str(tmp_path / "host_token") in lines[0]
    settings.server.host = "0.0.0.0"
    assert "THE NETWORK" in describe_access(settings)[-1]
