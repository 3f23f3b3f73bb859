"""Give a session a face: its animator, its video source and track; the animator observes the session's bus
(each chunk's lips as soon as it is scheduled, the tags and host commands, the mouth closing at a cut).

It sits in engine.session (not engine.avatar) because it knows the session; the avatar knows nothing above it.
"""

from __future__ import annotations

import logging

from engine.avatar.animator import Animator
from engine.avatar.live import RenderPool, SessionVideo
from engine.events import ChunkScheduled, Event, ExpressionCommand, GestureCommand, Interruption
from engine.session.session import Session
from engine.transport.video_out import IdolVideoTrack

log = logging.getLogger(__name__)

MAX_COMPENSATION_S = 0.2


def attach_avatar(session: Session, pool: RenderPool, seed: int | None = None) -> SessionVideo:
    """Create the session's animated video track (``session.video_track``) and wire it up."""
    config = session.settings.avatar
    animator = Animator.from_config(config, seed=seed)
    audio = session.audio_track
    track: IdolVideoTrack | None = None

    def compensation() -> float:
        """Extra time video spends between its pts and the wire, beyond what audio spends."""
        if track is None:
            return 0.0
        d = track.send_delay.value_s - audio.send_delay.value_s
        return min(max(d, 0.0), MAX_COMPENSATION_S)

    video = SessionVideo(pool, animator, config, compensation)
    track = IdolVideoTrack(session.clock, video, catch_up_s=config.catch_up_ms / 1000.0, name=session.id)
    session.video_track = track
    session.video_source = video

    def observe(ev: Event) -> None:
        """The face follows the session's events: lips for each scheduled chunk, tags and host commands,
        the mouth closing at the instant an interruption cuts the audio."""
        try:
            if isinstance(ev, ChunkScheduled):
                animator.schedule_audio(ev.t, ev.audio)
            elif isinstance(ev, ExpressionCommand):
                animator.set_expression(ev.name, ev.t)
            elif isinstance(ev, GestureCommand):
                animator.trigger_gesture(ev.name, ev.t)
            elif isinstance(ev, Interruption):
                animator.interrupt(ev.cut_t if ev.cut_t is not None else ev.t, ev.turn_id)
        except (KeyError, ValueError) as e:
            log.warning("avatar ignored %s: %s", ev, e)

    session.bus.add_observer(observe)
    return video
