"""Give a session a face: its animator, its video source and track, wired to its speech and commands."""

from __future__ import annotations

import logging

from engine.avatar.animator import Animator
from engine.avatar.live import RenderPool, SessionVideo
from engine.events import ExpressionCommand, GestureCommand, SpeechAudio
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
    track = IdolVideoTrack(session.clock, video)
    session.video_track = track
    session.video_source = video

    def on_scheduled(speech: SpeechAudio, start_t: float) -> None:
        animator.schedule_audio(start_t, speech)

    def on_command(cmd: ExpressionCommand | GestureCommand) -> None:
        try:
            if isinstance(cmd, ExpressionCommand):
                animator.set_expression(cmd.name, cmd.t)
            else:
                animator.trigger_gesture(cmd.name, cmd.t)
        except (KeyError, ValueError) as e:
            log.warning("avatar ignored %s: %s", cmd, e)

    session.playout.on_scheduled.append(on_scheduled)
    session.command_listeners.append(on_command)
    session.interrupt_listeners.append(lambda t, turn_id: animator.interrupt(t, turn_id))
    return video
