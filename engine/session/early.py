"""Early replies: started on the speculative transcript while the host pauses, confirmed at the end of the turn.

An early reply's audio waits behind its ``gate`` and its events wait in ``held`` until the end of the
turn confirms the transcript; speech coming back, a changed transcript, a text turn or an interrupt
cancels it, and nobody ever sees it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from engine.events import TurnSource
from engine.session.turn import Turn

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class EarlyReply:
    turn: Turn
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    held: list[Callable[[], None]] = field(default_factory=list)
    # given the LLM's end-of-turn probability after the host's words, from the reply's own prefill
    scored: Callable[[float], None] | None = None

    def later(self, deliver: Callable[[T], None]) -> Callable[[T], None]:
        """``deliver`` now if the turn is confirmed, else when it is (never, if the reply is dropped)."""

        def deferred(item: T) -> None:
            if self.gate.is_set():
                deliver(item)
            else:
                self.held.append(lambda: deliver(item))

        return deferred

    def release(self) -> None:
        """The turn is confirmed: what was held goes out, the audio may play."""
        self.gate.set()
        for action in self.held:
            action()
        self.held.clear()


class Replier(Protocol):
    """What early replies need from the conversation."""

    def speaking(self) -> bool: ...

    def busy(self) -> bool: ...

    def new_turn(self, text: str, source: TurnSource, speaker: str, *, announce: bool = True) -> Turn: ...

    def spawn_reply(self, turn: Turn, early: EarlyReply | None = None) -> asyncio.Task[None]: ...

    def drop(self, turn: Turn) -> None: ...


class EarlyReplies:
    """At most one early reply at a time, and how many started, were confirmed and were cancelled."""

    def __init__(self, replier: Replier, enabled: Callable[[], bool]) -> None:
        self._replier = replier
        self._enabled = enabled
        self.pending: EarlyReply | None = None  # started on a pause, not yet confirmed
        self.counts = {"started": 0, "confirmed": 0, "cancelled": 0}

    def start(self, text: str, scored: Callable[[float], None] | None = None) -> EarlyReply | None:
        """The host paused and the speculative transcript is ``text``: start replying now, silently
        (``scored``: see ``EarlyReply.scored``)."""
        r = self._replier
        if not self._enabled() or self.pending is not None or r.speaking() or r.busy():
            return None
        turn = r.new_turn(text, "voice", "host", announce=False)
        turn.timings.early_reply = True
        early = self.pending = EarlyReply(turn, scored=scored)
        turn.task = r.spawn_reply(turn, early)
        self.counts["started"] += 1
        return early

    def cancel(self, reason: str) -> None:
        early, self.pending = self.pending, None
        if early is None or early.turn.task is None:
            return
        log.debug("early reply to %r cancelled: %s", early.turn.user.text, reason)
        self.counts["cancelled"] += 1
        early.held.clear()
        early.turn.task.cancel()
        self._replier.drop(early.turn)

    def confirm(self, early: EarlyReply | None, text: str) -> Turn | None:
        """The end of the turn heard ``text``: the early reply's turn if it answers exactly that, else None
        (and the early reply is cancelled)."""
        if early is None:
            return None
        if early is not self.pending or early.turn.user.text != text:
            self.cancel("transcript changed")
            return None
        self.pending = None
        self.counts["confirmed"] += 1
        return early.turn
