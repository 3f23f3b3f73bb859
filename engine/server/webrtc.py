"""WebRTC offer/answer for the host console: the host's mic in, the idol's audio (and video) out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from engine.server.engine import Engine
from engine.server.errors import APIError
from engine.session.session import Session
from engine.transport.mic_in import set_receive_jitter

log = logging.getLogger(__name__)

MAX_SDP_BYTES = 64 * 1024

# Extra outgoing tracks for a session (the avatar's video track plugs in here).
TrackFactory = Callable[[Session], MediaStreamTrack | None]


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
        self.track_factories: list[TrackFactory] = [lambda session: session.video_track]
        engine.on_session_closed.append(self._session_closed)

    def _configuration(self) -> RTCConfiguration:
        servers = [RTCIceServer(urls=url) for url in self.engine.settings.server.ice_servers]
        return RTCConfiguration(iceServers=servers)

    async def answer(self, sdp: str, kind: str = "offer") -> tuple[Session, RTCSessionDescription]:
        validate_offer(sdp, kind)
        session = await self.engine.create_session()
        pc = RTCPeerConnection(self._configuration())
        self.peers[session.id] = pc

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                set_receive_jitter(pc, track, self.engine.settings.server.mic_jitter_frames)
                session.attach_mic(track)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            session.bus.publish({"type": "connection", "state": pc.connectionState})
            if pc.connectionState in ("failed", "closed"):
                await self.engine.close_session(session.id)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            self._add_outgoing(pc, session)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
            await self.engine.close_session(session.id)
            raise APIError(400, f"malformed SDP offer: {e}") from None
        local = pc.localDescription
        return session, local

    def _add_outgoing(self, pc: RTCPeerConnection, session: Session) -> None:
        kinds = {t.kind for t in pc.getTransceivers()}
        if "audio" in kinds:
            pc.addTrack(session.audio_track)
        for factory in self.track_factories:
            track = factory(session)
            if track is not None and track.kind in kinds:
                pc.addTrack(track)

    async def _session_closed(self, session: Session) -> None:
        pc = self.peers.pop(session.id, None)
        if pc is not None:
            await pc.close()

    async def close_all(self) -> None:
        await asyncio.gather(*(pc.close() for pc in list(self.peers.values())), return_exceptions=True)
        self.peers.clear()
