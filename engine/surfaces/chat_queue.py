"""Chat → turns: a prioritized, rate-limited, de-duplicated and moderated queue per session.

A busy chat never starves the host:

* host messages skip moderation and go first; the host's *voice* never passes through here at all;
* a chat turn starts only when the session is idle (no turn pending or playing, the host not
  speaking) and ``min_turn_gap_s`` after the last turn ended, one at a time;
* admission is cheap and bounded: blocklist → flood limit (token bucket, all users) → per-user
  cooldown → duplicate window → a bounded heap (a better message evicts the worst when full).

Accepted messages are published on the session bus as :class:`~engine.events.ChatPosted` (the overlay's chat feed);
refused ones are only counted (``stats``), so a flood cannot push captions out of the bus queues.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from engine.config import ChatQueueConfig
from engine.events import (
    ChatPosted,
    Event,
    FinalTranscript,
    SpeechStarted,
    TurnCompleted,
    TurnSource,
    UserTurn,
)
from engine.session.session import Session, SessionClosed
from engine.surfaces.payloads import PRIORITY, ChatIn
from engine.tasks import TaskOwner

log = logging.getLogger(__name__)

MAX_TRACKED = 10_000  # users / texts remembered for cooldown and de-duplication


@dataclass(order=True)
class _Pending:
    priority: int
    seq: int
    received_t: float = field(compare=False)
    message: ChatIn = field(compare=False)


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


class _Bucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens, self.t = float(burst), float("-inf")

    def take(self, now: float) -> bool:
        if self.t != float("-inf"):
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class ChatQueue:
    def __init__(self, session: Session, config: ChatQueueConfig) -> None:
        self.session = session
        self.config = config
        self.clock = session.clock
        self.stats: Counter[str] = Counter()
        self._heap: list[_Pending] = []
        self._seq = itertools.count()
        self._bucket = _Bucket(config.flood_rate_per_s, config.flood_burst)
        self._last_by_user: OrderedDict[str, float] = OrderedDict()
        self._recent_texts: OrderedDict[str, float] = OrderedDict()
        self._blocked_users = {u.lower() for u in config.blocklist_users}
        self._blocked_words = [w.lower() for w in config.blocklist_words if w.strip()]
        self._wake = asyncio.Event()
        self._pending_turns = 0  # turns announced (user_turn) and not yet completed
        self._host_speaking_since: float | None = None
        self._last_turn_end = float("-inf")
        self._owner = TaskOwner(f"chat-{session.id}")
        session.bus.add_observer(self._on_event)
        self._owner.spawn(self._feed(), "feed")

    # ---- admission (cheap, on the loop) ------------------------------------------------------

    def offer(self, msg: ChatIn) -> str:
        """Admit or refuse one message; returns 'accepted' or why it was refused."""
        verdict = self._judge(msg)
        self.stats[verdict] += 1
        if verdict == "accepted":
            self.session.bus.publish(
                ChatPosted(
                    t=self.clock.now(),
                    user=msg.user,
                    text=msg.text,
                    role=msg.role,
                    platform=msg.platform,
                    id=msg.id,
                )
            )
            self._wake.set()
        return verdict

    def _judge(self, msg: ChatIn) -> str:
        now = self.clock.now()
        if msg.role != "host":
            if msg.user.lower() in self._blocked_users:
                return "blocked"
            lowered = msg.text.lower()
            if any(w in lowered for w in self._blocked_words):
                return "blocked"
            if len(msg.text) > self.config.max_chars:
                return "too_long"
            if not self._bucket.take(now):
                return "flood"
            user = msg.user.lower()
            last = self._last_by_user.get(user)
            if last is not None and now - last < self.config.user_cooldown_s:
                return "cooldown"
            key = msg.id or _normalize(msg.text)
            seen = self._recent_texts.get(key) or self._recent_texts.get(_normalize(msg.text))
            if seen is not None and now - seen < self.config.duplicate_window_s:
                return "duplicate"
        item = _Pending(PRIORITY[msg.role], next(self._seq), now, msg)
        if len(self._heap) >= self.config.max_pending:
            worst = max(self._heap)
            if worst < item:
                return "queue_full"
            self._heap.remove(worst)
            heapq.heapify(self._heap)
            self.stats["evicted"] += 1
        heapq.heappush(self._heap, item)
        if msg.role != "host":
            self._remember(self._last_by_user, msg.user.lower(), now)
            self._remember(self._recent_texts, _normalize(msg.text), now)
            if msg.id:
                self._remember(self._recent_texts, msg.id, now)
        return "accepted"

    @staticmethod
    def _remember(d: OrderedDict[str, float], key: str, now: float) -> None:
        d[key] = now
        d.move_to_end(key)
        while len(d) > MAX_TRACKED:
            d.popitem(last=False)

    @property
    def pending(self) -> int:
        return len(self._heap)

    # ---- session state (bus observer, on the loop) --------------------------------------------

    def _on_event(self, ev: Event) -> None:
        if isinstance(ev, UserTurn):
            self._pending_turns += 1
            if ev.source == "voice":
                self._host_speaking_since = None
        elif isinstance(ev, TurnCompleted):
            self._pending_turns = max(0, self._pending_turns - 1)
            self._last_turn_end = self.clock.now()
            self._wake.set()
        elif isinstance(ev, SpeechStarted):
            self._host_speaking_since = self.clock.now()
        elif isinstance(ev, FinalTranscript):
            self._host_speaking_since = None
            self._last_turn_end = self.clock.now()
            self._wake.set()

    def _idle_in(self) -> float | None:
        """Seconds until a chat turn may start (0: now), or None while the session is busy."""
        now = self.clock.now()
        if self._host_speaking_since is not None:
            if now - self._host_speaking_since < self.config.host_hold_s:
                return None
            self._host_speaking_since = None  # speech that never finished: stop holding chat
        if self._pending_turns > 0:
            return None
        return max(0.0, self._last_turn_end + self.config.min_turn_gap_s - now)

    # ---- feeding turns -------------------------------------------------------------------------

    async def _feed(self) -> None:
        while True:
            item = self._next_ready()
            if item is None:
                self._wake.clear()
                wait = self._idle_in() if self._heap else None
                try:
                    await asyncio.wait_for(self._wake.wait(), wait if wait else 1.0)
                except TimeoutError:
                    pass
                continue
            msg = item.message
            source: TurnSource = "host_text" if msg.role == "host" else "chat"
            speaker = "host" if msg.role == "host" else msg.user
            try:
                await self.session.submit_text(msg.text, speaker=speaker, source=source)
                self.stats["turns"] += 1
            except SessionClosed:
                return
            except (asyncio.QueueFull, ValueError) as e:
                self.stats["submit_failed"] += 1
                log.warning("session %s: chat turn not submitted: %s", self.session.id, type(e).__name__)
            # the user_turn event has been counted by now: the next chat waits for this turn to finish

    def _next_ready(self) -> _Pending | None:
        if not self._heap:
            return None
        now = self.clock.now()
        while (
            self._heap
            and self._heap[0].priority > 0
            and now - self._heap[0].received_t > self.config.max_age_s
        ):
            heapq.heappop(self._heap)
            self.stats["expired"] += 1
        if not self._heap:
            return None
        if self._heap[0].priority == 0:  # the host goes first and does not wait for idle
            return heapq.heappop(self._heap)
        ready = self._idle_in()
        if ready is None or ready > 0:
            return None
        return heapq.heappop(self._heap)

    async def close(self) -> None:
        self.session.bus.remove_observer(self._on_event)
        await self._owner.cancel_all()
