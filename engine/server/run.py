"""Run the engine's HTTP server until interrupted."""

from __future__ import annotations

import logging

from aiohttp import web

from engine.config import Settings
from engine.native import preload_native_modules
from engine.server.app import create_app

log = logging.getLogger(__name__)


def serve(settings: Settings) -> int:
    logging.getLogger().setLevel(settings.server.log_level)
    preload_native_modules()
    app = create_app(settings)
    host, port = settings.server.host, settings.server.port
    print(f"idolcast: serving on http://{host}:{port} (models load in the background; see /api/health)")
    web.run_app(app, host=host, port=port, print=None, handle_signals=True)
    return 0
