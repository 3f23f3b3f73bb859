"""The surfaces of one engine: per-session chat queues, media taps, WHIP/WHEP, RTMP and the MQTT bus."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from engine.events import Event, ExpressionCommand, GestureCommand, to_wire
from engine.server.engine import Engine
from engine.server.webrtc import PeerManager
from engine.session.bus import Observer
from engine.session.session import Session, SessionClosed
from engine.surfaces.chat_queue import ChatQueue
from engine.surfaces.mqtt_bus import MQTTBus
from engine.surfaces.payloads import ChatIn, ControlIn
from engine.surfaces.rtmp import RTMPStreamer
from engine.surfaces.whep import WHEPServer
from engine.surfaces.whip import WHIPServer
from engine.tasks import TaskOwner
from engine.text.tags import EXPRESSIONS, GESTURES

log = logging.getLogger(__name__)


class Surfaces:
    def __init__(self, engine: Engine, peers: PeerManager) -> None:
        settings = engine.settings
        self.engine = engine
        self.peers = peers
        self.chats: dict[str, ChatQueue] = {}
        self.rtmp: dict[str, RTMPStreamer] = {}
        self.order: list[str] = []  # session ids, oldest first
        ice = settings.server.ice_servers
        self.whep = WHEPServer(ice, settings.surfaces.max_viewers, settings.server.connect_timeout_s)
        self.whip = WHIPServer(engine, peers, ice)
        self.mqtt: MQTTBus | None = None
        if settings.mqtt.enabled:
            self.mqtt = MQTTBus(
                settings.mqtt,
                self.chat_from_bus,
                self.control_from_bus,
                secrets_dir=Path(settings.server.secrets_dir),
            )
        self._observers: dict[str, Observer] = {}
        self._owner = TaskOwner("surfaces")
        engine.on_session_created.append(self._created)
        engine.on_session_closed.append(self._closed)

    async def start(self) -> None:
        if self.mqtt is not None:
            await self.mqtt.start()

    async def stop(self) -> None:
        for sid in list(self.rtmp):
            await self.stop_rtmp(sid)
        await self.whep.close_all()
        await self.whip.close_all()
        if self.mqtt is not None:
            await self.mqtt.stop()
        await self._owner.cancel_all()

    # ---- sessions --------------------------------------------------------------------------------

    async def _created(self, session: Session) -> None:
        self.chats[session.id] = ChatQueue(session, self.engine.settings.surfaces.chat)
        self.order.append(session.id)
        if self.mqtt is not None:
            mqtt, sid = self.mqtt, session.id

            def forward(ev: Event) -> None:
                if ev.kind:
                    mqtt.publish_event(sid, to_wire(ev))

            session.bus.add_observer(forward)
            self._observers[sid] = forward
            mqtt.publish(f"{mqtt.prefix}/{sid}/state", {"state": "listening", "t": session.clock.now()}, True)
            self._publish_sessions()
        rtmp = self.engine.settings.surfaces.rtmp
        if rtmp.autostart and rtmp.url:
            await self.start_rtmp(session, rtmp.url)

    async def _closed(self, session: Session) -> None:
        sid = session.id
        await self.stop_rtmp(sid)
        await self.whep.close_session(session)
        await self.whip.close_session(session)
        queue = self.chats.pop(sid, None)
        if queue is not None:
            await queue.close()
        observer = self._observers.pop(sid, None)
        if observer is not None:
            session.bus.remove_observer(observer)
        if sid in self.order:
            self.order.remove(sid)
        if self.mqtt is not None:
            self.mqtt.publish(f"{self.mqtt.prefix}/{sid}/state", {"state": "closed"}, True)
            self._publish_sessions()

    def _publish_sessions(self) -> None:
        if self.mqtt is not None:
            self.mqtt.publish(f"{self.mqtt.prefix}/sessions", {"sessions": list(reversed(self.order))}, True)

    def find_session(self, sid: str) -> Session | None:
        if sid == "latest":  # the newest session whose host peer is connected (not a half-made one)
            latest = self.peers.latest_connected()
            return self.engine.sessions.get(latest) if latest is not None else None
        return self.engine.sessions.get(sid)

    def describe_sessions(self) -> list[dict[str, Any]]:
        out = []
        for sid in reversed(self.order):
            session = self.engine.sessions.get(sid)
            if session is None:
                continue
            out.append(
                {
                    "id": sid,
                    "connected": sid in self.peers.connected,
                    "video": session.video_track is not None,
                    "viewers": self.whep.count(sid),
                    "packed_alpha": self.engine.settings.avatar.packed_alpha,
                    "rtmp": self.rtmp[sid].status() if sid in self.rtmp else None,
                }
            )
        return out

    # ---- chat and control ------------------------------------------------------------------------

    def chat(self, sid: str, msg: ChatIn) -> str:
        queue = self.chats.get(sid)
        return queue.offer(msg) if queue is not None else "no_session"

    def chat_from_bus(self, sid: str, msg: ChatIn) -> None:
        targets = list(self.chats) if sid == "all" else [sid]
        for target in targets:
            if self.chat(target, msg) == "no_session":
                log.debug("chat for unknown session %s dropped", target)

    def control_from_bus(self, sid: str, ctl: ControlIn) -> None:
        session = self.find_session(sid)
        if session is None:
            log.warning("MQTT control for unknown session %s dropped", sid)
            return
        now = session.clock.now()
        if ctl.action == "interrupt":
            self._owner.spawn(session.interrupt("host"), f"interrupt-{sid}")
        elif ctl.action == "expression" and ctl.name in EXPRESSIONS:
            session.command(ExpressionCommand(t=now, name=ctl.name))
        elif ctl.action == "gesture" and ctl.name in GESTURES:
            session.command(GestureCommand(t=now, name=ctl.name))
        elif ctl.action == "say" and ctl.text and ctl.text.strip():
            self._owner.spawn(self._say(session, ctl.text), f"say-{sid}")
        else:
            log.warning("MQTT control for %s dropped: bad %s (name %r)", sid, ctl.action, ctl.name)

    @staticmethod
    async def _say(session: Session, text: str) -> None:
        try:
            await session.submit_text(text, speaker="host", source="host_text")
        except (SessionClosed, ValueError, asyncio.QueueFull) as e:
            log.warning("MQTT say dropped: %s", type(e).__name__)

    # ---- RTMP ----------------------------------------------------------------------------------

    async def start_rtmp(self, session: Session, url: str) -> RTMPStreamer:
        await self.stop_rtmp(session.id)
        streamer = RTMPStreamer(
            session,
            self.engine.settings.surfaces.rtmp,
            url,
            packed_alpha=self.engine.settings.avatar.packed_alpha,
        )
        streamer.start()
        self.rtmp[session.id] = streamer
        return streamer

    async def stop_rtmp(self, sid: str) -> bool:
        streamer = self.rtmp.pop(sid, None)
        if streamer is None:
            return False
        await streamer.stop()
        return True
