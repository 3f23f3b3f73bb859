"""The host console's peers (PeerManager): one session per offer, the host's mic in, the idol's audio (and video)
out, over the shared offer → answer of engine/server/peer.py."""

from __future__ import annotations

import asyncio
import logging

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from engine.events import ConnectionChanged
from engine.server.engine import Engine, EngineBusy, EngineNotReady
from engine.server.errors import APIError
from engine.server.peer import Peer, validate_offer
from engine.session.session import Session
from engine.tasks import TaskOwner
from engine.transport import ice
from engine.transport.ice import rtc_ice_servers
from engine.transport.mic_in import set_receive_jitter

log = logging.getLogger(__name__)


def unavailable(e: EngineNotReady | EngineBusy) -> APIError:
    """The 503 of a session the engine cannot open now; a capacity refusal says when to try again
    (``Retry-After``, from engine/server/capacity.py) and which resource is full."""
    if isinstance(e, EngineBusy):
        return APIError(503, str(e), {"Retry-After": str(e.retry_after_s)}, {"resource": e.resource})
    return APIError(503, str(e))


class PeerManager:
    """One peer per session (the host's); closing either closes both."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.peers: dict[str, Peer] = {}
        self.connected: dict[str, None] = {}  # sessions whose peer is connected, in connection order
        self._owner = TaskOwner("peers")
        engine.on_session_closed.append(self._session_closed)
        ice.configure(engine.settings.server)  # sockets drained per wake; the UDP port range, if one is set

    def configuration(self) -> RTCConfiguration:
        servers = rtc_ice_servers(self.engine.settings.server)  # with the TURN credentials
        return RTCConfiguration(iceServers=servers)

    async def answer(self, sdp: str, kind: str = "offer") -> tuple[Session, RTCSessionDescription]:
        """A new session answering ``sdp`` (503 with Retry-After if the engine cannot take one now).
        Any failure while building the peer closes the session (and the peer) and is answered 400 with
        the reason; a peer that has not connected within ``server.connect_timeout_s`` is closed (with
        its session) by a reaper that ends as soon as it connects."""
        validate_offer(sdp, kind)
        try:
            session = await self.engine.create_session()
        except (EngineNotReady, EngineBusy) as e:
            raise unavailable(e) from None
        sid = session.id

        def on_track(pc: RTCPeerConnection, track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                set_receive_jitter(pc, track, self.engine.settings.server.mic_jitter_frames)
                session.attach_mic(track)

        def on_state(state: str) -> None:
            session.bus.publish(ConnectionChanged(t=session.clock.now(), state=state))
            if state == "connected":
                self.connected[sid] = None
            elif state in ("failed", "closed"):
                self.connected.pop(sid, None)

        async def gone() -> None:
            await self.engine.close_session(sid)

        server = self.engine.settings.server
        peer = Peer(
            f"session {sid}: its peer",
            self.configuration(),
            server.connect_timeout_s,
            gone,
            on_track,
            on_state,
        )
        self.peers[sid] = peer
        answer = await peer.answer(sdp, lambda pc: self._add_outgoing(pc, session))
        self._owner.spawn(peer.reap_unconnected(), f"reap-{sid}")
        return session, answer

    def latest_connected(self) -> str | None:
        """The id of the newest session whose host peer is connected (what ``latest`` means)."""
        for sid in reversed(self.connected):
            if sid in self.engine.sessions:
                return sid
        return None

    @staticmethod
    def _add_outgoing(pc: RTCPeerConnection, session: Session) -> None:
        kinds = {t.kind for t in pc.getTransceivers()}
        if "audio" in kinds:
            pc.addTrack(session.audio_track)
        if session.video_track is not None and "video" in kinds:
            pc.addTrack(session.video_track)

    async def _session_closed(self, session: Session) -> None:
        self.connected.pop(session.id, None)
        peer = self.peers.pop(session.id, None)
        if peer is not None:
            await peer.close()

    async def close_all(self) -> None:
        await self._owner.cancel_all()
        await asyncio.gather(*(peer.close() for peer in list(self.peers.values())), return_exceptions=True)
        self.peers.clear()
