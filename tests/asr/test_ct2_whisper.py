"""The bundled tiny.en (a CTranslate2 folder) read into transformers: the same model, on the GPU path's code.

Run here on the CPU (eager, float32); the H200 run decodes it with CUDA graphs (docs/PERFORMANCE.md)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.asr import load_asr
from engine.asr.config import ASRConfig
from engine.asr.ct2_whisper import CT2FormatError, read_model_bin, resolve_model_path
from engine.asr.cuda_whisper_graph import prompt_ids_for
from engine.asr.torch_whisper import TorchWhisperASR
from engine.asr.wer import corpus_wer
from tests.asr.test_faster_whisper import QUESTIONS, append_in_pieces, padded

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def asr() -> Iterator[TorchWhisperASR]:
    model = load_asr(ASRConfig(backend="transformers", model="bundled:tiny.en", device="cpu"))
    assert isinstance(model, TorchWhisperASR)
    yield model
    model.close()


async def test_bundled_tiny_en_transcribes_through_transformers(asr: TorchWhisperASR) -> None:
    assert "tiny.en" in asr.describe() and "random" not in asr.describe()
    pairs = []
    for text in QUESTIONS:
        stream = asr.new_stream()
        append_in_pieces(stream, padded(text))
        await stream.speculate()
        pairs.append((text, (await stream.final()).text))
    assert corpus_wer(pairs) <= 0.1, pairs


def test_english_only_prompt_has_no_language_or_task(asr: TorchWhisperASR) -> None:
    tok = asr.decoder.tokenizer
    sot, no_ts = (tok.convert_tokens_to_ids(t) for t in ("<|startoftranscript|>", "<|notimestamps|>"))
    assert prompt_ids_for(asr.decoder.model) == [sot, no_ts] == asr.decoder.prompt
    assert asr.decoder.eos == tok.convert_tokens_to_ids("<|endoftext|>")


def test_encoder_matches_ctranslate2_on_the_same_weights(asr: TorchWhisperASR) -> None:
    """The renamed and split weights compute what CTranslate2 computes from model.bin (float32 both)."""
    import ctranslate2
    import torch

    folder = resolve_model_path("bundled:tiny.en")
    reference = ctranslate2.models.Whisper(str(folder), device="cpu", compute_type="float32")
    mel = asr.decoder.features(padded(QUESTIONS[0]), 1000)  # a 10 s window
    theirs = np.array(reference.encode(ctranslate2.StorageView.from_array(mel.numpy()), to_cpu=True))
    with torch.no_grad():
        ours = asr.decoder.graph.encode(mel).numpy()
    assert ours.shape == theirs.shape
    err = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
    assert err < 1e-3


# ---- model.bin files this reader refuses, with the file named ----------------------------------------


def _string(s: str) -> bytes:
    raw = s.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _variable(name: str, array: np.ndarray, code: int) -> bytes:
    head = _string(name) + struct.pack("<B", array.ndim) + b"".join(struct.pack("<I", d) for d in array.shape)
    return head + struct.pack("<BI", code, array.nbytes) + array.tobytes()


def _model_bin(spec: str = "WhisperSpec", variables: list[bytes] | None = None, version: int = 6) -> bytes:
    items = variables or []
    return struct.pack("<I", version) + _string(spec) + struct.pack("<II", 3, len(items)) + b"".join(items)


def test_reads_its_own_format_back(tmp_path: Path) -> None:
    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    body = _model_bin(variables=[_variable("decoder/embeddings/weight", w, 4)])
    path = tmp_path / "model.bin"
    path.write_bytes(
        body
        + struct.pack("<I", 1)
        + _string("decoder/projection/weight")
        + _string("decoder/embeddings/weight")
    )
    got = read_model_bin(path)
    np.testing.assert_array_equal(got["decoder/embeddings/weight"], w)
    assert got["decoder/projection/weight"] is got["decoder/embeddings/weight"]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (_model_bin(variables=[_variable("a", np.zeros(4, np.float16), 4)])[:-3], "truncated"),
        (_model_bin(spec="TransformerSpec"), "not Whisper"),
        (_model_bin(version=2), "binary version 2"),
        (_model_bin(variables=[_variable("a", np.zeros(4, np.float16), 9)]), "data type 9"),
        (b"\x06\x00", "truncated"),
    ],
    ids=["truncated", "another-spec", "old-version", "unknown-dtype", "two-bytes"],
)
def test_a_bad_model_bin_is_refused_naming_the_file(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(content)
    with pytest.raises(CT2FormatError, match=says) as e:
        read_model_bin(path)
    assert str(path) in str(e.value)


def test_a_corrupt_folder_fails_the_load_with_a_clear_error(tmp_path: Path) -> None:
    folder = resolve_model_path("bundled:tiny.en")
    (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (tmp_path / "model.bin").write_bytes((folder / "model.bin").read_bytes()[:100_000])
    with pytest.raises(CT2FormatError, match="truncated") as e:
        load_asr(ASRConfig(backend="transformers", model=str(tmp_path), device="cpu"))
    assert str(tmp_path / "model.bin") in str(e.value)
