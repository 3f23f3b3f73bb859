"""The video encoders' thread policy, and that aiortc's VP8 encoder follows it."""

from __future__ import annotations

import fractions
import time

import numpy as np
import pytest
from aiortc.codecs import vpx
from av import VideoFrame

from engine.transport import encoders
from engine.transport.encoders import EncoderPolicy, aiortc_threads, encoder_threads, install

pytestmark = pytest.mark.unit

P720, P1080 = 1280 * 720, 1920 * 1080


def test_threads_never_oversubscribe_the_cores() -> None:
    assert encoder_threads(P720, 1, 2) == 1  # this machine: aiortc's own choice is already 1
    assert encoder_threads(P720, 1, 16) == aiortc_threads(P720, 16) == 2
    assert encoder_threads(P1080, 1, 16) == 8
    assert encoder_threads(P1080, 4, 16) == 4
    for most in (0, 1, 3):
        for cores in (2, 4, 16, 64):
            for n in range(1, 3 * cores):
                t = encoder_threads(P1080, n, cores, most)
                assert 1 <= t <= (most or 8)
                assert n * t <= max(cores, n), (cores, n, t)


def test_one_thread_an_encoder_by_default_and_aiortcs_choice_on_request() -> None:
    assert EncoderPolicy(cores=16).threads(P1080) == 1
    assert EncoderPolicy(cores=16, per_encoder=0).threads(P1080) == 8
    assert EncoderPolicy(cores=16, per_encoder=4).threads(P1080) == 4
    assert EncoderPolicy(cores=2, per_encoder=4).threads(P1080) == 2  # never past the cores


def test_aiortc_vp8_encoder_takes_the_policy() -> None:
    policy = install(EncoderPolicy(cores=16, per_encoder=0))
    try:
        encoders = [vpx.Vp8Encoder() for _ in range(4)]
        assert policy.live >= 4
        frame = VideoFrame.from_ndarray(np.zeros((1080 * 3 // 2, 1920), np.uint8), format="yuv420p")
        frame.pts, frame.time_base = 0, fractions.Fraction(1, 90000)
        encoders[0].encode(frame)
        assert encoders[0].codec is not None
        assert encoders[0].codec.thread_count == encoder_threads(P1080, policy.live, 16) <= 4
        del encoders
    finally:
        install(EncoderPolicy())


def test_aiortc_vp8_encoder_runs_without_its_denoiser_and_its_frames_decode() -> None:
    install()
    rng = np.random.default_rng(0)
    encoder, decoder = vpx.Vp8Encoder(), vpx.Vp8Decoder()
    picture = rng.integers(0, 255, (360 * 3 // 2, 640), dtype=np.uint8)
    decoded = 0
    for i in range(3):
        frame = VideoFrame.from_ndarray(picture, format="yuv420p")
        frame.pts, frame.time_base = i * 3000, fractions.Fraction(1, 90000)
        payloads, _ = encoder.encode(frame, force_keyframe=i == 0)
        assert payloads
        assert encoder.codec is not None
        given = encoder.codec.given_options
        assert given["noise-sensitivity"] == "0" and given["cpu-used"] == "-16"
        assert given["deadline"] == "realtime"  # aiortc's own stay
        assert (
            "noise-sensitivity" not in encoder.codec.options
        )  # libvpx took it (it keeps what it does not know)
    # the encoder's output is plain VP8: aiortc's own decoder reads it back (depayloaded by libvpx here)
    from aiortc.codecs.vpx import vp8_depayload
    from aiortc.jitterbuffer import JitterFrame

    frame = VideoFrame.from_ndarray(picture, format="yuv420p")
    frame.pts, frame.time_base = 9000, fractions.Fraction(1, 90000)
    payloads, ts = encoder.encode(frame, force_keyframe=True)
    data = b"".join(vp8_depayload(p) for p in payloads)
    for out in decoder.decode(JitterFrame(data=data, timestamp=ts)):
        assert (out.width, out.height) == (640, 360)
        decoded += 1
    assert decoded == 1


def test_the_executor_has_room_for_every_sessions_encoders() -> None:
    assert encoders.executor_workers(16, cores=16) == 16 + 4 * 16
    assert encoders.executor_workers(1, cores=2) == 6  # asyncio's own size on 2 cores
    assert encoders.executor_workers(10_000, cores=16) == 512


def test_an_audio_frame_does_not_wait_behind_other_sessions_video() -> None:
    """Four sessions' worth of slow jobs (a video encode each, plus three more) in flight: one more job
    (a session's audio encode) starts at once, where asyncio's default pool (cores + 4) would queue it."""
    sessions = 4
    pool = encoders.media_executor(sessions)
    try:
        slow = [pool.submit(time.sleep, 0.3) for _ in range(encoders.JOBS_PER_SESSION * sessions - 1)]
        start = time.perf_counter()
        waited = pool.submit(lambda: time.perf_counter() - start).result(timeout=5)
        assert waited < 0.15, f"the job waited {waited * 1000:.0f} ms for a worker"
        for f in slow:
            f.result(timeout=5)
    finally:
        pool.shutdown()
