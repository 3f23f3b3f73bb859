"""The listening side of a session: the host's microphone → VAD → ASR → a turn for the conversation.

Per utterance: speech starts (barge-in if the idol is talking), partial transcripts stream while the
host speaks, a pause speculates the final decode and judges whether the words so far are finished
(an early reply may start on them), speech resuming cancels that, and the end of the turn confirms
the transcript and queues the turn. The VAD's own results are converted here, once, into the bus's
events on the session clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from aiortc.mediastreams import MediaStreamTrack

from engine.asr.base import TranscriptStream
from engine.events import FinalTranscript, PartialTranscript, SpeechEnded, SpeechStarted, UserTurn
from engine.session.conversation import Conversation
from engine.session.early import EarlyReply
from engine.session.turn import SessionParts, Turn
from engine.session.turn_end import TurnEndDecision, TurnEndDetector
from engine.tasks import TaskOwner
from engine.transport.mic_in import MIC_RATE, ArrivalMap, mic_chunks
from engine.vad.base import VoiceActivity
from engine.vad.results import VADEndOfTurn, VADSpeechPaused, VADSpeechResumed, VADSpeechStarted

log = logging.getLogger(__name__)

# Audio kept from before the VAD's speech start. The start is placed at the first window silero scores as
# speech, whose probability rises late on a short unstressed first word: at 0.3 s, a fast host's "Do you
# have a favorite animal?" over room noise (bench style fast-noisy) was heard as "you have a favorite
# animal." in 3 of 4 turns; at 0.6 s, 4 of 4 whole. The ASR trims the leading noise by level.
PREROLL_S = 0.6
# A barge-in this recent when speech starts belongs to the new utterance (the barge-in fires on 64 ms of
# voice, the utterance starts after min_speech_ms).
BARGE_IN_BELONGS_S = 1.0


@dataclass
class Utterance:
    """The host's current spoken turn as the listener tracks it."""

    stream: TranscriptStream
    start_t: float = 0.0  # when the speech started (clock time)
    paused: bool = False  # silence since the last pause: audio is held back, not appended
    held: list[np.ndarray] = field(default_factory=list)
    ended: bool = False  # the end of the turn was detected: no more partials, too late for an early reply
    early: EarlyReply | None = None
    turn_end: TurnEndDecision | None = None  # the latest pause's judgement of the words so far
    turn_end_t: float = 0.0  # when it was made (clock time)
    pause_t: float = 0.0  # the latest pause: when it was heard, when its speculative decode was done
    transcribed_t: float = 0.0
    partial_in_flight: bool = False  # at that pause: a partial decode of this utterance was running
    llm_warming: bool = False  # at that pause: the LLM was evaluating a partial transcript's words
    took_the_floor: bool = False  # it interrupted her: its turn ends on the whole silence (see _speculate)
    continues: Turn | None = None  # the host's turn it goes on from (her answer to it cut): see continue_turn

    def words(self, text: str) -> str:
        """What the host has said in this turn: the words of the turn it continues, then ``text``."""
        return f"{self.continues.user.text} {text}".strip() if self.continues is not None else text

    def continue_turn(self, cut: Turn | None) -> None:
        if self.continues is None:
            self.continues = cut

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


