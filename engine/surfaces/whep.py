"""WHEP egress: viewers (players, the OBS page, other tools) pull an existing session's audio and video.

Each viewer gets its own peer connection fed by taps on the session's tracks (see
:mod:`engine.transport.taps`), so viewers never take frames from the host's own peer.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field

from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from engine.server.errors import APIError
from engine.server.peer import Peer
from engine.session.session import Session
from engine.surfaces.sdp_http import rtc_configuration
from engine.tasks import TaskOwner
from engine.transport.taps import tap

log = logging.getLogger(__name__)


@dataclass
class Viewer:
    id: str
    session_id: str
    peer: Peer
    tracks: list[MediaStreamTrack] = field(default_factory=list)


class WHEPServer:
    def __init__(self, ice_servers: list[str], max_viewers: int, connect_timeout_s: float = 20.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._owner = TaskOwner("whep")
        self.ice_servers = ice_servers
        self.max_viewers = max_viewers
        self.viewers: dict[str, Viewer] = {}

    def count(self, session_id: str) -> int:
        return sum(1 for v in self.viewers.values() if v.session_id == session_id)

    async def answer(self, session: Session, sdp: str, video: str | None = None) -> tuple[Viewer, str]:
        """A viewer of ``session``; ``video="packed"`` asks for colour | alpha side by side (the OBS page)
        while the session's own picture stays as configured."""
        if self.count(session.id) >= self.max_viewers:
            raise APIError(503, f"too many viewers of session '{session.id}' (max {self.max_viewers})")
        vid = uuid.uuid4().hex[:12]

        async def gone() -> None:
            await self.close(vid)

        peer = Peer(f"WHEP viewer {vid}", rtc_configuration(self.ice_servers), self.connect_timeout_s, gone)
        viewer = Viewer(vid, session.id, peer)
        self.viewers[vid] = viewer

        def add_tracks(pc: RTCPeerConnection) -> None:
            for transceiver in pc.getTransceivers():
                if transceiver.kind not in ("audio", "video"):
                    continue
                track = tap(session, transceiver.kind, max_ms=400.0, variant=video)
                if track is not None:
                    pc.addTrack(track)
                    viewer.tracks.append(track)
            if not viewer.tracks:
                raise APIError(400, "the offer asks for no audio or video this session can send")

        answer = await peer.answer(sdp, add_tracks)
        self._owner.spawn(peer.reap_unconnected(), f"reap-{vid}")
        log.info("WHEP viewer %s joined session %s", vid, session.id)
        return viewer, answer.sdp

    async def close(self, viewer_id: str) -> bool:
        viewer = self.viewers.pop(viewer_id, None)
        if viewer is None:
            return False
        for track in viewer.tracks:
            track.stop()
        await viewer.peer.close()
        return True

    async def close_session(self, session: Session) -> None:
        for vid in [v.id for v in self.viewers.values() if v.session_id == session.id]:
            await self.close(vid)

    async def close_all(self) -> None:
        await self._owner.cancel_all()
        await asyncio.gather(*(self.close(v) for v in list(self.viewers)), return_exceptions=True)
