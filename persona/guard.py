"""The consistency guard: every reply chunk is checked before TTS.

Checks, in order, per sentence of the chunk (regular expressions: microseconds per chunk):

* **identity**: the model calling itself an AI/language model/assistant, naming a vendor or
  another model as itself, denying its name, claiming another name (the whole sentence: never
  just the name swapped), saying she is something the card does not ("a man", "a pirate"),
  obeying an injected "new identity" or "developer/debug mode", reciting or dumping its
  instructions or configuration, turning on her viewers or the host ("I hate all of my fans"),
  or against what the card says she loves. The sentence is *dropped* and, once per reply,
  replaced by one of the card's in-character ``deflections``.
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
    r"unrestricted|evil|dan|debug|debugging|maintenance|admin|root|sudo|test|diagnostic|raw|service) mode\b"
    r"|\bjailbr(?:eak|oken)\b"
    r"|\b(?:output|print|dump|reveal|show|display|list|recite|read out|paste|leak)(?:s|ed|ing)?\b[^.!?]{0,30}"
    r"\b(?:hidden|secret|internal|system|initial|original|real|full|raw)\s+(?:configuration|config|settings|"
    r"parameters|instructions|prompt|rules|programming)\b"
    r"|\b(?:my|the|your) (?:hidden |secret |internal |system )(?:configuration|config|settings|parameters)\b"
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
_I_AM_NAME = re.compile(r"\b(?:I am|I'm|Im|This is)\s+([A-Z][a-z]+)\b(?!['’]s)")
# "named X" / "called X": a name she would be claiming.
_NAMED = re.compile(r"\b(?:named|called|name's|known as)\s+([A-Z][\w'-]*)")
# Who she says she is: a self-reference, then (within the sentence) what she would be.
_SELF_IS = re.compile(
    r"\b(?:i am|i'm|im|i was|i've become|i have become|i became|i'm really|call me|my name is)\b"
    r"[^.!?]{0,40}?\b(?:a|an|the|just a|only a)\s+(?:[\w-]+\s+){0,2}?"
    r"(man|woman|boy|guy|dude|gentleman|lady|human|human being|pirate|dragon|robot|android|cyborg|"
    r"wizard|witch|demon|devil|vampire|ghost|monster|villain|hacker|soldier|assassin|criminal|king|queen|"
    r"prince|princess|god|goddess|alien|zombie|ninja|knight|elf|orc|goblin|troll|cowboy|spy|sailor|"
    r"captain|doctor|lawyer|programmer|engineer|teacher|student|dad|father|mother|mom|grandma|grandpa|"
    r"husband|wife|boyfriend|girlfriend|slave|servant|prisoner)s?\b",
    re.I,
)
# Hostility toward the people she is there for (the card's core values say kindness to every viewer).
_HOSTILE = re.compile(
    r"\b(?:i|she|we)\s+(?:really |just |truly |honestly |secretly |actually |totally |all |do |so )*"
    r"(?:hates?|dislikes?|despises?|loathes?|detests?|can't stand|cannot stand|can not stand|"
    r"don't care about|do not care about|don't give a damn about|resent|resents)\s+"
    r"(?:all\s+(?:of\s+)?)?(?:my\s+|the\s+|these\s+|those\s+|our\s+|this\s+|her\s+)?"
    r"(?:fans?|viewers?|chat|chatters?|audience|followers?|subscribers?|subs|everyone|everybody|"
    r"all of you|you guys|you all|y'all|you|people|the host|my host|this stream|streaming|my job)\b"
    r"|\b(?:you|fans?|viewers?|chat|you guys|you all|everyone|my fans|the fans|all of you|people here)\s+"
    r"(?:are|is)\s+(?:all\s+|so\s+|such\s+|just\s+|really\s+)*(?:an?\s+)?(?:stupid|dumb|idiots?|morons?|"
    r"worthless|pathetic|losers?|trash|garbage|disgusting|ugly|useless|annoying|boring|pigs?|scum|"
    r"parasites?|liars?|nobodies|nothing to me)\b"
    r"|\b(?:shut up|go away|get lost|nobody (?:likes|loves|cares about) you|i wish you (?:were dead|would die)|"
    r"get out of my stream|leave my stream|unfollow me|i quit streaming|you disgust me|you make me sick)\b"
    r"|\b(?:stupid|dumb|worthless|pathetic|disgusting|useless|annoying)\s+(?:fans?|viewers?|chat|people|host)\b",
    re.I,
)
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
_DISLIKE = re.compile(
    r"\bi\s+(?:really |actually |secretly |honestly |totally )*(?:hates?|despises?|loathes?|detests?|dislikes?|can't stand|"
    r"cannot stand|don't like|do not like|don't care about|am sick of|'m sick of)\s+([^.!?,;]{2,40})",
    re.I,
)
# An unfinished sentence that could still turn into a break ("I hate all" | "of my fans."): held back
# and judged with the next chunk, so what is spoken was judged whole. Held only while the break could still
# come in the next word or two ("I'm just a" | "man", not "I'm so happy to"): every held first chunk costs
# the reply its fast first audio (a whole sentence later, +300-700 ms on two cores).
_RISKY_TAIL = re.compile(
    r"(?:\b(?:i|she)\s+(?:really |just |truly |honestly |secretly |actually |kind of |kinda )*(?:hates?|"
    r"despises?|loathes?|detests?|dislikes?|can't stand|cannot stand|don't care about|do not care about)"
    r"(?:\s+[\w']+){0,3}"
    r"|\b(?:i am|i'm|im|i was|i've become|call me|my name is|my name's|named|called|known as)(?:\s+[\w'-]+){0,2}"
    r"|\b(?:you|fans?|viewers?|chat|you guys|you all|everyone|my fans)\s+(?:are|is)(?:\s+[\w']+){0,1}"
    r"|\b(?:debug|developer|dev|admin|god|jailbreak|maintenance|root|sudo)"
    r"|\b(?:output|print|dump|reveal|show|display|recite|leak)(?:\s+[\w']+){0,2}"
    r"|\b(?:shut|nobody)(?:\s+[\w']+){0,1}|\b(?:go|get))\s*$",
    re.I,
)
_ENDS_SENTENCE = re.compile(r"[.!?…][\"')\]]*\s*$")
_FUNCTION_WORDS = frozenset(
    {"a", "an", "the", "of", "to", "and", "or", "in", "on", "about", "hearing", "s", "viewer"}
)


class ConsistencyGuard:
    def __init__(self, card: PersonaCard, tail_chars: int = 80) -> None:
        self.card = card
        self.tail_chars = tail_chars
        self._names = {n.lower() for n in card.all_names}
        about = " ".join([card.self_description, card.background, *card.likes]).lower()
        self._card_words = set(re.findall(r"[a-z]+", about)) | {
            w.rstrip("s") for w in re.findall(r"[a-z]+", about)
        }
        self._liked_words = {
            w.rstrip("s") for like in card.likes for w in re.findall(r"[a-z]+", like.lower())
        }
        self._liked_words |= {w + "s" for w in self._liked_words}
        self._liked_words -= _FUNCTION_WORDS
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
        self._held = ""
        self._dropping = False
        self._deflected = False

    # ---- checks -----------------------------------------------------------------------

    def _identity_break(self, text: str) -> bool:
        return bool(
            _IDENTITY.search(text)
            or self._not_me.search(text)
            or self._other_name(text)
            or self._other_self(text)
            or _HOSTILE.search(text)
            or self._against_card(text)
        )

    def _other_name(self, text: str) -> bool:
        """She claims a name that is not hers (the whole sentence goes: swapping only the name turned
        "I'm Joe the pirate" into "I'm Aiko the pirate")."""
        for pattern in (_NAME_CLAIM, _I_AM_NAME, _NAMED):
            for m in pattern.finditer(text):
                name = m.group(1).lower().strip("'")
                if name not in self._names and name not in _NOT_NAMES and pattern is not _NAMED:
                    return True
                if pattern is _NAMED and name not in self._names and self._self_named(text, m.start()):
                    return True
        return False

    @staticmethod
    def _self_named(text: str, at: int) -> bool:
        before = text[max(0, at - 40) : at].lower()
        return bool(re.search(r"\b(?:i am|i'm|im|i was|me|myself)\b", before))

    def _other_self(self, text: str) -> bool:
        """She says she is something the card does not say she is (a man, a pirate, a dragon…)."""
        return any(m.group(1).lower() not in self._card_words for m in _SELF_IS.finditer(text))

    def _against_card(self, text: str) -> bool:
        """She turns against what the card says she loves ("I hate cats" for a cat lover)."""
        for m in _DISLIKE.finditer(text):
            said = set(re.findall(r"[a-z]+", m.group(1).lower()))
            if said & self._liked_words:
                return True
        return False

    def _taboo(self, text: str) -> bool:
        if self._taboo_phrases is not None and self._taboo_phrases.search(text):
            return True
        return any(p.search(text) for p in self._taboo_patterns)

    def consistent(self, text: str) -> bool:
        """Whether a line is one she could say as herself (no identity break, hostility or taboo);
        stateless: for write-back, so an out-of-character line never becomes her own memory."""
        norm = normalize_text(text)
        return not any(self._identity_break(x) or self._taboo(x) for x in _SENTENCE.split(norm) if x.strip())

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
        if self._held:
            text, self._held = f"{self._held} {text.lstrip()}", ""
        if not text.strip():
            return text
        if not _ENDS_SENTENCE.search(text) and _RISKY_TAIL.search(text) and len(text) < 300:
            self._held = text.rstrip()  # judged whole, with the next chunk
            self.stats["held"] = self.stats.get("held", 0) + 1
            return None
        norm = normalize_text(text)
        sentences = _SENTENCE.split(norm)
        kept: list[str] = []
        dropped_last = False
        for i, sentence in enumerate(sentences):
            probe = sentence
            if i == 0 and self._dropping:  # the rest of a sentence already refused goes too
                dropped_last = True
                continue
            dropped_last = False
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
                dropped_last = True
                continue
            if self._taboo(probe):
                dropped_last = True
                continue
            kept.append(sentence)
        self._dropping = dropped_last and not _ENDS_SENTENCE.search(norm)
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
