"""A session: one host connection, its media clock, and the conversation running on it.

Data flow (one task per stage, all owned by the session's :class:`TaskOwner`)::

    mic track ─► mic task: resample 16 kHz ─► VAD ─► ASR stream (partials, speculation)
                                            │
                          end of turn ──────┴─► turn queue ◄── text / chat turns
                                                    │
                          conversation task ─► reply task: LLM ─► chunker ─► guard ─► TTS
                                                                                   │
    audio track ◄── playout buffer (bounded, on the clock) ◄───────────────────────┘

Barge-in: speech from the host while the idol talks flushes the playout buffer (with a
short fade) and cancels the reply task; the history keeps only what was heard.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from aiortc.mediastreams import MediaStreamTrack

from engine.clock import Clock, MediaClock
from engine.config import Settings
from engine.events import (
    ChunkPlaybackStarted,
    ChunkScheduled,
    ExpressionCommand,
    FinalTranscript,
    GestureCommand,
    Interruption,
    PartialTranscript,
    SpeechAudio,
    SpeechEnded,
    SpeechStarted,
    StageError,
    TurnCompleted,
    TurnSource,
    UserTurn,
)
from engine.llm.prompt import PromptProvider, SimplePromptProvider
from engine.models import EngineModels
from engine.session.bus import EventBus
from engine.session.reply import ReplyContext, ReplyResult, StageFailed, run_reply
from engine.session.timings import TurnMetrics, TurnTimings
from engine.session.turn_end import TurnEndDecision, TurnEndDetector
from engine.tasks import TaskOwner, cancel_and_wait
from engine.transport.audio_out import IdolAudioTrack
from engine.transport.mic_in import MIC_RATE, ArrivalMap, mic_chunks
from engine.transport.playout import HeardChunk, PlayoutBuffer
from engine.vad.base import VoiceActivity
from engine.vad.results import VADEndOfTurn, VADSpeechPaused, VADSpeechResumed, VADSpeechStarted

log = logging.getLogger(__name__)

PREROLL_S = 0.3
T = TypeVar("T")


class SessionClosed(Exception):
    pass


@dataclass
class _EarlyReply:
    """A reply started on the speculative transcript while the host is still (maybe) pausing.

    Its audio waits behind ``gate`` and its events and commands wait in ``held`` until the end of
    the turn confirms the transcript; speech coming back, a text turn or an interrupt cancels it
    and nobody ever sees it.
    """

    turn: UserTurn
    timings: TurnTimings
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    held: list[Callable[[], None]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def later(self, deliver: Callable[[T], None]) -> Callable[[T], None]:
        """``deliver`` now if the turn is confirmed, else when it is (never, if the reply is dropped)."""

        def deferred(item: T) -> None:
            if self.gate.is_set():
                deliver(item)
            else:
                self.held.append(lambda: deliver(item))

        return deferred

    def release(self) -> None:
        self.gate.set()
        for action in self.held:
            action()
        self.held.clear()


@dataclass
class _Utterance:
    """The host's current spoken turn as the listener tracks it."""

    stream: Any  # TranscriptStream
    start_t: float = 0.0  # when the speech started (clock time)
    paused: bool = False  # silence since the last pause: audio is held back, not appended
    held: list[np.ndarray] = field(default_factory=list)
    ended: bool = False  # the end of the turn was detected: no more partials, too late for an early reply
    early: _EarlyReply | None = None
    turn_end: TurnEndDecision | None = None  # the latest pause's judgement of the words so far
    turn_end_t: float = 0.0  # when it was made (clock time)

    def append(self, audio: np.ndarray) -> None:
        # Silence after a pause goes to the stream only if speech resumes: the end of the turn
        # then finds the buffer the speculative decode saw, and reuses that decode.
        if self.paused:
            self.held.append(audio)
        else:
            self.stream.append(audio)

    def resume(self) -> None:
        self.paused = False
        for piece in self.held:
            self.stream.append(piece)
        self.held.clear()


