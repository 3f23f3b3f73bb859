"""WebRTC offer/answer for the host console: the host's mic in, the idol's audio (and video) out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from engine.events import ConnectionChanged
from engine.server.engine import Engine
from engine.server.errors import APIError
from engine.session.session import Session
from engine.tasks import TaskOwner
from engine.transport import ice
from engine.transport.ice import rtc_ice_servers
from engine.transport.mic_in import set_receive_jitter

log = logging.getLogger(__name__)

MAX_SDP_BYTES = 64 * 1024

# Extra outgoing tracks for a session (the avatar's video track plugs in here).
TrackFactory = Callable[[Session], MediaStreamTrack | None]


def offer_error(e: BaseException) -> str:
    """What went wrong with an offer, for the 400 (aiortc raises bare assertions on some SDP)."""
    text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else f"{type(e).__name__} (the SDP could not be used)"


def validate_offer(sdp: object, kind: object) -> str:
    if kind != "offer":
        raise APIError(400, f"'type' must be 'offer' (got {kind!r})")
    if not isinstance(sdp, str) or not sdp.strip():
        raise APIError(400, "'sdp' must be a non-empty string")
    if len(sdp) > MAX_SDP_BYTES:
        raise APIError(413, f"SDP too large ({len(sdp)} > {MAX_SDP_BYTES} bytes)")
    if not sdp.lstrip().startswith("v=0"):
        raise APIError(400, "malformed SDP: it must start with 'v=0'")
    if "m=" not in sdp:
        raise APIError(400, "malformed SDP: no media section ('m=' line)")
    return sdp


class PeerManager:
    """One RTCPeerConnection per session; closing either closes both."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.peers: dict[str, RTCPeerConnection] = {}
        self.connected: dict[str, None] = {}  # sessions whose peer is connected, in connection order
        self._owner = TaskOwner("peers")
        self.track_factories: list[TrackFactory] = [lambda session: session.video_track]
        engine.on_session_closed.append(self._session_closed)
        ice.configure(engine.settings.server)  # the UDP port range of the media, if one is set

    def _configuration(self) -> RTCConfiguration:
        servers = rtc_ice_servers(self.engine.settings.server)  # with the TURN credentials
        return RTCConfiguration(iceServers=servers)

    async def answer(self, sdp: str, kind: str = "offer") -> tuple[Session, RTCSessionDescription]:
        """A new session answering ``sdp``. Any failure while building the peer closes the session
        (and the peer) and is answered 400 with the reason; a peer that has not connected within
        ``server.connect_timeout_s`` is closed (with its session) by a reaper."""
        validate_offer(sdp, kind)
        session = await self.engine.create_session()
        try:
            pc = RTCPeerConnection(self._configuration())
            self.peers[session.id] = pc
            self._wire(pc, session)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            self._add_outgoing(pc, session)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except Exception as e:
            await self.engine.close_session(session.id)
            raise APIError(400, f"malformed SDP offer: {offer_error(e)}") from None
        except BaseException:  # cancelled: leave nothing half-made behind
            await asyncio.shield(self.engine.close_session(session.id))
            raise
        self._owner.spawn(self._reap_unconnected(session.id, pc), f"reap-{session.id}")
        return session, pc.localDescription

    def _wire(self, pc: RTCPeerConnection, session: Session) -> None:
        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                set_receive_jitter(pc, track, self.engine.settings.server.mic_jitter_frames)
                session.attach_mic(track)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            session.bus.publish(ConnectionChanged(t=session.clock.now(), state=pc.connectionState))
            if pc.connectionState == "connected":
                self.connected[session.id] = None
            if pc.connectionState in ("failed", "closed"):
                self.connected.pop(session.id, None)
                await self.engine.close_session(session.id)

    async def _reap_unconnected(self, sid: str, pc: RTCPeerConnection) -> None:
        limit = self.engine.settings.server.connect_timeout_s
        await asyncio.sleep(limit)
        if self.peers.get(sid) is pc and pc.connectionState != "connected" and sid not in self.connected:
            log.info("session %s: its peer did not connect within %.0f s; closing it", sid, limit)
            await self.engine.close_session(sid)

    def latest_connected(self) -> str | None:
        """The id of the newest session whose host peer is connected (what ``latest`` means)."""
        for sid in reversed(self.connected):
            if sid in self.engine.sessions:
                return sid
        return None

    def _add_outgoing(self, pc: RTCPeerConnection, session: Session) -> None:
        kinds = {t.kind for t in pc.getTransceivers()}
        if "audio" in kinds:
            pc.addTrack(session.audio_track)
        for factory in self.track_factories:
            track = factory(session)
            if track is not None and track.kind in kinds:
                pc.addTrack(track)

    async def _session_closed(self, session: Session) -> None:
        self.connected.pop(session.id, None)
        pc = self.peers.pop(session.id, None)
        if pc is not None:
            await pc.close()

    async def close_all(self) -> None:
        await self._owner.cancel_all()
        await asyncio.gather(*(pc.close() for pc in list(self.peers.values())), return_exceptions=True)
        self.peers.clear()
