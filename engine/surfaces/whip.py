"""WHIP ingest (RFC 9725): the host's mic, or OBS's audio, pushed into the engine.

* ``POST /api/whip`` starts a **new session** whose mic is the pushed audio (the engine's own peer
  manager answers it, so the session lives and dies with that peer);
* ``POST /api/sessions/{sid}/whip`` pushes audio into an **existing** session (for example OBS's
  microphone into the session the host console opened) on a peer of its own.

Either way the resource is ``/api/whip/{id}``; ``DELETE`` ends it (and the session it created).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from engine.server.engine import Engine, EngineBusy, EngineNotReady
from engine.server.errors import APIError
from engine.server.webrtc import PeerManager, offer_error
from engine.session.session import Session
from engine.surfaces.sdp_http import rtc_configuration
from engine.tasks import TaskOwner
from engine.transport.mic_in import set_receive_jitter

log = logging.getLogger(__name__)


@dataclass
class Ingest:
    id: str
    session_id: str
    pc: RTCPeerConnection | None  # None: the session's own peer (the engine closes it with the session)
    owns_session: bool


class WHIPServer:
    def __init__(self, engine: Engine, peers: PeerManager, ice_servers: list[str]) -> None:
        self._owner = TaskOwner("whip")
        self.engine = engine
        self.peers = peers
        self.ice_servers = ice_servers
        self.ingests: dict[str, Ingest] = {}

    async def new_session(self, sdp: str) -> tuple[Ingest, str]:
        if "m=audio" not in sdp:
            raise APIError(400, "a WHIP offer to the engine must carry audio (the host's voice)")
        try:
            session, answer = await self.peers.answer(sdp, "offer")
        except (EngineNotReady, EngineBusy) as e:
            raise APIError(503, str(e)) from None
        ingest = Ingest(session.id, session.id, None, owns_session=True)
        self.ingests[ingest.id] = ingest
        log.info("WHIP ingest started session %s", session.id)
        return ingest, answer.sdp

    async def into_session(self, session: Session, sdp: str) -> tuple[Ingest, str]:
        if "m=audio" not in sdp:
            raise APIError(400, "a WHIP offer to the engine must carry audio")
        pc = RTCPeerConnection(rtc_configuration(self.ice_servers))
        ingest = Ingest(uuid.uuid4().hex[:12], session.id, pc, owns_session=False)
        self.ingests[ingest.id] = ingest
        attached = False

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            nonlocal attached
            if track.kind == "audio" and not attached:
                attached = True
                set_receive_jitter(pc, track, self.engine.settings.server.mic_jitter_frames)
                session.attach_mic(track)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.close(ingest.id)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as e:  # whatever aiortc raised: nothing half-made stays behind
            await self.close(ingest.id)
            raise APIError(400, f"malformed SDP offer: {offer_error(e)}") from None
        except BaseException:
            await asyncio.shield(self.close(ingest.id))
            raise
        self._owner.spawn(self._reap_unconnected(ingest, pc), f"reap-{ingest.id}")
        log.info("WHIP ingest %s into session %s", ingest.id, session.id)
        return ingest, pc.localDescription.sdp

    async def _reap_unconnected(self, ingest: Ingest, pc: RTCPeerConnection) -> None:
        limit = self.engine.settings.server.connect_timeout_s
        await asyncio.sleep(limit)
        if self.ingests.get(ingest.id) is ingest and pc.connectionState != "connected":
            log.info("WHIP ingest %s did not connect within %.0f s; closing it", ingest.id, limit)
            await self.close(ingest.id)

    async def close(self, ingest_id: str) -> bool:
        ingest = self.ingests.pop(ingest_id, None)
        if ingest is None:
            return False
        if ingest.pc is not None:
            await ingest.pc.close()
        if ingest.owns_session:
            await self.engine.close_session(ingest.session_id)
        return True

    async def close_session(self, session: Session) -> None:
        for ingest in [i for i in self.ingests.values() if i.session_id == session.id]:
            self.ingests.pop(ingest.id, None)
            if ingest.pc is not None:
                await ingest.pc.close()

    async def close_all(self) -> None:
        await self._owner.cancel_all()
        await asyncio.gather(*(self.close(i) for i in list(self.ingests)), return_exceptions=True)
