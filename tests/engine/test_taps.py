"""A session's tracks are born tappable (engine/transport/taps.py): one pull, every consumer a copy."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from engine.clock import ScriptedClock
from engine.transport.audio_out import IdolAudioTrack
from engine.transport.playout import PlayoutBuffer
from engine.transport.taps import IDLE_PRIMARY_S, tap

pytestmark = pytest.mark.unit


class Outgoing:
    def __init__(self, audio: IdolAudioTrack) -> None:
        self.audio_track = audio
        self.video_track = None


async def test_a_tap_gets_its_own_copy_of_each_frame_the_host_pulls() -> None:
    clock = ScriptedClock(1.0)
    track = IdolAudioTrack(clock, PlayoutBuffer())
    viewer = tap(Outgoing(track), "audio", max_ms=100.0)
    assert viewer is not None and tap(Outgoing(track), "video") is None  # no face: no video tap
    pulled = []
    for _ in range(3):
        task = asyncio.ensure_future(track.recv())
        await asyncio.sleep(0)
        clock.advance(0.02)
        pulled.append(await task)
    for frame in pulled:  # the same frames, in order, never the same objects
        copy = await asyncio.wait_for(viewer.recv(), 1)
        assert copy is not frame and copy.pts == frame.pts
        assert np.array_equal(copy.to_ndarray(), frame.to_ndarray())
    track.stop()  # the session closes: its taps end with it
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(viewer.recv(), 1)


async def test_a_tap_drives_the_track_while_the_host_pulls_nothing() -> None:
    clock = ScriptedClock(1.0)
    track = IdolAudioTrack(clock, PlayoutBuffer())
    viewer = tap(Outgoing(track), "audio")
    assert viewer is not None
    clock.advance(IDLE_PRIMARY_S + 1.0)  # on the session clock, nobody has pulled for a while
    frame = await asyncio.wait_for(viewer.recv(), 2)  # the tap pulled the track itself
    assert frame.pts is not None and frame.samples == 960
    viewer.stop()
    track.stop()
