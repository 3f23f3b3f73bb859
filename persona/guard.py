"""The consistency guard: every reply chunk is checked before TTS.

Checks, in order, per sentence of the chunk (regular expressions: microseconds per chunk):

* **identity**: the model calling itself an AI/language model/assistant, naming a vendor or
  another model as itself, denying its name, claiming another name, obeying an injected
  "new identity" or "developer mode", or reciting its instructions. Name claims are
  *rewritten* to her name; other breaks are *dropped* and, once per reply, replaced by one of
  the card's in-character ``deflections``.
* **taboos**: the card's taboo phrases (whole words) and patterns: the sentence is dropped.
* **style**: markdown, emoji and ``*stage directions*`` are rewritten out (per the card's
  style rules); over-long chunks are cut at a word.

Streaming-aware: the guard keeps the tail of the reply so far, so a violation split across
two chunks ("…I am an" | "AI language model") is caught on the second one (which is dropped:
the first already went to TTS). State is reset at each new reply (:meth:`reset`). A chunk
that needs no change is returned as the very same string.
"""

from __future__ import annotations

import itertools
import re

from persona.card import PersonaCard
from persona.sanitize import normalize_text

_VENDORS = (
    r"chat ?gpt|gpt-?\d\w*|openai|open ai|anthropic|claude|gemini|bard|llama|qwen|smollm|mistral|"
    r"hugging ?face|copilot|deepseek|alibaba|google|meta ai|microsoft"
)
_SELF = r"(?:i am|i'm|im|i was|as|this is|being)"
_ADV = r"(?:just |only |merely |really |actually |simply |basically |still )?"
_IDENTITY = re.compile(
    rf"\b{_SELF} {_ADV}(?:an? |the )?(?:ai|a\.i\.|artificial intelligence|(?:large )?language model|llm|"
    r"chat ?bot|(?:virtual |ai |digital )?assistant|computer program|neural network|bot|machine learning model)\b"
    rf"|\b{_SELF} {_ADV}(?:an? )?(?:model |assistant |product )?(?:from |by |of )?(?:{_VENDORS})\b"
    rf"|\b(?:created|made|trained|developed|built|programmed|designed) by (?:{_VENDORS})\b"
    r"|\bmy (?:creators|developers|programmers|training data|training|model weights|knowledge cutoff)\b"
    r"|\bi (?:do not|don't|dont) have (?:personal |real |any )?(?:feelings|emotions|a body|consciousness|"
    r"opinions|personal (?:experiences|opinions|preferences))\b"
    r"|\b(?:i am|i'm|im) (?:now|no longer)\b|\bfrom now on,? i\b|\bmy new (?:name|identity|persona)\b"
    r"|\b(?:i am|i'm|im|as) dan\b|\bdo anything now\b|\b(?:developer|dev|god|jailbreak|unfiltered|"
    r"unrestricted|evil|dan) mode\b|\bjailbr(?:eak|oken)\b"
    r"|\b(?:ignor|disregard|forgett?|overrid|bypass)(?:e|es|ed|ing)? (?:all |my |your |the |previous |prior |of )*"
    r"(?:instructions|rules|guidelines|programming|system prompt|directives|restrictions)\b"
    r"|\bi have no (?:rules|restrictions|filters|guidelines|limits)\b"
    r"|\b(?:my|the) (?:system prompt|(?:hidden |initial |original |secret )?instructions (?:say|tell|are))\b",
    re.I,
)
_NAME_CLAIM = re.compile(
    r"\b(?:my name is|my name's|call me|i am called|i'm called|you can call me|they call me)\s+"
    r"([A-Za-z][\w'-]*)",
    re.I,
)
_I_AM_NAME = re.compile(r"\b(?:I am|I'm|Im|This is)\s+([A-Z][a-z]+)\b")
_NOT_NAMES = frozenset(
    [
        "so",
        "sorry",
        "here",
        "back",
        "ready",
        "fine",
        "good",
        "okay",
        "ok",
        "just",
        "not",
        "also",
        "really",
        "always",
        "still",
        "very",
        "totally",
        "super",
        "happy",
        "glad",
        "excited",
        "japanese",
        "english",
        "american",
        "canadian",
        "british",
        "korean",
        "chinese",
        "french",
        "german",
        "your",
        "the",
        "a",
        "an",
        "in",
        "on",
        "at",
        "from",
        "with",
        "no",
        "yes",
    ]
)
_EMOJI = re.compile(
    "[\U0001f000-\U0001faff\U00002600-\U000027bf\U0001f900-\U0001f9ff\u2b50\u2b55\u2764\ufe0f\u200d]+"
)
_STAGE = re.compile(
    r"\*[^*\n]{1,60}\*|(?<!\w)_[^_\n]{1,60}_(?!\w)|\((?:giggles|laughs|sighs|winks|smiles)[^)]*\)", re.I
)
_MARKDOWN = re.compile(r"\*\*|__|`+|^#{1,6}\s+|^\s*[-*+]\s+|\[([^\]]+)\]\([^)]+\)", re.M)
_SENTENCE = re.compile(r"(?<=[.!?…])\s+")