class VideoSource(Protocol):
    def set_profile(self, profile: str) -> None: ...


class Session:
    def __init__(
        self,
        session_id: str,
        settings: Settings,
        models: EngineModels,
        *,
        clock: Clock | None = None,
        prompt: PromptProvider | None = None,
        metrics: TurnMetrics | None = None,
    ) -> None:
        self.id = session_id
        self.settings = settings
        self.models = models
        self.clock: Clock = clock or MediaClock()
        self.prompt: PromptProvider = prompt or SimplePromptProvider(settings.persona.system_prompt)
        self.metrics = metrics
        self.bus = EventBus()
        self.playout = PlayoutBuffer(observer=self)
        self.audio_track = IdolAudioTrack(self.clock, self.playout)
        self.turns: deque[TurnTimings] = deque(maxlen=500)
        self._owner = TaskOwner(f"session-{session_id}")
        self._turn_queue: asyncio.Queue[UserTurn] = asyncio.Queue(maxsize=16)
        self._next_turn_id = 1
        self._active: dict[int, TurnTimings] = {}
        self._heard: dict[int, list[HeardChunk]] = defaultdict(list)
        self._finished_chunks: dict[int, int] = defaultdict(int)
        self._replies: dict[int, ReplyResult] = {}
        self._chunk_done = asyncio.Event()
        self._reply_task: asyncio.Task[None] | None = None
        self._reply_turn: UserTurn | None = None
        self._interrupted: set[int] = set()
        self._early: _EarlyReply | None = None  # started on a pause, not yet confirmed
        self._prewarm: asyncio.Task[None] | None = None  # the LLM prefilling the next prompt's start
        self._adopted: dict[int, asyncio.Task[None]] = {}  # confirmed early replies, by turn id
        self.early_replies = {"started": 0, "confirmed": 0, "cancelled": 0}
        self._vad_pool = ThreadPoolExecutor(1, thread_name_prefix=f"vad-{session_id}")
        self._closed = False
        self.video_track: MediaStreamTrack | None = None
        self.video_source: VideoSource | None = None  # set by the avatar when the session has a face
        self._owner.spawn(self._conversation(), "conversation")

    # ---- public API ----------------------------------------------------------------------

    def attach_mic(self, track: MediaStreamTrack) -> None:
        self._owner.spawn(self._listen(track), "mic")

    async def submit_text(self, text: str, speaker: str = "host", source: TurnSource = "host_text") -> int:
        """A typed or chat message becomes a turn like speech does; returns its turn id."""
        if self._closed:
            raise SessionClosed(self.id)
        text = text.strip()
        if not text:
            raise ValueError("empty message")
        now = self.clock.now()
        turn = self._new_turn(text, source, speaker, now)
        self._active[turn.turn_id].end_of_turn = now
        self._active[turn.turn_id].asr_final = now
        self._turn_queue.put_nowait(turn)
        return turn.turn_id

    def _speaking(self) -> bool:
        """The idol is talking, or about to (a reply is being generated)."""
        task = self._reply_task
        return self.playout.active or (task is not None and not task.done())

    async def interrupt(self, reason: str = "host") -> bool:
        """Stop the idol now: flush queued audio (with a short fade) and cancel the reply."""
        task, turn = self._reply_task, self._reply_turn
        self._cancel_early(reason)
        if not self._speaking():
            return False
        t = self.clock.now()
        cut = self.playout.next_sample_time()
        for heard in self.playout.flush():
            self._heard[heard.audio.turn_id].append(heard)
        if turn is not None:
            self._interrupted.add(turn.turn_id)
        self._chunk_done.set()
        # the avatar closes the mouth at the instant the audio stops (cut_t)
        turn_id = turn.turn_id if turn is not None else None
        self.bus.publish(
            Interruption(t=t, reason=reason, cut_t=cut if cut is not None else t, turn_id=turn_id)
        )
        await cancel_and_wait(task)
        return True

    def set_output_profile(self, name: str) -> None:
        """Switch the video size live: no model reload, no renegotiation (the encoder follows the size)."""
        if self.video_source is None:
            raise ValueError("this session has no video")
        self.video_source.set_profile(name)

    async def set_persona(self, name: str) -> None:
        """Switch who she is, live (needs a prompt provider that supports it: the persona bank)."""
        switch = getattr(self.prompt, "switch_persona", None)
        if switch is None:
            raise ValueError("persona switching needs the persona memory bank (persona.enabled)")
        result = switch(name)
        if asyncio.iscoroutine(result):
            await result

    def command(self, cmd: ExpressionCommand | GestureCommand) -> None:
        """A face command (the host's, or a tag in the reply): the avatar and the pages see it on the bus."""
        self.bus.publish(cmd)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.playout.flush()
        await cancel_and_wait(self._reply_task)
        await self._owner.cancel_all()
        self.audio_track.stop()
        if self.video_track is not None:
            self.video_track.stop()
        self._vad_pool.shutdown(wait=False, cancel_futures=True)
        self.bus.close()

    # ---- turns ---------------------------------------------------------------------------

    def _new_turn(
        self, text: str, source: TurnSource, speaker: str, t: float, *, announce: bool = True
    ) -> UserTurn:
        turn_id = self._next_turn_id
        self._next_turn_id += 1
        self._active[turn_id] = TurnTimings(turn_id=turn_id, source=source, user_text=text)
        turn = UserTurn(t=t, text=text, source=source, speaker=speaker, turn_id=turn_id)
        if announce:
            self._announce(turn)
        return turn

    def _announce(self, turn: UserTurn) -> None:
        self.bus.publish(turn)

    def _stop_prewarm(self) -> None:
        """A reply needs the model (and the cache) now: the prewarm stops at its next prefill chunk."""
        if self._prewarm is not None:
            self._prewarm.cancel()
            self._prewarm = None

    def _reply_context(self, early: _EarlyReply | None = None) -> ReplyContext:
        self._stop_prewarm()
        return ReplyContext(
            llm=self.models.llm,
            tts=self.models.tts,
            tts_config=self.settings.tts,
            prompt=self.prompt,
            playout=self.playout,
            clock=self.clock,
            publish=self.bus.publish if early is None else early.later(self.bus.publish),
            cache_key=self.id,
            on_command=self.command if early is None else early.later(self.command),
            background=self._owner.spawn,
            gate=None if early is None else early.gate,
        )

    async def _conversation(self) -> None:
        while True:
            turn = await self._turn_queue.get()
            timings = self._active[turn.turn_id]
            self._reply_turn = turn
            task = self._adopted.pop(turn.turn_id, None)
            if task is None:
                self._cancel_early("text turn")  # one reply at a time: this turn goes first
                task = self._owner.spawn(
                    self._reply(turn, self._reply_context(), timings), f"reply{turn.turn_id}"
                )
            self._reply_task = task
            await asyncio.wait([task])
            self._complete(turn, timings)

    # ---- early replies (started on the pause, confirmed at the end of the turn) -------------

    def _start_early(self, utt: _Utterance, text: str) -> None:
        """The host paused and the speculative transcript is ready: start replying now, silently."""
        if (
            not self.settings.vad.early_reply
            or utt.ended
            or utt.early is not None
            or self._early is not None
            or self._speaking()
            or not self._turn_queue.empty()
        ):
            return
        turn = self._new_turn(text, "voice", "host", self.clock.now(), announce=False)
        timings = self._active[turn.turn_id]
        timings.early_reply = True
        early = _EarlyReply(turn=turn, timings=timings)
        early.task = self._owner.spawn(
            self._reply(turn, self._reply_context(early), timings), f"early{turn.turn_id}"
        )
        utt.early = self._early = early
        self.early_replies["started"] += 1

    def _cancel_early(self, reason: str) -> None:
        early, self._early = self._early, None
        if early is None or early.task is None:
            return
        log.debug("early reply to %r cancelled: %s", early.turn.text, reason)
        self.early_replies["cancelled"] += 1
        early.held.clear()
        early.task.cancel()
        self._active.pop(early.turn.turn_id, None)
        self._replies.pop(early.turn.turn_id, None)

    async def _reply(self, turn: UserTurn, ctx: ReplyContext, timings: TurnTimings) -> None:
        try:
            result = self._replies[turn.turn_id] = ReplyResult()
            await run_reply(turn, ctx, timings, result)
            while (
                self._finished_chunks[turn.turn_id] < result.queued and turn.turn_id not in self._interrupted
            ):
                self._chunk_done.clear()
                await self._chunk_done.wait()
        except asyncio.CancelledError:
            raise
        except Exception as group:  # one stage failed: end this turn, keep the session
            e = _root_cause(group)
            stage = _stage_of(e)
            log.error("turn %d failed in %s: %s", turn.turn_id, stage, e, exc_info=e)
            timings.error = f"{stage}: {e}"
            self.bus.publish(
                StageError(t=self.clock.now(), stage=stage, message=str(e), turn_id=turn.turn_id)
            )

    def _complete(self, turn: UserTurn, timings: TurnTimings) -> None:
        heard = self._heard.pop(turn.turn_id, [])
        heard.sort(key=lambda h: h.audio.index)
        played = " ".join(h.heard_text() for h in heard).strip()
        interrupted = turn.turn_id in self._interrupted
        result = self._replies.pop(turn.turn_id, None)
        # Heard in full: the history keeps the model's own words (tags included), so the next prompt
        # starts with exactly the tokens the LLM already holds in its KV cache. Cut short: only what was heard.
        remembered = (
            result.written.strip() if result and played and not interrupted and not timings.error else played
        )
        self._interrupted.discard(turn.turn_id)
        self._finished_chunks.pop(turn.turn_id, None)
        timings.interrupted = interrupted
        self._active.pop(turn.turn_id, None)
        self.turns.append(timings)
        if self.metrics is not None:
            self.metrics.observe(timings)
        self.bus.publish(
            TurnCompleted(
                t=self.clock.now(),
                turn_id=turn.turn_id,
                played_text=played,
                interrupted=interrupted,
                timings=timings.to_dict(),
                clock_origin=getattr(self.clock, "origin", None),
            )
        )
        record = self._owner.spawn(
            self.prompt.record_turn(turn, remembered or played, interrupted), f"record{turn.turn_id}"
        )
        if self.settings.llm.prewarm:
            self._stop_prewarm()
            self._prewarm = self._owner.spawn(self._prewarm_next(record), f"prewarm{turn.turn_id}")
        self._reply_turn = None

    async def _prewarm_next(self, record: asyncio.Task[None]) -> None:
        """Once the turn is recorded (history trimmed or consolidated), have the LLM prefill what the next
        prompt starts with, while the host is still talking: the next reply then prefills only its own
        message (a trimmed history costs the next turn a full re-prefill otherwise)."""
        await asyncio.wait([record])
        if (self._reply_task is not None and not self._reply_task.done()) or self._early is not None:
            return  # a reply already has the model
        t0 = self.clock.now()
        try:
            n = await self.models.llm.prewarm(self.prompt.next_prefix(), cache_key=self.id)
        except Exception as e:  # an optimization: the next reply simply prefills it all
            log.warning("prewarming the next prompt failed: %r", e)
            return
        if n:
            log.info("prewarmed the next prompt: %d tokens in %.0f ms", n, (self.clock.now() - t0) * 1e3)

    # ---- the playout buffer's observer (on the loop) -------------------------------------------

    def chunk_scheduled(self, audio: SpeechAudio, start_t: float) -> None:
        self.bus.publish(ChunkScheduled(t=start_t, audio=audio))

    def chunk_started(self, audio: SpeechAudio, t: float) -> None:
        timings = self._active.get(audio.turn_id)
        if timings is not None:  # when the frame really left the track (t is its nominal pts time)
            timings.mark("first_audio_sent", max(t, self.clock.now()))
        for name in audio.expressions:
            self.command(ExpressionCommand(t=t, name=name, source="llm"))
        for name in audio.gestures:
            self.command(GestureCommand(t=t, name=name, source="llm"))
        self.bus.publish(ChunkPlaybackStarted(t=t, audio=audio))

    def chunk_finished(self, heard: HeardChunk) -> None:
        self._heard[heard.audio.turn_id].append(heard)
        self._finished_chunks[heard.audio.turn_id] += 1
        self._chunk_done.set()

    # ---- listening -------------------------------------------------------------------------

    async def _listen(self, track: MediaStreamTrack) -> None:
        loop = asyncio.get_running_loop()
        vad = self.models.new_vad()
        preroll: deque[np.ndarray] = deque(maxlen=int(PREROLL_S * MIC_RATE / 320) + 1)
        utt: _Utterance | None = None
        turn_owner = TaskOwner(f"session-{self.id}-asr")
        arrivals = ArrivalMap()
        voiced_s = 0.0  # how long speech has lasted (for barge-in, faster than a full turn start)
        barge_s = self.settings.vad.barge_in_min_speech_ms / 1000.0
        try:
            async for chunk in mic_chunks(track, self.clock):
                arrivals.add(chunk)
                events = await loop.run_in_executor(self._vad_pool, vad.feed, chunk.audio, chunk.t)
                voiced_s = (
                    voiced_s + len(chunk.audio) / MIC_RATE
                    if vad.last_probability >= vad.config.threshold
                    else 0.0
                )
                if voiced_s >= barge_s and self._speaking():
                    voiced_s = float("-inf")  # once per utterance
                    turn_owner.spawn(self.interrupt("barge_in"), "barge-in")
                if utt is not None:
                    utt.append(chunk.audio)
                else:
                    preroll.append(chunk.audio)
                for ev in events:
                    if isinstance(ev, VADSpeechStarted):
                        utt = _Utterance(self.models.asr.new_stream(), start_t=arrivals.clock_time(ev.t))
                        for piece in preroll:
                            utt.append(piece)
                        preroll.clear()
                        self.bus.publish(SpeechStarted(t=arrivals.clock_time(ev.t)))
                        turn_owner.spawn(self._partials(utt), "partials")
                        if self._speaking():
                            turn_owner.spawn(self.interrupt("barge_in"), "barge-in")
                    elif isinstance(ev, VADSpeechPaused) and utt is not None:
                        utt.paused = True
                        turn_owner.spawn(self._speculate(utt, vad, ev.t), "speculate")
                    elif isinstance(ev, VADSpeechResumed) and utt is not None:
                        utt.resume()
                        if utt.early is not None:
                            utt.early = None
                            self._cancel_early("speech resumed")
                    elif isinstance(ev, VADEndOfTurn) and utt is not None:
                        speech_end = arrivals.clock_time(ev.speech_end_t)
                        self.bus.publish(SpeechEnded(t=speech_end))
                        eot = arrivals.clock_time(ev.t)
                        utt.ended = True
                        turn_owner.spawn(self._finalize(utt, speech_end, eot), "final")
                        utt = None
        finally:
            await turn_owner.cancel_all()

    async def _speculate(self, utt: _Utterance, vad: VoiceActivity, silence_start: float) -> None:
        await utt.stream.speculate()
        settled = utt.stream.settled()
        log.debug("speculation: %r (still paused: %s)", settled and settled.text, utt.paused)
        if settled is None or not settled.text or not utt.paused or utt.ended:
            return
        words = UserTurn(t=self.clock.now(), text=settled.text, source="voice", speaker="host", turn_id=0)
        detector = TurnEndDetector(self.settings.vad, self.models.llm, self.prompt, self.id)
        try:
            decision = await detector.decide(words)
        except Exception as e:  # an optimization: the turn then ends on the whole silence
            log.warning("end-of-turn scoring failed: %r", e)
            decision = TurnEndDecision(False, detector.method)
        log.debug("turn end: %r -> %s", settled.text, decision)
        if not utt.paused or utt.ended or utt.stream.settled() is None:
            return  # speech came back (or the turn ended) while it was scored
        utt.turn_end, utt.turn_end_t = decision, self.clock.now()
        finished_ms = self.settings.vad.end_of_turn_finished_ms
        if decision.finished and finished_ms:
            vad.end_turn_sooner(silence_start, finished_ms)  # finished words: answer them sooner
        self._start_early(utt, settled.text)

    async def _partials(self, utt: _Utterance) -> None:
        interval = self.settings.asr.partial_interval_ms / 1000.0
        last = ""
        while not utt.ended:
            await asyncio.sleep(interval)
            if utt.paused or utt.ended:
                continue  # the speculative decode has the worker now
            tr = await utt.stream.partial()
            if tr.text and tr.text != last:
                last = tr.text
                self.bus.publish(
                    PartialTranscript(t=self.clock.now(), text=tr.text, stable_text=tr.stable_text)
                )
                if not self._speaking() and not utt.paused and not utt.ended:
                    await self._warm_turn(tr.text)

    async def _warm_turn(self, words: str) -> None:
        """The LLM evaluates the host's words so far while she talks (an optimization: failures only log)."""
        turn = UserTurn(t=self.clock.now(), text=words, source="voice", speaker="host", turn_id=0)
        try:
            await TurnEndDetector(self.settings.vad, self.models.llm, self.prompt, self.id).warm(turn)
        except Exception as e:
            log.debug("warming the turn's words failed: %r", e)

    async def _finalize(self, utt: _Utterance, speech_end: float, eot: float) -> None:
        final = await utt.stream.final()
        now = self.clock.now()
        text = final.text.strip()
        early, utt.early = utt.early, None
        if early is not None and (early is not self._early or early.turn.text != text):
            early = None
            self._cancel_early("transcript changed")
        if not text:
            # Heard speech, recognised no words: say so (the host sees it) and keep listening.
            log.info("turn not answered: no words recognised in %.1f s of speech", speech_end - utt.start_t)
            self.bus.publish(
                FinalTranscript(
                    t=now,
                    text="",
                    unanswered="no words recognised",
                    speech_s=round(max(0.0, speech_end - utt.start_t), 3),
                )
            )
            return
        if early is not None and early.task is not None:
            self._early = None
            turn = early.turn
            self._adopted[turn.turn_id] = early.task
            self.early_replies["confirmed"] += 1
        else:
            turn = self._new_turn(text, "voice", "host", now, announce=False)
        turn = UserTurn(
            t=now, text=text, source="voice", speaker="host", turn_id=turn.turn_id, speech_end_t=speech_end
        )
        timings = self._active[turn.turn_id]
        timings.speech_end, timings.end_of_turn, timings.asr_final = speech_end, eot, now
        if utt.turn_end is not None:
            decided = round((utt.turn_end_t - speech_end) * 1000, 1)
            timings.turn_end = utt.turn_end.to_dict() | {"decided_after_speech_end_ms": decided}
        self._announce(turn)
        self.bus.publish(FinalTranscript(t=now, text=text, turn_id=turn.turn_id))
        if early is not None:
            early.release()  # its audio may play from now on
        self._turn_queue.put_nowait(turn)


def _root_cause(e: BaseException) -> BaseException:
    """The first real failure inside (nested) exception groups from the reply's task group."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _stage_of(e: BaseException) -> str:
    return e.stage if isinstance(e, StageFailed) else "session"
