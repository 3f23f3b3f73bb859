"""The reply side of a session: turns queue up, are answered one at a time, and complete with what was heard.

Every turn is a :class:`~engine.session.turn.Turn`. The conversation task takes the next turn, starts its
reply (or adopts the early reply already running for it), waits until the reply has played out, then
publishes :class:`~engine.events.TurnCompleted` and records what the audience heard in the history. It is
also the playout buffer's observer (captions, the face's tags, what was heard) and where an interrupt cuts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from engine.events import (
    ChunkPlaybackStarted,
    ChunkScheduled,
    ExpressionCommand,
    GestureCommand,
    Interruption,
    SpeechAudio,
    StageError,
    TurnCompleted,
    TurnSource,
    UserTurn,
)
from engine.session.early import EarlyReplies, EarlyReply
from engine.session.reply import ReplyContext, StageFailed, run_reply
from engine.session.timings import TurnTimings
from engine.session.turn import SessionParts, Turn
from engine.tasks import TaskOwner, cancel_and_wait
from engine.transport.playout import HeardChunk

log = logging.getLogger(__name__)


class Conversation:
    def __init__(self, parts: SessionParts, owner: TaskOwner) -> None:
        self.parts = parts
        self._owner = owner
        self.history: deque[TurnTimings] = deque(maxlen=500)  # completed turns' timings
        self.early = EarlyReplies(self, lambda: parts.settings.vad.early_reply)
        self._queue: asyncio.Queue[Turn] = asyncio.Queue(maxsize=16)
        self._live: dict[int, Turn] = {}  # turns not completed yet: the playout reports chunks by turn id
        self._next_id = 1
        self.current: Turn | None = None  # the turn being answered
        self._chunk_done = asyncio.Event()
        self._prewarm: asyncio.Task[None] | None = None  # the LLM prefilling the next prompt's start

    # ---- turns ---------------------------------------------------------------------------------

    def new_turn(self, text: str, source: TurnSource, speaker: str, *, announce: bool = True) -> Turn:
        turn_id, self._next_id = self._next_id, self._next_id + 1
        user = UserTurn(t=self.parts.clock.now(), text=text, source=source, speaker=speaker, turn_id=turn_id)
        turn = self._live[turn_id] = Turn(user, TurnTimings(turn_id=turn_id, source=source, user_text=text))
        if announce:
            self.parts.bus.publish(user)
        return turn

    def queue(self, turn: Turn) -> None:
        self._queue.put_nowait(turn)

    def drop(self, turn: Turn) -> None:
        self._live.pop(turn.id, None)

    def live(self, turn: Turn) -> bool:
        """The turn is not completed yet (queued, or being answered)."""
        return turn.id in self._live

    def busy(self) -> bool:
        """Turns are waiting to be answered."""
        return not self._queue.empty()

    def speaking(self) -> bool:
        """The idol is talking, or about to (a reply is being generated)."""
        return self.parts.playout.active or (self.current is not None and self.current.replying)

    async def run(self) -> None:
        while True:
            turn = self.current = await self._queue.get()
            if turn.task is None:  # not an early reply adopted at the end of the turn
                self.early.cancel("text turn")  # one reply at a time: this turn goes first
                turn.task = self.spawn_reply(turn)
            await asyncio.wait([turn.task])
            self._complete(turn)

    async def interrupt(self, reason: str) -> bool:
        """Cut the idol now: flush the queued audio (with a short fade) and cancel the reply."""
        turn = self.current
        self.early.cancel(reason)
        if not self.speaking():
            return False
        t = self.parts.clock.now()
        cut = self.parts.playout.next_sample_time()
        for heard in self.parts.playout.flush():
            if (cut_turn := self._live.get(heard.audio.turn_id)) is not None:
                cut_turn.heard.append(heard)
        if turn is not None:
            turn.interrupted = True
        self._chunk_done.set()
        # the avatar closes the mouth at the instant the audio stops (cut_t)
        cut_t = cut if cut is not None else t
        turn_id = turn.id if turn is not None else None
        self.parts.bus.publish(Interruption(t=t, reason=reason, cut_t=cut_t, turn_id=turn_id))
        await cancel_and_wait(turn.task if turn is not None else None)
        return True

    async def close(self) -> None:
        self.parts.playout.flush()
        await cancel_and_wait(self.current.task if self.current is not None else None)

    # ---- one reply -------------------------------------------------------------------------------

    def spawn_reply(self, turn: Turn, early: EarlyReply | None = None) -> asyncio.Task[None]:
        self._stop_prewarm()  # a reply needs the model (and the cache) now
        p = self.parts
        ctx = ReplyContext(
            llm=p.models.llm,
            tts=p.models.tts,
            tts_config=p.settings.tts,
            prompt=p.prompt,
            playout=p.playout,
            clock=p.clock,
            publish=p.bus.publish if early is None else early.later(p.bus.publish),
            cache_key=p.id,
            background=self._owner.spawn,
            gate=None if early is None else early.gate,
            scored=None if early is None else early.scored,
        )
        name = f"{'early' if early else 'reply'}{turn.id}"
        return self._owner.spawn(self._reply(turn, ctx), name)

    async def _reply(self, turn: Turn, ctx: ReplyContext) -> None:
        try:
            await run_reply(turn.user, ctx, turn.timings, turn.result)
            while not turn.played_out:
                self._chunk_done.clear()
                await self._chunk_done.wait()
        except asyncio.CancelledError:
            raise
        except Exception as group:  # one stage failed: end this turn, keep the session
            e = _root_cause(group)
            stage = e.stage if isinstance(e, StageFailed) else "session"
            log.error("turn %d failed in %s: %s", turn.id, stage, e, exc_info=e)
            turn.timings.error = f"{stage}: {e}"
            self.parts.bus.publish(
                StageError(t=self.parts.clock.now(), stage=stage, message=str(e), turn_id=turn.id)
            )

    def _complete(self, turn: Turn) -> None:
        p = self.parts
        played = turn.played_text()
        timings = turn.timings
        timings.interrupted = turn.interrupted
        timings.silences_ms = [round(ms, 1) for ms in p.playout.gaps_of(turn.id)]
        self._live.pop(turn.id, None)
        self.history.append(timings)
        if p.metrics is not None:
            p.metrics.observe(timings)
        p.bus.publish(
            TurnCompleted(
                t=p.clock.now(),
                turn_id=turn.id,
                played_text=played,
                interrupted=turn.interrupted,
                timings=timings.to_dict(),
                clock_origin=getattr(p.clock, "origin", None),
                continued=True if turn.continued else None,
            )
        )
        record: asyncio.Task[None] | None = None
        if not turn.continued:  # else the turn that continues it holds its words: the history keeps them once
            remembered = turn.remembered(played)
            record = self._owner.spawn(
                p.prompt.record_turn(turn.user, remembered, turn.interrupted), f"record{turn.id}"
            )
        if p.settings.llm.prewarm:
            self._stop_prewarm()
            self._prewarm = self._owner.spawn(self._prewarm_next(record), f"prewarm{turn.id}")
        self.current = None

    # ---- prewarming the next prompt ----------------------------------------------------------------

    def _stop_prewarm(self) -> None:
        """A reply needs the model now: the prewarm stops at its next prefill chunk."""
        if self._prewarm is not None:
            self._prewarm.cancel()
            self._prewarm = None

    async def _prewarm_next(self, record: asyncio.Task[None] | None) -> None:
        """Once the turn is recorded (history trimmed or consolidated), have the LLM prefill what the next
        prompt starts with, while the host is still talking: the next reply then prefills only its own
        message (a trimmed history costs the next turn a full re-prefill otherwise)."""
        if record is not None:
            await asyncio.wait([record])
        if (self.current is not None and self.current.replying) or self.early.pending is not None:
            return  # a reply already has the model
        p = self.parts
        t0 = p.clock.now()
        try:
            n = await p.models.llm.prewarm(p.prompt.next_prefix(), cache_key=p.id)
        except Exception as e:  # an optimization: the next reply simply prefills it all
            log.warning("prewarming the next prompt failed: %r", e)
            return
        if n:
            log.info("prewarmed the next prompt: %d tokens in %.0f ms", n, (p.clock.now() - t0) * 1e3)

    # ---- the playout buffer's observer (on the loop) -------------------------------------------

    def chunk_scheduled(self, audio: SpeechAudio, start_t: float) -> None:
        self.parts.bus.publish(ChunkScheduled(t=start_t, audio=audio))

    def chunk_started(self, audio: SpeechAudio, t: float) -> None:
        p = self.parts
        turn = self._live.get(audio.turn_id)
        if turn is not None:  # when the frame really left the track (t is its nominal pts time)
            turn.timings.mark("first_audio_sent", max(t, p.clock.now()))
        for name in audio.expressions:
            p.bus.publish(ExpressionCommand(t=t, name=name, source="llm"))
        for name in audio.gestures:
            p.bus.publish(GestureCommand(t=t, name=name, source="llm"))
        p.bus.publish(ChunkPlaybackStarted(t=t, audio=audio))

    def chunk_finished(self, heard: HeardChunk) -> None:
        turn = self._live.get(heard.audio.turn_id)
        if turn is not None:
            turn.heard.append(heard)
            turn.chunks_finished += 1
        self._chunk_done.set()


def _root_cause(e: BaseException) -> BaseException:
    """The first real failure inside (nested) exception groups from the reply's task group."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e
