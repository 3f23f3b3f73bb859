"""One WebRTC peer from offer to close, for every door: the host console, WHIP ingest and WHEP viewers.

:class:`Peer` answers an offer (any failure closes what was made and is answered 400 with the reason,
a cancellation closes it too), reports the connection's states, and is reaped if it has not connected
within ``connect_timeout_s``. The reaper ends the moment the peer connects or closes (issue 11: it used
to sleep the whole timeout out after the peer had connected).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from engine.server.errors import APIError

log = logging.getLogger(__name__)

MAX_SDP_BYTES = 64 * 1024


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


class Peer:
    """An RTCPeerConnection and what happens to it.

    ``on_gone`` runs once the peer failed, closed, was reaped or could not answer (it must tolerate
    running more than once: the caller's close of its own resource); ``on_track`` gets each incoming
    track; ``on_state`` each connection state.
    """

    def __init__(
        self,
        name: str,
        configuration: RTCConfiguration,
        connect_timeout_s: float,
        on_gone: Callable[[], Awaitable[object]],
        on_track: Callable[[RTCPeerConnection, MediaStreamTrack], None] | None = None,
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.pc = RTCPeerConnection(configuration)
        self.connect_timeout_s = connect_timeout_s
        self._on_gone = on_gone
        self._settled = asyncio.Event()  # connected, or gone: the reaper has nothing left to wait for
        pc = self.pc

        if on_track is not None:
            track_cb = on_track

            @pc.on("track")
            def _track(track: MediaStreamTrack) -> None:
                track_cb(pc, track)

        @pc.on("connectionstatechange")
        async def _state() -> None:
            state = pc.connectionState
            if on_state is not None:
                on_state(state)
            if state in ("connected", "failed", "closed"):
                self._settled.set()
            if state in ("failed", "closed"):
                await self._on_gone()

    @property
    def connected(self) -> bool:
        return self.pc.connectionState == "connected"

    async def answer(
        self, sdp: str, add_tracks: Callable[[RTCPeerConnection], None] | None = None
    ) -> RTCSessionDescription:
        """Answer ``sdp``; ``add_tracks`` adds the outgoing tracks once the offer is known (it may raise
        :class:`APIError` to refuse the offer as it stands)."""
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            if add_tracks is not None:
                add_tracks(self.pc)
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except APIError:
            await self.gone()
            raise
        except Exception as e:  # whatever aiortc raised: nothing half-made stays behind
            await self.gone()
            raise APIError(400, f"malformed SDP offer: {offer_error(e)}") from None
        except BaseException:  # cancelled: leave nothing half-made behind
            await asyncio.shield(self.gone())
            raise
        return self.pc.localDescription

    async def gone(self) -> None:
        self._settled.set()
        await self._on_gone()

    async def reap_unconnected(self) -> None:
        """Close the peer (through ``on_gone``) unless it connects within ``connect_timeout_s``; returns
        as soon as it connects or is gone."""
        try:
            await asyncio.wait_for(self._settled.wait(), self.connect_timeout_s)
        except TimeoutError:
            log.info("%s did not connect within %.0f s; closing it", self.name, self.connect_timeout_s)
            await self.gone()

    async def close(self) -> None:
        self._settled.set()
        await self.pc.close()
