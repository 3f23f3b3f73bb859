"""WER helper and LocalAgreement-2, pure functions."""

from __future__ import annotations

import pytest

from engine.asr.agreement import agree, common_prefix_len, hypothesis_text
from engine.asr.wer import corpus_wer, normalize_words, wer, word_error_rate

pytestmark = pytest.mark.unit


def test_normalize_ignores_case_and_punctuation() -> None:
    assert normalize_words("Hello, World! It's me.") == ["hello", "world", "it's", "me"]


def test_wer_counts_substitutions_insertions_deletions() -> None:
    assert wer("the cat sat", "the cat sat") == 0.0
    assert wer("the cat sat", "The cat, sat.") == 0.0
    assert wer("the cat sat", "the dog sat") == pytest.approx(1 / 3)
    assert wer("the cat sat", "the cat sat down") == pytest.approx(1 / 3)
    assert wer("the cat sat", "cat sat") == pytest.approx(1 / 3)
    assert wer("", "") == 0.0
    assert wer("", "noise") == 1.0


def test_corpus_wer_weights_by_reference_words() -> None:
    pairs = [("a b c d", "a b c d"), ("e f", "e x")]
    assert corpus_wer(pairs) == pytest.approx(1 / 6)


def test_common_prefix_ignores_punctuation() -> None:
    assert common_prefix_len(["Hello,", "world"], ["hello", "world?"]) == 2
    assert common_prefix_len(["a", "b"], ["a", "c"]) == 1


def test_agreement_commits_only_what_two_decodes_share() -> None:
    stable: list[str] = []
    stable = agree(stable, [], ["what", "is"])
    assert stable == []
    stable = agree(stable, ["what", "is"], ["what", "is", "your"])
    assert stable == ["what", "is"]
    stable = agree(stable, ["what", "is", "your"], ["what", "is", "you're", "favorite"])
    assert stable == ["what", "is"]
    stable = agree(stable, ["what", "is", "you're", "favorite"], ["what", "is", "your", "favorite", "song"])
    assert stable == ["what", "is"]
    stable = agree(
        stable, ["what", "is", "your", "favorite", "song"], ["what", "is", "your", "favorite", "song?"]
    )
    assert stable == ["what", "is", "your", "favorite", "song?"]  # the newest decode's spelling


def test_agreement_never_retracts_committed_words() -> None:
    stable = ["what", "is"]
    assert agree(stable, ["what", "was", "it"], ["what", "was", "it"]) == stable
    assert hypothesis_text(stable, ["what", "was", "it"]) == "what is it"


def test_word_error_rate_over_parallel_lists() -> None:
    assert word_error_rate(["a b c d", "e f"], ["a b c d", "e x"]) == pytest.approx(1 / 6)
    assert word_error_rate(["a b"], []) == 1.0
