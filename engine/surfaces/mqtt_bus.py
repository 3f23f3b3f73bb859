"""The MQTT bus: chat and control in, captions, transcript, state and metrics out.

Topic schema (``P`` is ``mqtt.topic_prefix``, default ``idol``; ``{sid}`` a session id)::

    in   P/{sid}/chat/in      ChatIn    {"user", "text", "role": member|chat, "id"?, "platform"?}
                                        (viewers' chat: "role": "host" here is refused)
    in   P/all/chat/in        ChatIn    the same, delivered to every open session
    in   P/{sid}/host/in      ChatIn    the host's own chat ({"user", "text"}; the role is always host)
    in   P/{sid}/control      ControlIn {"action": interrupt|expression|gesture|say, "name"?, "text"?}

The embedded broker lets no one in without a password (users ``host`` and ``chat``, generated into
``server.secrets_dir/mqtt_users.json``); ``chat`` may publish only ``P/+/chat/in``. On an external
broker, give the same rule to its ACL (only the host's tools may publish ``control`` and ``host/in``).
    out  P/sessions           retained  {"sessions": [sid, ...]}
    out  P/{sid}/state        retained  {"state": listening|hearing|thinking|speaking|closed, "t"}
    out  P/{sid}/captions               the session's caption events (text, word times on the session clock)
    out  P/{sid}/transcript             {"kind": partial|final|user_turn, "text", "speaker"?, "source"?, "t"}
    out  P/{sid}/chat/out               chat messages accepted by the queue (the overlay's feed)
    out  P/{sid}/metrics                {"turn_id", "source", "relative_ms", "interrupted", "error"} per turn
    out  P/{sid}/errors                 {"stage", "message", "turn_id"}

A payload that is not valid JSON or fails validation is logged (topic and reason, not its content) and
dropped. The engine's client reconnects with backoff when the broker goes away; outgoing messages wait in
a bounded queue (the oldest are dropped when it is full).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiomqtt
from pydantic import ValidationError

from engine.config import MQTTConfig
from engine.server.credentials import load_or_create_mqtt_users
from engine.surfaces.broker import EmbeddedBroker
from engine.surfaces.payloads import ChatIn, ControlIn
from engine.tasks import TaskOwner

log = logging.getLogger(__name__)

ChatHandler = Callable[[str, ChatIn], None]
ControlHandler = Callable[[str, ControlIn], None]

_STATE_OF = {
    "speech_started": "hearing",
    "final": "thinking",
    "user_turn": "thinking",
    "caption": "speaking",
    "turn_completed": "listening",
    "interrupted": "listening",
}


def event_messages(prefix: str, sid: str, ev: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """The (topic, payload, retain) messages one bus event becomes."""
    kind = ev.get("type")
    base = f"{prefix}/{sid}"
    out: list[tuple[str, dict[str, Any], bool]] = []
    if kind in _STATE_OF:
        out.append((f"{base}/state", {"state": _STATE_OF[str(kind)], "t": ev.get("t")}, True))
    if kind == "caption":
        out.append((f"{base}/captions", ev, False))
    elif kind in ("partial", "final", "user_turn"):
        payload = {"kind": kind, "text": ev.get("text", ""), "t": ev.get("t")}
        if kind == "user_turn":
            payload |= {
                "speaker": ev.get("speaker"),
                "source": ev.get("source"),
                "turn_id": ev.get("turn_id"),
            }
        out.append((f"{base}/transcript", payload, False))
    elif kind == "chat":
        out.append((f"{base}/chat/out", ev, False))
    elif kind == "turn_completed":
        timings = ev.get("timings", {})
        out.append(
            (
                f"{base}/metrics",
                {
                    "turn_id": ev.get("turn_id"),
                    "source": timings.get("source"),
                    "relative_ms": timings.get("relative_ms", {}),
                    "interrupted": ev.get("interrupted"),
                    "error": timings.get("error"),
                },
                False,
            )
        )
    elif kind == "error":
        out.append((f"{base}/errors", {k: ev.get(k) for k in ("stage", "message", "turn_id")}, False))
    return out


def broker_address(config: MQTTConfig) -> tuple[str, int]:
    if config.url == "embedded":
        return config.embedded_host, config.embedded_port
    u = urlparse(config.url)
    if u.scheme not in ("mqtt", "tcp") or not u.hostname:
        raise ValueError(f"mqtt.url: expected 'embedded' or mqtt://host:port (got {config.url!r})")
    return u.hostname, u.port or 1883


class MQTTBus:
    def __init__(
        self,
        config: MQTTConfig,
        on_chat: ChatHandler,
        on_control: ControlHandler,
        secrets_dir: Path = Path("var/secrets"),
    ) -> None:
        self.config = config
        self.secrets_dir = secrets_dir
        self.broker_users: dict[str, str] = {}  # the embedded broker's users (host, chat) once started
        self.refused_host_role = 0
        self.prefix = config.topic_prefix.strip("/")
        self.on_chat = on_chat
        self.on_control = on_control
        self.host, self.port = broker_address(config)
        self.dropped_in = 0
        self.dropped_out = 0
        self.connected = asyncio.Event()
        self._out: asyncio.Queue[tuple[str, bytes, bool]] = asyncio.Queue(config.max_outgoing)
        self._broker: EmbeddedBroker | None = None
        self._owner = TaskOwner("mqtt")

    async def start(self) -> None:
        if self.config.url == "embedded":
            self.broker_users = await asyncio.to_thread(load_or_create_mqtt_users, self.secrets_dir)
            publish = {"host": ["#"], "chat": [f"{self.prefix}/+/chat/in"]}
            self._broker = EmbeddedBroker(self.host, self.port, self.broker_users, publish)
            await self._broker.start()
        self._owner.spawn(self._run(), "client")

    async def stop(self) -> None:
        await self._owner.cancel_all()
        if self._broker is not None:
            await self._broker.stop()
            self._broker = None

    # ---- outgoing -------------------------------------------------------------------------------

    def publish(self, topic: str, payload: dict[str, Any], retain: bool = False) -> None:
        """Queue one message (never blocks; drops the oldest when the queue is full)."""
        data = json.dumps(payload, default=str).encode()
        if self._out.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self._out.get_nowait()
            self.dropped_out += 1
        self._out.put_nowait((topic, data, retain))

    def publish_event(self, sid: str, ev: dict[str, Any]) -> None:
        for topic, payload, retain in event_messages(self.prefix, sid, ev):
            self.publish(topic, payload, retain)

    # ---- the client connection ------------------------------------------------------------------

    async def _run(self) -> None:
        delay = 0.5
        while True:
            try:
                async with aiomqtt.Client(
                    self.host,
                    self.port,
                    identifier=self.config.client_id,
                    username=("host" if self.broker_users else self.config.username) or None,
                    password=self.broker_users.get("host") or self.config.password or None,
                ) as client:
                    await client.subscribe(f"{self.prefix}/+/chat/in")
                    await client.subscribe(f"{self.prefix}/+/host/in")
                    await client.subscribe(f"{self.prefix}/+/control")
                    self.connected.set()
                    delay = 0.5
                    log.info("MQTT connected to %s:%d", self.host, self.port)
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._send(client))
                        tg.create_task(self._receive(client))
            except* aiomqtt.MqttError as eg:
                log.warning(
                    "MQTT connection to %s:%d lost (%s); retrying in %.1fs",
                    self.host,
                    self.port,
                    eg.exceptions[0],
                    delay,
                )
            except* OSError as eg:
                log.warning(
                    "MQTT broker %s:%d unreachable (%s); retrying in %.1fs",
                    self.host,
                    self.port,
                    eg.exceptions[0],
                    delay,
                )
            self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 15.0)

    async def _send(self, client: aiomqtt.Client) -> None:
        while True:
            topic, data, retain = await self._out.get()
            await client.publish(topic, data, qos=0, retain=retain)

    async def _receive(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            self.handle(str(message.topic), message.payload)

    def handle(self, topic: str, payload: Any) -> None:
        """Validate and dispatch one incoming message; a bad one is logged and dropped."""
        parts = topic.split("/")
        try:
            if not isinstance(payload, bytes | bytearray | str):
                raise ValueError("empty payload")
            data = json.loads(payload)
            if len(parts) == 4 and parts[2:] == ["chat", "in"]:
                msg = ChatIn.model_validate(data)
                if msg.role == "host":  # viewers' topic: the host speaks on host/in
                    self.refused_host_role += 1
                    raise ValueError("the host role on a viewers' chat topic")
                self.on_chat(parts[1], msg)
            elif len(parts) == 4 and parts[2:] == ["host", "in"]:
                self.on_chat(parts[1], ChatIn.model_validate(data).model_copy(update={"role": "host"}))
            elif len(parts) == 3 and parts[2] == "control":
                self.on_control(parts[1], ControlIn.model_validate(data))
            else:
                raise ValueError("unknown topic")
        except (
            ValueError,
            ValidationError,
            RecursionError,
        ) as e:  # JSON and validation errors are ValueErrors
            self.dropped_in += 1
            reason = (
                e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)[:80] or type(e).__name__
            )
            log.warning("dropped a bad MQTT message on %s: %s", topic, reason)
