"""A small word-level tokenizer with a ChatML template, built in code (no downloads), for random-weight shapes.

Ids: 0 ``<|endoftext|>``, 1 ``<unk>``, 2 ``<|im_start|>``, 3 ``<|im_end|>``, 4..7 ``. , ! ?``, 8..10 the
roles (system, user, assistant), then made-up two-syllable words ("bako", "dimu", ...) up to ``size`` ids.
"""

from __future__ import annotations

import itertools
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"]
PUNCT = [".", ",", "!", "?"]
ROLES = ["system", "user", "assistant"]


def words(n: int) -> list[str]:
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    return ["".join(p) for p in itertools.islice(itertools.product(syllables, repeat=2), n)]


def build_word_tokenizer(folder: Path, size: int = 600) -> Path:
    """Save a tokenizer of ``size`` ids into ``folder`` and return it (loadable with ``AutoTokenizer``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fixed = SPECIALS + PUNCT + ROLES
    tokens = fixed + words(size - len(fixed))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", unk_token="<unk>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder
