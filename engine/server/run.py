"""Run the engine's HTTP server until interrupted."""

from __future__ import annotations

import errno
import logging
import sys

from aiohttp import web

from engine.config import Settings
from engine.native import preload_native_modules
from engine.server.app import create_app
from engine.surfaces.broker import BrokerStartError

log = logging.getLogger(__name__)


def serve(settings: Settings) -> int:
    logging.getLogger().setLevel(settings.server.log_level)
    preload_native_modules()
    app = create_app(settings)
    host, port = settings.server.host, settings.server.port
    print(f"idolcast: serving on http://{host}:{port} (models load in the background; see /api/health)")
    try:
        web.run_app(app, host=host, port=port, print=None, handle_signals=True)
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