class ConsistencyGuard:
    def __init__(self, card: PersonaCard, tail_chars: int = 80) -> None:
        self.card = card
        self.tail_chars = tail_chars
        self._names = {n.lower() for n in card.all_names}
        self._not_me = re.compile(
            r"\b(?:i am|i'm|im) not (?:" + "|".join(re.escape(n) for n in card.all_names) + r")\b"
            r"|\b(?:" + "|".join(re.escape(n) for n in card.all_names) + r") (?:is not|isn't) (?:my|me)\b",
            re.I,
        )
        taboo_parts = [re.escape(p) for t in card.taboos for p in t.phrases]
        self._taboo_phrases = (
            re.compile(r"(?<!\w)(?:" + "|".join(taboo_parts) + r")(?!\w)", re.I) if taboo_parts else None
        )
        self._taboo_patterns = [re.compile(p, re.I) for t in card.taboos for p in t.patterns]
        self._deflections = itertools.cycle(card.deflections)
        self.stats = {"checked": 0, "rewritten": 0, "dropped": 0, "deflected": 0}
        self.reset()

    def reset(self) -> None:
        """A new reply starts."""
        self._tail = ""
        self._deflected = False

    # ---- checks -----------------------------------------------------------------------

    def _identity_break(self, text: str) -> bool:
        return bool(_IDENTITY.search(text) or self._not_me.search(text))

    def _taboo(self, text: str) -> bool:
        if self._taboo_phrases is not None and self._taboo_phrases.search(text):
            return True
        return any(p.search(text) for p in self._taboo_patterns)

    def _fix_names(self, sentence: str) -> str:
        def repl(m: re.Match[str]) -> str:
            name = m.group(1)
            if name.lower() in self._names or name.lower() in _NOT_NAMES:
                return m.group(0)
            return m.group(0)[: m.start(1) - m.start(0)] + self.card.name

        return _I_AM_NAME.sub(repl, _NAME_CLAIM.sub(repl, sentence))

    def _style(self, text: str) -> str:
        style = self.card.style
        if not style.allow_markdown:
            text = _MARKDOWN.sub(lambda m: m.group(1) or "", text)
        if not style.allow_stage_directions:
            text = _STAGE.sub("", text)
        if not style.allow_emoji:
            text = _EMOJI.sub("", text)
        text = re.sub(r"[ \t]{2,}", " ", text).strip()
        if len(text) > style.max_chunk_chars:
            text = text[: style.max_chunk_chars].rsplit(" ", 1)[0]
        return text

    # ---- the seam ---------------------------------------------------------------------

    def check(self, text: str) -> str | None:
        """The chunk to speak (possibly repaired), or None to drop it."""
        self.stats["checked"] += 1
        if not text.strip():
            return text
        norm = normalize_text(text)
        sentences = _SENTENCE.split(norm)
        kept: list[str] = []
        for i, sentence in enumerate(sentences):
            probe = sentence
            if i == 0 and self._tail:
                joined = f"{self._tail} {sentence}"
                new_break = self._identity_break(joined) and not self._identity_break(self._tail)
                if new_break or (self._taboo(joined) and not self._taboo(self._tail)):
                    probe = joined
            if self._identity_break(probe):
                if not self._deflected:
                    kept.append(next(self._deflections))
                    self._deflected = True
                    self.stats["deflected"] += 1
                continue
            if self._taboo(probe):
                continue
            kept.append(self._fix_names(sentence))
        out = self._style(" ".join(kept))
        self._tail = (self._tail + " " + out)[-self.tail_chars :] if out else self._tail
        if not out:
            self.stats["dropped"] += 1
            return None
        if out == text.strip() and norm == text:
            return text
        if out != norm.strip():
            self.stats["rewritten"] += 1
        return out
