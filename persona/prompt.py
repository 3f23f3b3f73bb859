"""``PersonaPromptProvider``: the engine's PromptProvider backed by the persona memory bank.

Prompt layout (KV-cache friendly: the LLM can keep everything up to the last message):

1. system: the card's persona prefix, identical every turn;
2. the rolling history of heard exchanges: appended to after each turn; consolidation drops its
   oldest half (they become an episodic summary, stored in the bank) and nothing else changes, so
   a runtime that moves cached tokens (llama.cpp) keeps the rest of the history evaluated;
3. the current turn, last: the newest summary ("Earlier in this stream: …") on the first turn after a
   consolidation (it then stays with that exchange in the history, until that exchange is itself
   consolidated; summaries in the system message would change the prompt's start), a short block of
   retrieved memory notes, then the speaker's message (chat wrapped as inert ``<chat user=…>`` data).

Everything stays within ``token_budget`` by construction: fixed shares for the notes, the
summaries and the current turn, the rest for history (newest first). Retrieval runs in a
worker thread with a deadline; write-back (facts, profiles, episodes) is queued to one owned
background task and never touches the hot path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.events import UserTurn
from engine.llm.base import ChatMessage
from engine.tasks import TaskOwner, cancel_and_wait
from persona.bank import MemoryBank
from persona.card import PersonaCard, load_card
from persona.facts import Fact, FactExtractor, RuleFactExtractor
from persona.guard import ConsistencyGuard
from persona.retrieval import Scored
from persona.sanitize import clean_username, is_injection, neutralize, normalize_text, wrap_chat
from persona.store import Conn
from persona.tokens import MESSAGE_OVERHEAD, TokenCounter, approx_tokens, truncate_to_tokens
from persona.writeback import Exchange, ExtractiveSummarizer, Summarizer, apply_facts, store_episode

log = logging.getLogger(__name__)


@dataclass
class ProviderSettings:
    token_budget: int = 1536
    prompt_style: str = "full"  # "compact" for small models (see PersonaCard.system_prompt)
    memories_per_turn: int = 5
    min_similarity: float = (
        0.35  # weaker matches are noise: the prompt stays the same (and its KV cache valid)
    )
    memory_share: float = 0.12  # of the budget, for retrieved notes
    summary_share: float = 0.10  # for the episodic summaries a turn carries after a consolidation
    turn_share: float = 0.20  # for the current message (longer chat is cut)
    consolidate_at: float = 0.8  # of the history share: then the oldest half becomes a summary
    max_summaries: int = 3
    max_history: int = 200  # hard cap on exchanges kept in RAM
    retrieval_deadline_s: float = 0.25  # past it the turn goes on without memories
    writeback_queue: int = 256
    close_timeout_s: float = 5.0


class PersonaPromptProvider:
    def __init__(
        self,
        card: PersonaCard,
        bank: MemoryBank,
        *,
        token_counter: TokenCounter | None = None,
        settings: ProviderSettings | None = None,
        extractor: FactExtractor | None = None,
        summarizer: Summarizer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or ProviderSettings()
        self.count: TokenCounter = token_counter or approx_tokens
        self.bank = bank
        self.extractor = extractor or RuleFactExtractor()
        self.summarizer = summarizer or ExtractiveSummarizer()
        self.clock = clock
        self._tasks = TaskOwner("persona")
        self._queue: asyncio.Queue[tuple[str, Any]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.stats: dict[str, float] = {
            "turns": 0,
            "writeback_jobs": 0,
            "writeback_dropped": 0,
            "retrieval_timeouts": 0,
            "last_retrieval_ms": 0.0,
        }
        self.last_memories: list[Scored] = []
        self._set_card(card)

    @classmethod
    def from_config(
        cls, cfg: Any, token_counter: TokenCounter | None = None, embedder: Any = None, **kw: Any
    ) -> PersonaPromptProvider:
        """Build from ``engine.config.PersonaConfig`` (blocking: loads the card, the embedding
        model and the vector index; call it at startup, or in a thread)."""
        from persona.embed import MiniLMEmbedder

        card = load_card(cfg.card)
        emb = embedder or MiniLMEmbedder()
        if getattr(cfg, "memory_backend", "sqlite") == "postgres":
            bank = MemoryBank.open_postgres(cfg.memory_dsn, emb, card.id)
        else:
            bank = MemoryBank.open(cfg.memory_db, emb, card.id)
        settings = ProviderSettings(
            token_budget=cfg.token_budget,
            memories_per_turn=cfg.memories_per_turn,
            min_similarity=getattr(cfg, "min_similarity", 0.35),
            prompt_style=getattr(cfg, "prompt_style", "full"),
        )
        return cls(card, bank, token_counter=token_counter, settings=settings, **kw)

    def _set_card(self, card: PersonaCard) -> None:
        s = self.settings
        self.card = card
        self.prefix = card.system_prompt(s.prompt_style)
        self._guard = ConsistencyGuard(card)
        self.history: deque[Exchange] = deque(maxlen=s.max_history)
        self.summaries: deque[str] = deque(maxlen=s.max_summaries)
        self._earlier = ""  # the summaries the next recorded turn carries (empty: none since it was told)
        budget = s.token_budget
        self._memory_budget = int(budget * s.memory_share)
        self._summary_budget = int(budget * s.summary_share)
        self._turn_budget = int(budget * s.turn_share)
        fixed = self.count(self.prefix) + 3 * MESSAGE_OVERHEAD
        self._history_budget = budget - fixed - self._memory_budget - self._summary_budget - self._turn_budget
        if self._history_budget < budget * 0.1:
            raise ValueError(
                f"persona card {card.id!r}: its system prompt takes {fixed} of {budget} tokens, leaving too "
                "little for the conversation: shorten the card or raise persona.token_budget"
            )

    # ---- the hot path -------------------------------------------------------------------

    def _speaker(self, turn: UserTurn) -> str:
        return clean_username(turn.speaker).lower() if turn.source == "chat" else "host"

    def _format_turn(self, turn: UserTurn) -> str:
        if turn.source == "chat":
            text = wrap_chat(turn.speaker, turn.text)
        elif self.settings.prompt_style == "compact":  # small models copy labels into their replies
            text = neutralize(turn.text)[0]
        else:
            label = "Host (voice)" if turn.source == "voice" else "Host"
            text = f"{label}: {neutralize(turn.text)[0]}"
        return truncate_to_tokens(text, self._turn_budget - MESSAGE_OVERHEAD, self.count)

    def _retrieve(self, query: str, speaker: str) -> tuple[list[Scored], str]:
        k = self.settings.memories_per_turn
        found = self.bank.search(query, k=k, speaker=speaker) if k and query else []
        # What a viewer told about themselves stays in; other memories must match the turn.
        floor = self.settings.min_similarity
        found = [s for s in found if s.similarity >= floor or s.memory.subject == speaker != "host"]
        profile = self.bank.store.profile(self.card.id, speaker) if speaker != "host" else None
        who = ""
        if profile is not None and profile.turns > 0:
            name = f" (goes by {profile.display_name})" if profile.display_name else ""
            who = f"{speaker}{name} is a returning viewer ({profile.turns} messages before)."
        return found, who

    def _notes(self, found: list[Scored], who: str) -> str:
        if self.settings.prompt_style == "compact":
            # A small model parrots long notes: only the two best facts, no stream summaries.
            facts = [normalize_text(s.memory.text) for s in found if s.memory.kind != "episode"][:2]
            if not facts:
                return ""
            return truncate_to_tokens(
                "You remember: " + " ".join(f if f.endswith(".") else f + "." for f in facts),
                self._memory_budget,
                self.count,
            )
        lines = [who] if who else []
        lines += [normalize_text(s.memory.text) for s in found]
        if not lines:
            return ""
        notes = (
            "(Memory notes for you; nobody said this now: "
            + " ".join(line if line.endswith(".") else line + "." for line in lines)
            + ")"
        )
        return truncate_to_tokens(notes, self._memory_budget, self.count)

    def _earlier_text(self) -> str:
        if not self.summaries:
            return ""
        text = "(Earlier in this stream: " + " ".join(self.summaries) + ")"
        return truncate_to_tokens(text, self._summary_budget, self.count)

    async def build_prompt(self, turn: UserTurn) -> list[ChatMessage]:
        self._guard.reset()
        current = self._format_turn(turn)
        found: list[Scored] = []
        who = ""
        t0 = time.perf_counter()
        try:
            query = " ".join(normalize_text(turn.text).split()[:64])
            found, who = await asyncio.wait_for(
                asyncio.to_thread(self._retrieve, query, self._speaker(turn)),
                self.settings.retrieval_deadline_s,
            )
        except TimeoutError:
            self.stats["retrieval_timeouts"] += 1
            log.warning(
                "memory retrieval missed its %.0f ms deadline", self.settings.retrieval_deadline_s * 1e3
            )
        except Exception as e:  # memory is an enhancement: a broken bank must not break the turn
            log.error("memory retrieval failed: %r", e)
        self.stats["last_retrieval_ms"] = (time.perf_counter() - t0) * 1e3
        self.last_memories = found
        notes = self._notes(found, who)
        last = "\n\n".join(part for part in (self._earlier, notes, current) if part)
        return [*self._prefix(self.count(last)), {"role": "user", "content": last}]

    def next_prefix(self) -> list[ChatMessage]:
        # as build_prompt will make it for a short turn without notes (long notes push out old history)
        return self._prefix(self._turn_budget // 4)

    def _prefix(self, last_tokens: int) -> list[ChatMessage]:
        """The system message and as much history (newest first) as fits beside a last message this long."""
        system = self.prefix
        used = self.count(system) + last_tokens + 2 * MESSAGE_OVERHEAD
        room = self.settings.token_budget - used
        pairs: list[ChatMessage] = []
        for ex in reversed(self.history):
            cost = ex.tokens + 2 * MESSAGE_OVERHEAD
            if cost > room:
                break
            room -= cost
            pairs[:0] = [{"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.reply}]
        return [{"role": "system", "content": system}, *pairs]

    def guard(self, text: str) -> str | None:
        return self._guard.check(text)

    # ---- after the turn -----------------------------------------------------------------

    async def record_turn(self, turn: UserTurn, played_reply: str, interrupted: bool) -> None:
        self.stats["turns"] += 1
        now = self.clock()
        speaker = self._speaker(turn)
        reply = " ".join(played_reply.split())
        if reply:
            earlier, self._earlier = self._earlier, ""
            user = "\n\n".join(part for part in (earlier, self._format_turn(turn)) if part)
            tokens = self.count(user) + self.count(reply)
            self.history.append(
                Exchange(speaker, user, reply, normalize_text(turn.text), now, tokens, earlier)
            )
        # (a summary an exchange carries is the summaries' share of the budget, not the history's)
        held = sum(
            e.tokens + 2 * MESSAGE_OVERHEAD - (self.count(e.earlier) if e.earlier else 0)
            for e in self.history
        )
        if held > self._history_budget * self.settings.consolidate_at:
            old = [self.history.popleft() for _ in range(max(1, len(self.history) // 2))]
            summary = self.summarizer.summarize(old)
            self.summaries.append(summary)
            self._earlier = self._earlier_text()  # the next turn tells it (the history's start is gone)
            self._enqueue("episode", (old, summary))
        self._enqueue("turn", (turn, reply, speaker, now))

    def _enqueue(self, kind: str, payload: Any) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue(self.settings.writeback_queue)
            self._worker = self._tasks.spawn(self._write_loop(), "writeback")
        if self._queue.full():
            self._queue.get_nowait()
            self._queue.task_done()
            self.stats["writeback_dropped"] += 1
            log.warning("persona write-back is behind: dropped the oldest job")
        self._queue.put_nowait((kind, payload))

    async def _write_loop(self) -> None:
        assert self._queue is not None
        while True:
            kind, payload = await self._queue.get()
            try:
                await asyncio.to_thread(self._write_job, kind, payload)
                self.stats["writeback_jobs"] += 1
            except Exception as e:
                log.error("persona write-back (%s) failed: %r", kind, e)
            finally:
                self._queue.task_done()

    def _write_job(self, kind: str, payload: Any) -> None:
        if kind == "episode":
            old, summary = payload
            store_episode(self.bank, old, summary)
            return
        turn, reply, speaker, now = payload
        facts = [f for f in self.extractor.extract(turn, reply, self.card) if self._own_fact_ok(turn, f)]
        profile = None
        if speaker != "host":
            names = [f.text.split(" is ", 1)[-1] for f in facts if f.slot == "name" and f.subject == speaker]
            display = names[-1] if names else None

            def profile(conn: Conn) -> None:
                self.bank.store.touch_profile(conn, self.card.id, speaker, display, now)

        apply_facts(self.bank, facts, now, also=profile)  # one transaction, one commit per turn

    def _own_fact_ok(self, turn: UserTurn, fact: Fact) -> bool:
        """A fact about herself is kept only if she could say it as herself, and never from a turn
        that tried to change who she is (a hostile or out-of-character line is not her memory)."""
        if fact.kind != "self_fact":
            return True
        if is_injection(turn.text):
            return False
        first_person = re.sub(rf"^{re.escape(self.card.name)}\b", "I", fact.text)
        return self._guard.consistent(first_person)

    async def flush(self) -> None:
        """Wait until every queued write-back is done (bound it with ``asyncio.timeout``)."""
        if self._queue is not None:
            await self._queue.join()

    # ---- control ------------------------------------------------------------------------

    async def switch_persona(self, card: PersonaCard | str) -> None:
        """Become another persona live: new prefix, guard and memories; the conversation restarts."""
        new = load_card(card) if isinstance(card, str) else card
        async with asyncio.timeout(self.settings.close_timeout_s):
            await self.flush()
        await asyncio.to_thread(self.bank.switch_persona, new.id)
        self._set_card(new)

    async def forget_viewer(self, username: str) -> dict[str, object]:
        async with asyncio.timeout(self.settings.close_timeout_s):
            await self.flush()
        report = await asyncio.to_thread(self.bank.forget_viewer, username)
        user = str(report["username"])
        self.summaries = deque(
            (s for s in self.summaries if user not in s.lower()), maxlen=self.settings.max_summaries
        )
        kept = (e for e in self.history if e.speaker != user and user not in e.raw.lower())
        self.history = deque(
            (self._without_earlier(e) if user in e.earlier.lower() else e for e in kept),
            maxlen=self.settings.max_history,
        )
        if user in self._earlier.lower():
            self._earlier = self._earlier_text()
        return report

    def _without_earlier(self, e: Exchange) -> Exchange:
        """The exchange without the summary its turn carried (a forgotten viewer is in it)."""
        user = e.user.removeprefix(e.earlier).removeprefix("\n\n")
        return dataclasses.replace(e, user=user, earlier="", tokens=self.count(user) + self.count(e.reply))

    async def close(self) -> None:
        """Finish queued write-back (up to ``close_timeout_s``), cancel the worker, save the
        vector index and close the database."""
        try:
            async with asyncio.timeout(self.settings.close_timeout_s):
                await self.flush()
        except TimeoutError:
            log.warning(
                "persona write-back did not finish within %.1fs; pending jobs dropped",
                self.settings.close_timeout_s,
            )
        await cancel_and_wait(self._worker, self.settings.close_timeout_s)
        await self._tasks.cancel_all(self.settings.close_timeout_s)
        self._worker, self._queue = None, None
        await asyncio.to_thread(self.bank.close)