class Listener:
    def __init__(self, parts: SessionParts, conversation: Conversation) -> None:
        self.parts = parts
        self.conversation = conversation
        self._vad_pool = ThreadPoolExecutor(1, thread_name_prefix=f"vad-{parts.id}")
        self._warm_task: asyncio.Task[None] | None = None  # the LLM evaluating a partial transcript's words
        self._barged_at: float | None = None  # clock time of the latest barge-in
        self._last_turn: Turn | None = None  # the latest voice turn
        self._cut_turn: Turn | None = None  # what the latest barge-in cut, if speech continues it

    def close(self) -> None:
        self._vad_pool.shutdown(wait=False, cancel_futures=True)

    def _barge_in(self, owner: TaskOwner, utt: Utterance | None) -> None:
        now = self.parts.clock.now()
        recent = self._barged_in_just_now()
        self._barged_at = now
        cut = self._continued_turn(utt.start_t if utt is not None else now)
        self._cut_turn = cut or (self._cut_turn if recent else None)
        if utt is not None:
            utt.took_the_floor = True
            utt.continue_turn(self._cut_turn)
        owner.spawn(self.conversation.interrupt("barge_in"), "barge-in")

    def _continued_turn(self, speech_start: float) -> Turn | None:
        """The host's latest turn, if speech starting at ``speech_start`` goes on from it: it started within
        ``vad.continue_within_ms`` of that turn's end and cuts her answer to it. The turn is marked so its
        words are kept once, with the turn that continues it."""
        within = self.parts.settings.vad.continue_within_ms / 1000.0
        turn = self._last_turn
        if turn is None or turn.user.speech_end_t is None or not within:
            return None
        after = speech_start - turn.user.speech_end_t
        if after > within or not self.conversation.live(turn):
            return None
        turn.continued = True
        log.info(
            "the host goes on from turn %d (%.0f ms after it ended): %r",
            turn.id,
            after * 1000,
            turn.user.text,
        )
        return turn

    def _barged_in_just_now(self) -> bool:
        return self._barged_at is not None and self.parts.clock.now() - self._barged_at <= BARGE_IN_BELONGS_S

    async def run(self, track: MediaStreamTrack) -> None:
        p, conv = self.parts, self.conversation
        loop = asyncio.get_running_loop()
        vad: VoiceActivity = p.models.new_vad()
        preroll: deque[np.ndarray] = deque(maxlen=int(PREROLL_S * MIC_RATE / 320) + 1)
        utt: Utterance | None = None
        owner = TaskOwner(f"session-{p.id}-asr")
        arrivals = ArrivalMap()
        barged_run: float | None = None  # the run of speech windows that last cut her (once a run)
        barge_s = p.settings.vad.barge_in_min_speech_ms / 1000.0
        try:
            async for chunk in mic_chunks(track, p.clock):
                arrivals.add(chunk)
                results = await loop.run_in_executor(self._vad_pool, vad.feed, chunk.audio, chunk.t)
                # voiced time by the VAD's 32 ms windows, not by 20 ms mic chunks (which made 64 ms wait 80)
                run = vad.voiced_since
                if (
                    run is not None
                    and run != barged_run
                    and vad.voiced_s >= barge_s - 1e-6
                    and conv.speaking()
                ):
                    barged_run = run
                    self._barge_in(owner, utt)
                if utt is not None:
                    utt.append(chunk.audio)
                else:
                    preroll.append(chunk.audio)
                for r in results:
                    if isinstance(r, VADSpeechStarted):
                        utt = Utterance(p.models.asr.new_stream(), start_t=arrivals.clock_time(r.t))
                        for piece in preroll:
                            utt.append(piece)
                        preroll.clear()
                        p.bus.publish(SpeechStarted(t=utt.start_t))
                        owner.spawn(self._partials(utt, owner), "partials")
                        if conv.speaking():
                            self._barge_in(owner, utt)
                        elif self._barged_in_just_now():
                            utt.took_the_floor = True
                            utt.continue_turn(self._cut_turn)
                    elif isinstance(r, VADSpeechPaused) and utt is not None:
                        utt.paused = True
                        warming = self._warming()
                        self._stop_warming()  # the pause's decode and judgement need the cores now
                        owner.spawn(self._speculate(utt, vad, r.t, warming), "speculate")
                    elif isinstance(r, VADSpeechResumed) and utt is not None:
                        utt.resume()
                        if utt.early is not None:
                            utt.early = None
                            conv.early.cancel("speech resumed")
                    elif isinstance(r, VADEndOfTurn) and utt is not None:
                        speech_end = arrivals.clock_time(r.speech_end_t)
                        p.bus.publish(SpeechEnded(t=speech_end))
                        utt.ended = True
                        owner.spawn(self._finalize(utt, speech_end, arrivals.clock_time(r.t)), "final")
                        utt = None
        finally:
            await owner.cancel_all()

    def _warming(self) -> bool:
        return self._warm_task is not None and not self._warm_task.done()

    def _stop_warming(self) -> None:
        if self._warm_task is not None and not self._warm_task.done():
            self._warm_task.cancel()  # the LLM stops at its next prefill chunk; what it evaluated stays

    async def _partials(self, utt: Utterance, owner: TaskOwner) -> None:
        p = self.parts
        interval = p.settings.asr.partial_interval_ms / 1000.0
        last = ""
        while not utt.ended:
            await asyncio.sleep(interval)
            if utt.paused or utt.ended:
                continue  # the speculative decode has the worker now
            tr = await utt.stream.partial()
            if tr.text and tr.text != last:
                last = tr.text
                p.bus.publish(PartialTranscript(t=p.clock.now(), text=tr.text, stable_text=tr.stable_text))
                busy = self._warming() or self.conversation.speaking()
                if not busy and not utt.paused and not utt.ended:
                    self._warm_task = owner.spawn(self._warm_turn(utt.words(tr.text)), "warm")

    def _turn_end_detector(self) -> TurnEndDetector:
        p = self.parts
        return TurnEndDetector(p.settings.vad, p.models.llm, p.prompt, p.id)

    async def _warm_turn(self, words: str) -> None:
        """The LLM evaluates the host's words so far while she talks (an optimization: failures only log)."""
        turn = UserTurn(t=self.parts.clock.now(), text=words, source="voice", speaker="host", turn_id=0)
        try:
            await self._turn_end_detector().warm(turn)
        except Exception as e:
            log.debug("warming the turn's words failed: %r", e)

    async def _speculate(
        self, utt: Utterance, vad: VoiceActivity, silence_start: float, warming: bool
    ) -> None:
        """A pause: decode what was said so far, judge whether it is finished, and maybe start replying
        (``warming``: the LLM was evaluating a partial transcript when the pause came)."""
        p = self.parts
        utt.pause_t, utt.transcribed_t, utt.turn_end, utt.turn_end_t = p.clock.now(), 0.0, None, 0.0
        utt.partial_in_flight, utt.llm_warming = utt.stream.busy, warming
        await utt.stream.speculate()
        utt.transcribed_t = p.clock.now()
        settled = utt.stream.settled()
        log.debug("speculation: %r (still paused: %s)", settled and settled.text, utt.paused)
        if settled is None or not settled.text or not utt.paused or utt.ended:
            return
        text = utt.words(settled.text)
        words = UserTurn(t=p.clock.now(), text=text, source="voice", speaker="host", turn_id=0)
        detector = self._turn_end_detector()
        decision = await self._judged_by_early_reply(utt, detector, text)
        if decision is None:
            if not utt.paused or utt.ended:
                return
            try:
                decision = await detector.decide(words)
            except Exception as e:  # an optimization: the turn then ends on the whole silence
                log.warning("end-of-turn scoring failed: %r", e)
                decision = TurnEndDecision(False, detector.method)
        log.debug("turn end: %r -> %s", text, decision)
        if not utt.paused or utt.ended or utt.stream.settled() is None:
            return  # speech came back (or the turn ended) while it was scored
        utt.turn_end, utt.turn_end_t = decision, p.clock.now()
        finished_ms = p.settings.vad.end_of_turn_finished_ms
        # After a barge-in the host has taken the floor: on the H200 "Wait, stop for a second." was judged
        # finished at its comma's pause, answered in 200 ms and that answer cut by the rest of it (the
        # receiver heard her stop 750 ms after the onset, docs/PERFORMANCE.md): such a turn ends on the whole
        # silence.
        hold_floor = utt.took_the_floor and p.settings.vad.barge_in_full_silence
        if decision.finished and finished_ms and not hold_floor:
            vad.end_turn_sooner(silence_start, finished_ms)  # finished words: answer them sooner
        if utt.early is None:
            utt.early = self.conversation.early.start(text)

    async def _judged_by_early_reply(
        self, utt: Utterance, detector: TurnEndDetector, text: str
    ) -> TurnEndDecision | None:
        """Start the early reply on ``text`` now and take the decision from its own prefill, which has the
        LLM's end-of-turn probability after the words on its way to the reply (``ScoredStreamer``): no
        scoring call of its own, and the reply is ~one prefill sooner. None where the reply could not start
        or ended before it had scored."""
        if not detector.scores_in_reply or utt.early is not None:
            return None
        scored: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        def deliver(p: float) -> None:
            if not scored.done():
                scored.set_result(p)

        start = time.perf_counter()
        utt.early = self.conversation.early.start(text, scored=deliver)
        task = utt.early.turn.task if utt.early is not None else None
        if task is None:
            return None
        await asyncio.wait((scored, task), return_when=asyncio.FIRST_COMPLETED)
        if not scored.done():
            return None
        return detector.judge(text, scored.result(), (time.perf_counter() - start) * 1000)

    async def _finalize(self, utt: Utterance, speech_end: float, eot: float) -> None:
        """The end of the turn: the final transcript becomes the turn (confirming an early reply to it)."""
        p, conv = self.parts, self.conversation
        final = await utt.stream.final()
        now = p.clock.now()
        # a continuation that recognised no words still answers the words it went on from
        text = utt.words(final.text.strip())
        early, utt.early = utt.early, None
        turn = conv.early.confirm(early, text)
        if not text:
            # Heard speech, recognised no words: say so (the host sees it) and keep listening.
            speech_s = max(0.0, speech_end - utt.start_t)
            log.info("turn not answered: no words recognised in %.1f s of speech", speech_s)
            unanswered = "no words recognised"
            p.bus.publish(FinalTranscript(t=now, text="", unanswered=unanswered, speech_s=round(speech_s, 3)))
            return
        if turn is None:
            early = None
            turn = conv.new_turn(text, "voice", "host", announce=False)
        continues = utt.continues.id if utt.continues is not None else None
        turn.user = UserTurn(
            t=now,
            text=text,
            source="voice",
            speaker="host",
            turn_id=turn.id,
            speech_end_t=speech_end,
            continues=continues,
        )
        timings = turn.timings
        timings.speech_end, timings.end_of_turn, timings.asr_final = speech_end, eot, now
        timings.asr = utt.stream.final_cost
        if utt.pause_t:  # the last pause's timeline, also when its judgement came too late to count

            def after(t: float) -> float | None:
                return round((t - speech_end) * 1000, 1) if t else None

            decided = utt.turn_end.to_dict() if utt.turn_end is not None else {"finished": None}
            timings.turn_end = decided | {
                "paused_after_speech_end_ms": after(utt.pause_t),
                "transcribed_after_speech_end_ms": after(utt.transcribed_t),
                "decided_after_speech_end_ms": after(utt.turn_end_t),
                "partial_in_flight": utt.partial_in_flight,
                "llm_warming": utt.llm_warming,
            }
        p.bus.publish(turn.user)
        p.bus.publish(FinalTranscript(t=now, text=text, turn_id=turn.id))
        if early is not None:
            early.release()  # its audio may play from now on
        self._last_turn = turn
        conv.queue(turn)
