"""The application: the HTTP server (engine.server), the streamer surfaces and the persona, wired into one
aiohttp app (:func:`create_app`), and run until interrupted (:func:`serve`, what ``idolcast serve`` runs).

This is the only module that knows all three: engine.server never imports engine.surfaces (the surfaces
hang off the engine's session hooks and the peer manager), and persona's routes are registered here.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.config import Settings
from engine.cores import set_share
from engine.models import EngineModels
from engine.native import preload_native_modules, set_model_nice
from engine.server.app import ENGINE_KEY, PEERS_KEY, create_server_app
from engine.server.credentials import HOST_TOKEN_FILE, CredentialError, Credentials
from engine.server.drain import serve_until_signalled
from engine.server.engine import Engine
from engine.server.guard import is_loopback
from engine.surfaces.broker import BrokerStartError
from engine.surfaces.routes import register_surfaces
from engine.transport import encoders
from persona.http import register_routes as register_persona_routes

log = logging.getLogger(__name__)


def exposed_warning(host: str, allowed_hosts: list[str]) -> str:
    names = ", ".join(allowed_hosts) or "none: add the names browsers will use to server.allowed_hosts"
    bar = "!" * 78
    return (
        f"{bar}\nidolcast: WARNING: listening on {host}, beyond this machine. Every request but the pages\n"
        "and /api/health needs the host token or a viewer token; the console here gets no cookie from\n"
        f"a remote browser (open it with #token=…). Host names answered besides loopback: {names}.\n"
        f"Use TLS in front (a reverse proxy) on any network you do not trust.\n{bar}"
    )


def open_persona(settings: Settings, models: EngineModels) -> Any:
    """The persona prompt provider over the memory bank (blocking: loads the card, embeddings, index;
    imported here, when persona.enabled, as before)."""
    from persona.prompt import PersonaPromptProvider
    from persona.tokens import counter_from_tokenizer

    tokenizer = getattr(models.llm, "tokenizer", None)
    counter = counter_from_tokenizer(tokenizer) if tokenizer is not None else None
    return PersonaPromptProvider.from_config(settings.persona, token_counter=counter)


def new_engine(settings: Settings, models: EngineModels | None = None) -> Engine:
    """An engine with its persona: the models load in the background unless given."""
    return Engine(settings, models, open_persona=open_persona)


def create_app(
    settings: Settings, engine: Engine | None = None, credentials: Credentials | None = None
) -> web.Application:
    """The engine's whole web application: the server's routes, then the persona's and the surfaces'.
    ``credentials``: who may do what (default: from the settings, the host token made on first start;
    raises :class:`~engine.server.credentials.CredentialError`)."""
    app = create_server_app(settings, engine or new_engine(settings), credentials)
    engine = app[ENGINE_KEY]
    register_persona_routes(app, lambda: engine.persona, Path(settings.persona.cards_dir))
    register_surfaces(app, engine, app[PEERS_KEY])
    return app


def serve(settings: Settings) -> int:
    logging.getLogger().setLevel(settings.server.log_level)
    # Every session's pacing waits on the event loop, which shares the GIL with the encoders', render's and
    # models' threads: at Python's 5 ms it woke ~100 ms late with 16 sessions (docs/PERFORMANCE.md).
    sys.setswitchinterval(settings.server.gil_switch_ms / 1000.0)
    set_share(settings.server.cpus)  # before any pool is sized (engine/cores.py)
    set_model_nice(settings.server.model_nice)  # before any model loads (engine/native.py)
    encoders.install(encoders.EncoderPolicy(per_encoder=settings.server.video_encoder_threads))
    host, port = settings.server.host, settings.server.port
    try:
        credentials, created = Credentials.from_settings(
            settings.server.host_token, settings.server.secrets_dir
        )
    except CredentialError as e:
        print(f"idolcast: refusing to start: {e}", file=sys.stderr)
        return 1
    if created:
        path = Path(settings.server.secrets_dir) / HOST_TOKEN_FILE
        print(f"idolcast: a new host token was made ({path}, readable by you only); it is shown once here:")
        print(f"    {credentials.host_token}")
        print("    (the console on this machine needs none; `idolcast doctor` shows it again)")
        log.warning("a new host token was made in %s", path)
    if not is_loopback(host):
        print(exposed_warning(host, settings.server.allowed_hosts), file=sys.stderr)
    preload_native_modules()
    app = create_app(settings, credentials=credentials)
    print(f"idolcast: serving on http://{host}:{port} (models load in the background; see /api/health)")
    try:
        asyncio.run(serve_until_signalled(app, app[ENGINE_KEY], host, port))  # SIGTERM: drain, exit 0
    except BrokerStartError as e:
        print(f"idolcast: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(
                f"idolcast: cannot listen on {host}:{port}: the port is taken (another idolcast?). "
                "Use --port or IDOLCAST_SERVER__PORT.",
                file=sys.stderr,
            )
            return 1
        raise
    return 0
