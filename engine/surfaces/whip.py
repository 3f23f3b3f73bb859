"""WHIP ingest (RFC 9725): the host's mic, or OBS's audio, pushed into the engine.

* ``POST /api/whip`` starts a **new session** whose mic is the pushed audio (the engine's own peer
  manager answers it, so the session lives and dies with that peer; a full engine answers 503 with
  Retry-After, as the console's offer does);
* ``POST /api/sessions/{sid}/whip`` pushes audio into an **existing** session (for example OBS's
  microphone into the session the host console opened) on a peer of its own.

Either way the resource is ``/api/whip/{id}``; ``DELETE`` ends it (and the session it created).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from engine.server.engine import Engine
from engine.server.errors import APIError
from engine.server.peer import Peer
from engine.server.webrtc import PeerManager
from engine.session.session import Session
from engine.surfaces.sdp_http import rtc_configuration
from engine.tasks import TaskOwner
from engine.transport.mic_in import set_receive_jitter

log = logging.getLogger(__name__)


@dataclass
class Ingest:
    id: str
    session_id: str
    peer: Peer | None  # None: the session's own peer (the engine closes it with the session)
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
        session, answer = await self.peers.answer(sdp, "offer")  # 503 + Retry-After when full
        ingest = Ingest(session.id, session.id, None, owns_session=True)
        self.ingests[ingest.id] = ingest
        log.info("WHIP ingest started session %s", session.id)
        return ingest, answer.sdp

    async def into_session(self, session: Session, sdp: str) -> tuple[Ingest, str]:
        if "m=audio" not in sdp:
            raise APIError(400, "a WHIP offer to the engine must carry audio")
        iid = uuid.uuid4().hex[:12]
        attached = False

        def on_track(pc: RTCPeerConnection, track: MediaStreamTrack) -> None:
            nonlocal attached
            if track.kind == "audio" and not attached:
                attached = True
                set_receive_jitter(pc, track, self.engine.settings.server.mic_jitter_frames)
                session.attach_mic(track)

        async def gone() -> None:
            await self.close(iid)

        server = self.engine.settings.server
        peer = Peer(
            f"WHIP ingest {iid}",
            rtc_configuration(self.ice_servers),
            server.connect_timeout_s,
            gone,
            on_track,
        )
        ingest = Ingest(iid, session.id, peer, owns_session=False)
        self.ingests[iid] = ingest
        answer = await peer.answer(sdp)
        self._owner.spawn(peer.reap_unconnected(), f"reap-{iid}")
        log.info("WHIP ingest %s into session %s", iid, session.id)
        return ingest, answer.sdp

    async def close(self, ingest_id: str) -> bool:
        ingest = self.ingests.pop(ingest_id, None)
        if ingest is None:
            return False
        if ingest.peer is not None:
            await ingest.peer.close()
        if ingest.owns_session:
            await self.engine.close_session(ingest.session_id)
        return True

    async def close_session(self, session: Session) -> None:
        for ingest in [i for i in self.ingests.values() if i.session_id == session.id]:
            self.ingests.pop(ingest.id, None)
            if ingest.peer is not None:
                await ingest.peer.close()

    async def close_all(self) -> None:
        await self._owner.cancel_all()
        await asyncio.gather(*(self.close(i) for i in list(self.ingests)), return_exceptions=True)
