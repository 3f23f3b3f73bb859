"""The embedded MQTT broker (amqtt), on a thread and event loop of its own.

Routing a chat flood is CPU work: on its own loop it never delays the session's media or turns
(it still shares the GIL; for very busy chats use an external broker such as mosquitto).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class BrokerStartError(RuntimeError):
    """The embedded broker could not listen (the message says what to change)."""


class EmbeddedBroker:
    """``users``: user name → password (every client must log in); ``publish``: user name → the topic
    filters it may publish to (see :mod:`engine.surfaces.broker_auth`)."""

    def __init__(self, host: str, port: int, users: dict[str, str], publish: dict[str, list[str]]) -> None:
        self.host, self.port = host, port
        self.users, self.publish = users, publish
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._broker: Any = None
        self._stopped: asyncio.Event | None = None

    async def start(self, limit_s: float = 10.0) -> None:
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        caller = asyncio.get_running_loop()

        def report(exc: BaseException | None) -> None:
            if started.done():
                return
            if exc is None:
                started.set_result(None)
            else:
                started.set_exception(exc)

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(lambda e: caller.call_soon_threadsafe(report, e)))
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="mqtt-broker", daemon=True)
        self._thread.start()
        try:
            await asyncio.wait_for(started, limit_s)
        except Exception as e:
            in_use = "address already in use" in str(e).lower() or "errno 98" in str(e).lower()
            why = "the port is taken (another idolcast, or a mosquitto?)" if in_use else repr(e)
            raise BrokerStartError(
                f"the embedded MQTT broker cannot listen on {self.host}:{self.port}: {why}. Set "
                "mqtt.embedded_port (IDOLCAST_MQTT__EMBEDDED_PORT) to a free port, point mqtt.url at a "
                "running broker, or turn MQTT off with mqtt.enabled = false"
            ) from None
        log.info("embedded MQTT broker on %s:%d", self.host, self.port)

    async def _serve(self, report: Any) -> None:
        from amqtt.broker import Broker

        self._stopped = asyncio.Event()
        try:
            self._broker = Broker(
                {
                    "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
                    "plugins": {
                        "engine.surfaces.broker_auth.PasswordAuth": {"users": self.users},
                        "engine.surfaces.broker_auth.PublishRoles": {"publish": self.publish},
                    },
                }
            )
            await self._broker.start()
        except Exception as e:
            report(e)
            return
        report(None)
        await self._stopped.wait()
        try:
            await self._broker.shutdown()
        except Exception:
            log.warning("embedded MQTT broker did not shut down cleanly", exc_info=True)

    async def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
            self._thread = None
