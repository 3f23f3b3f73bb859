"""Run the engine's HTTP server until interrupted."""

from __future__ import annotations

import asyncio
import errno
import logging
import sys
from pathlib import Path

from engine.config import Settings
from engine.native import preload_native_modules
from engine.server.app import ENGINE_KEY, create_app
from engine.server.credentials import HOST_TOKEN_FILE, CredentialError, Credentials
from engine.server.drain import serve_until_signalled
from engine.server.guard import is_loopback
from engine.surfaces.broker import BrokerStartError

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


def serve(settings: Settings) -> int:
    logging.getLogger().setLevel(settings.server.log_level)
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
