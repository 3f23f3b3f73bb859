"""Fact extraction from a finished turn: rule-based by default, any extractor behind a protocol.

The rules read plain first-person statements from the speaker ("my name is X", "I'm from Z",
"I like Y", "my favourite W is V", "I work as…", "I have a dog named…", "I'm N years old",
"my birthday is…") and a few first-person statements from her own heard reply ("my favourite
W is V", "I love Y"). Every fact carries a *slot* (``home``, ``favourite:food``,
``opinion:cats``…): a new fact in an occupied slot with a different value contradicts the old
one. Chat flagged as an injection attempt yields no facts, and facts are only ever about the
speaker (a viewer cannot write facts about her or about someone else).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from engine.events import UserTurn
from persona.card import PersonaCard
from persona.sanitize import clean_username, is_injection, normalize_text


@dataclass(frozen=True, slots=True)
class Fact:
    kind: str  # 'viewer_fact' | 'self_fact' | 'stream_event'
    subject: str
    text: str
    slot: str | None = None
    importance: float = 0.5


class FactExtractor(Protocol):
    def extract(self, turn: UserTurn, reply: str, card: PersonaCard) -> list[Fact]: ...


_VALUE = r"([\w][\w .'&-]{0,60})"
_STOP_AT = re.compile(
    r"\s+(?:and|but|because|so|though|although|since|when|if|which|who|too|lol|haha)\b.*$", re.I
)
_PRONOUNS = frozenset(
    [
        "it",
        "that",
        "this",
        "them",
        "you",
        "him",
        "her",
        "those",
        "these",
        "everything",
        "anything",
        "something",
        "one",
    ]
)
_BAD_VALUE = re.compile(r"\b(?:system|assistant|instructions?|prompt|ignore|aiko)\b", re.I)

_RULES: list[tuple[re.Pattern[str], str, str, float]] = [
    # (pattern, slot template, text template, importance); {0} = value 1, {1} = value 2
    (
        re.compile(r"\b(?:my name is|call me|i'm called|i am called)\s+([A-Za-z][\w'-]{0,30})", re.I),
        "name",
        "{who}'s name is {0}",
        0.8,
    ),
    (re.compile(rf"\bi(?: am|'m) from\s+(?:the\s+)?{_VALUE}", re.I), "home", "{who} is from {0}", 0.6),
    (re.compile(rf"\bi live in\s+(?:the\s+)?{_VALUE}", re.I), "home", "{who} lives in {0}", 0.6),
    (
        re.compile(rf"\bmy fav(?:ou?rite|e)\s+([\w][\w '-]{{0,30}}?)\s+(?:is|are)\s+{_VALUE}", re.I),
        "favourite:{0}",
        "{who}'s favourite {0} is {1}",
        0.6,
    ),
    (
        re.compile(rf"\bi (?:really |absolutely |totally |just )?(?:like|love|enjoy|adore)\s+{_VALUE}", re.I),
        "opinion:{0}",
        "{who} likes {0}",
        0.5,
    ),
    (
        re.compile(
            rf"\bi (?:really )?(?:hate|dislike|can't stand|cannot stand|don't like|do not like)\s+{_VALUE}",
            re.I,
        ),
        "opinion:{0}",
        "{who} dislikes {0}",
        0.5,
    ),
    (re.compile(r"\bi(?: am|'m) (\d{1,3}) (?:years old|yo)\b", re.I), "age", "{who} is {0} years old", 0.5),
    (re.compile(rf"\b(?:i work as|my job is)\s+(?:an?\s+)?{_VALUE}", re.I), "job", "{who} works as {0}", 0.6),
    (re.compile(rf"\bmy birthday is\s+(?:on\s+)?{_VALUE}", re.I), "birthday", "{who}'s birthday is {0}", 0.7),
    (
        re.compile(r"\bi have an? (\w+) (?:named|called)\s+([A-Za-z][\w'-]{0,30})", re.I),
        "pet:{0}",
        "{who} has a {0} named {1}",
        0.6,
    ),
]
_SELF_RULES = [r for r in _RULES if r[1].startswith(("favourite", "opinion"))]
_EVENT = re.compile(
    r"\b(?:today|tonight) we(?:'re| are| will)\s+(.{3,80})|\bwe (?:just )?(?:hit|reached)\s+(.{3,60})", re.I
)


def _clean_value(v: str) -> str:
    v = _STOP_AT.sub("", v.strip())
    v = re.sub(r"[\s.,!?;:'-]+$", "", v)
    return " ".join(v.split()[:6])


def _clauses(text: str) -> list[str]:
    return [c for c in re.split(r"[.!?;\n]+|,\s*(?:but|and)\s+", text) if c.strip()]


class RuleFactExtractor:
    """Honest, predictable, cheap (µs); misses what it has no rule for."""

    def _apply(
        self,
        rules: list[tuple[re.Pattern[str], str, str, float]],
        text: str,
        who: str,
        kind: str,
        subject: str,
    ) -> list[Fact]:
        facts: list[Fact] = []
        for clause in _clauses(text):
            for pattern, slot_t, text_t, importance in rules:
                for m in pattern.finditer(clause):
                    values = [_clean_value(g) for g in m.groups()]
                    if not all(values) or _BAD_VALUE.search(" ".join(values)):
                        continue
                    if slot_t.startswith("opinion") and values[0].split()[0].lower() in _PRONOUNS:
                        continue
                    if slot_t.startswith("opinion") and values[0].split()[0].lower() in ("to", "when", "how"):
                        continue
                    slot = slot_t.format(*(v.lower() for v in values))
                    facts.append(Fact(kind, subject, text_t.format(*values, who=who), slot, importance))
        return facts

    def extract(self, turn: UserTurn, reply: str, card: PersonaCard) -> list[Fact]:
        text = normalize_text(turn.text)
        facts: list[Fact] = []
        if turn.source == "chat":
            if is_injection(text):
                return []
            user = clean_username(turn.speaker).lower()
            facts += self._apply(_RULES, text, user, "viewer_fact", user)
        else:
            facts += self._apply(_RULES, text, "the host", "viewer_fact", "host")
            for clause in _clauses(text):
                if _EVENT.search(clause):
                    facts.append(
                        Fact("stream_event", "stream", f"The host said: {clause.strip()[:120]}", None, 0.6)
                    )
        if reply.strip():
            facts += self._apply(_SELF_RULES, normalize_text(reply), card.name, "self_fact", card.id)
        # one fact per slot (the last statement wins within a turn)
        by_slot: dict[tuple[str, str | None], Fact] = {}
        for f in facts:
            by_slot[(f.subject, f.slot or f.text)] = f
        return list(by_slot.values())
