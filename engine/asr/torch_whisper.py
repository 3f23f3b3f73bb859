"""Streaming speech recognition on a transformers ``WhisperForConditionalGeneration`` (``asr.backend =
"transformers"``), decoded through :class:`~engine.asr.cuda_whisper_graph.WhisperGraphDecoder`.

On CUDA the model runs in float16 and each decode step is one CUDA-graph replay; on the CPU the same code runs
eagerly (float32). ``asr.model`` names a local Hugging Face Whisper folder (``config.json``, weights, tokenizer and
preprocessor files), or a CTranslate2 one such as the bundled ``bundled:tiny.en``, whose weights are read
into transformers (:mod:`engine.asr.ct2_whisper`); nothing is downloaded.

``asr.model = "random:small"`` (benchmarks only) builds a Whisper of that published shape with random weights
and decodes its ids with the tokenizer in ``asr.tokenizer``. Random weights never emit EOS, so such a decode
is cut where a real model's would end: after :data:`SPEECH_TOKENS_PER_S` tokens per second of speech, plus
the EOS step; and its ids are restricted to tokens that read as words, so the reply stage gets text.

The stream semantics follow ``faster_whisper.py``: ``partial`` re-decodes the growing utterance and commits a
stable prefix by LocalAgreement-2; ``speculate`` decodes everything when the host pauses; ``final`` reuses that
decode when no audio came in since. (That module imports CTranslate2, which the GPU image lacks, so the stream
is kept here rather than imported.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.asr.config import ASRConfig
from engine.asr.ct2_whisper import is_ct2_folder, load_ct2_whisper, resolve_model_path
from engine.asr.cuda_whisper_graph import FRAMES_PER_S, N_FRAMES, WhisperGraphDecoder, prompt_ids_for
from engine.asr.log_mel import LogMel
from engine.asr.stream import SpeculativeStream
from engine.asr.trim import loud_bounds
from engine.native import model_executor

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MAX_WINDOW_S = 30.0
WINDOW_STEP_S = 5.0  # windows are rounded up to this (one CUDA graph per window length)
MAX_NEW_TOKENS = 224
PAD_S = 0.25
NO_SPEECH_DROP = 0.6
# Random-weight shapes: English conversational speech is ~150 words a minute, ~1.3 Whisper tokens a word.
SPEECH_TOKENS_PER_S = 3.3
# <|nocaptions|> of the multilingual vocabularies (v1/v2: 51865 ids, v3: 51866), for random-weight shapes.
NO_SPEECH_IDS = {51865: 50362, 51866: 50363}
RANDOM_PREFIX = "random:"
_ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*|♪+")


@dataclass(frozen=True, slots=True)
class TorchDecode:
    """The outcome of one decode (``text`` is empty for silence or a dropped no-speech decode)."""

    text: str
    audio_s: float
    no_speech_prob: float = 1.0
    encode_ms: float = 0.0
    generate_ms: float = 0.0
    window_s: float = 0.0
    tokens: int = 0


def random_decode_tokens(audio_s: float) -> int:
    """New tokens (EOS included) a real model would decode for ``audio_s`` of trimmed audio (speech plus
    the trim's padding on both sides): the length a random-weight shape's decode is cut to."""
    speech_s = max(0.0, audio_s - 2 * PAD_S)
    return int(np.ceil(speech_s * SPEECH_TOKENS_PER_S - 1e-9)) + 1


def window_frames(audio_s: float, window_s: float) -> int:
    """Mel frames of the encoder window: at least ``window_s`` and the audio, rounded up to 5 s, at most 30 s."""
    want = min(MAX_WINDOW_S, max(window_s, audio_s))
    want = min(MAX_WINDOW_S, WINDOW_STEP_S * float(np.ceil(want / WINDOW_STEP_S - 1e-9)))
    return int(round(want * FRAMES_PER_S))


@dataclass(slots=True)
class _Lane:
    """One decode at a time: a graph decoder (its own caches and captured graphs) and, on a CUDA device
    with several lanes, its own stream, so lanes' decodes overlap on the GPU."""

    graph: WhisperGraphDecoder
    stream: torch.cuda.Stream | None


def _device(config: ASRConfig) -> str:
    """``asr.device``, with ``auto`` = CUDA where there is one."""
    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device


def _lane_options(config: ASRConfig, device: str) -> dict[str, Any]:
    """Decodes at once: ``asr.gpu_lanes`` on a CUDA device, one on the CPU (its threads are the limit);
    and whether the encoder replays as a CUDA graph (``asr.encoder_graphs``, CUDA only)."""
    on_cuda = device.startswith("cuda")
    return {"lanes": config.gpu_lanes if on_cuda else 1, "encoder_graphs": config.encoder_graphs and on_cuda}


class TorchWhisperDecoder:
    """Model + feature extractor + tokenizer; :meth:`decode` is blocking.

    ``lanes`` decodes run at once, each on a lane of its own (the weights are shared). One lane
    serialised every session's partials, speculations and finals: with 16 hosts on an H200 the final came
    1.6-3.7 s after the end of speech (docs/PERFORMANCE.md, "H200: many sessions").
    """

    def __init__(
        self,
        model: Any,
        feature_extractor: Any,
        tokenizer: Any,
        window_s: float = 10.0,
        max_len: int = 448,
        random_weights: bool = False,
        lanes: int = 1,
        encoder_graphs: bool = True,
    ) -> None:
        self.model = model
        self.random_weights = random_weights
        self.feature_extractor = feature_extractor
        self.tokenizer = tokenizer
        self.window_s = window_s
        self.log_mel = LogMel.from_extractor(feature_extractor)
        self.hop = self.log_mel.hop_length
        graphs = [
            WhisperGraphDecoder(model, max_len=max_len, encoder_graphs=encoder_graphs, log_mel=self.log_mel)
            for _ in range(max(1, lanes))
        ]
        self.graph = graphs[0]  # lane 0's; the others share its settings
        self.prompt = prompt_ids_for(model)
        gen: Any = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        self.eos: int | None = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else None
        self.begin_suppress: list[int] = list(getattr(gen, "begin_suppress_tokens", None) or [])
        suppressed = list(getattr(gen, "suppress_tokens", None) or [])
        no_speech = None
        for name in ("<|nospeech|>", "<|nocaptions|>"):
            tid = tokenizer.convert_tokens_to_ids(name) if tokenizer is not None else None
            if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None):
                no_speech = tid
                break
        if random_weights:
            no_speech = NO_SPEECH_IDS.get(self.graph.vocab, no_speech)
            suppressed = self._unspeakable(tokenizer)
        self.no_speech_id: int | None = no_speech
        for g in graphs:
            g.set_suppressed(suppressed)
            if no_speech is not None:
                g.set_probe(no_speech)
            g.set_prompt(self.prompt, self.begin_suppress)  # fed in the encoder's graph
        on_cuda = self.graph.device.type == "cuda" and len(graphs) > 1
        self.lanes = [_Lane(g, torch.cuda.Stream(g.device) if on_cuda else None) for g in graphs]
        self._free: queue.SimpleQueue[_Lane] = queue.SimpleQueue()
        for lane in self.lanes:
            self._free.put(lane)

    @contextlib.contextmanager
    def _lane(self) -> Iterator[_Lane]:
        """A free lane (blocking until one is), its stream current while it is held."""
        lane = self._free.get()
        try:
            with torch.cuda.stream(lane.stream) if lane.stream is not None else contextlib.nullcontext():
                yield lane
        finally:
            self._free.put(lane)

    def _unspeakable(self, tokenizer: Any) -> list[int]:
        """Every id but EOS and the tokenizer's word-like ones (random-weight shapes only)."""
        from engine.llm.random_model import speakable_ids

        keep = [self.eos] if self.eos is not None else []
        allowed = set(speakable_ids(tokenizer, self.graph.vocab, keep))
        return [i for i in range(self.graph.vocab) if i not in allowed]

    @classmethod
    def load(cls, config: ASRConfig) -> TorchWhisperDecoder:
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

        if config.model.startswith(RANDOM_PREFIX):
            return cls.load_random(config)
        if is_ct2_folder(config.model):
            return cls.load_ct2(config)
        path = Path(config.model).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(
                f"asr.model: {config.model!r} is not a local Hugging Face Whisper folder (no config.json)"
            )
        device = _device(config)
        dtype = torch.float16 if device == "cuda" else torch.float32
        model: Any = WhisperForConditionalGeneration.from_pretrained(
            str(path), dtype=dtype, attn_implementation="sdpa", local_files_only=True
        )
        model = model.to(device).eval()
        fe = WhisperFeatureExtractor.from_pretrained(str(path), local_files_only=True)
        tok = WhisperTokenizer.from_pretrained(str(path), local_files_only=True)
        return cls(model, fe, tok, window_s=config.window_s, **_lane_options(config, device))

    @classmethod
    def load_ct2(cls, config: ASRConfig) -> TorchWhisperDecoder:
        """The bundled tiny.en or another CTranslate2 folder, its weights read into transformers (see
        :mod:`engine.asr.ct2_whisper`): the same model faster-whisper runs, on this backend's GPU path."""
        device = _device(config)
        dtype = torch.float16 if device == "cuda" else torch.float32
        model, fe, tok = load_ct2_whisper(resolve_model_path(config.model), device, dtype)
        return cls(model, fe, tok, window_s=config.window_s, **_lane_options(config, device))

    @classmethod
    def load_random(cls, config: ASRConfig) -> TorchWhisperDecoder:
        """``random:SHAPE``: random weights of a published shape (benchmarks only; see the module doc)."""
        from transformers import AutoTokenizer, WhisperFeatureExtractor

        from engine.asr.cuda_whisper_graph import WHISPER_SHAPES, build_whisper

        shape = config.model.removeprefix(RANDOM_PREFIX)
        if shape not in WHISPER_SHAPES:
            raise ValueError(
                f"asr.model: unknown random shape {shape!r} (known: {', '.join(WHISPER_SHAPES)})"
            )
        if not config.tokenizer:
            raise ValueError("asr.tokenizer: a 'random:*' model needs a local tokenizer folder")
        tok = AutoTokenizer.from_pretrained(config.tokenizer, local_files_only=True)
        device = _device(config)
        dtype = torch.float16 if device == "cuda" else torch.float32
        model = build_whisper(shape, device, dtype)
        fe = WhisperFeatureExtractor(feature_size=int(WHISPER_SHAPES[shape]["num_mel_bins"]))
        return cls(
            model, fe, tok, window_s=config.window_s, random_weights=True, **_lane_options(config, device)
        )

    def warm(self) -> None:
        """On every lane, one decode of a second of quiet noise, then the encoder's and the decoder step's
        graphs for every longer window: all captures happen now, before any session, not in a turn. (A capture while another
        thread launches work on the same GPU breaks one of them: see the CUDA-graph avatar backend.)"""
        noise = np.random.default_rng(0).standard_normal(SAMPLE_RATE).astype(np.float32) * 0.01
        steps = np.arange(self.window_s, MAX_WINDOW_S + 1e-6, WINDOW_STEP_S)
        frames = sorted({window_frames(float(w), self.window_s) for w in steps})
        held = [self._free.get() for _ in self.lanes]  # every lane, so each is warmed once
        try:
            for lane in held:
                with torch.cuda.stream(lane.stream) if lane.stream is not None else contextlib.nullcontext():
                    self._decode_piece(lane, noise)
                    for f in frames:
                        lane.graph.capture_encoder(f)
                        lane.graph.capture(f // 2)
        finally:
            for lane in held:
                self._free.put(lane)

    @property
    def device(self) -> str:
        return str(self.graph.device)

    def window_audio(self, audio: np.ndarray, frames: int) -> np.ndarray:
        """``[1, frames * hop]`` float32: the audio zero-padded to the window only (not to 30 s: a third of the
        work for a 10 s window, and the same features, since the padding's frames are silence either way).
        numpy only: it never gives up the GIL, unlike a torch call."""
        out = np.zeros((1, min(frames, N_FRAMES) * self.hop), dtype=np.float32)
        n = min(len(audio), out.shape[1])
        out[0, :n] = audio[:n]
        return out

    def features(self, audio: np.ndarray, frames: int) -> torch.Tensor:
        """Log-mel ``[1, mels, frames]`` on the host (:class:`~engine.asr.log_mel.LogMel`, as transformers'
        feature extractor computes them); a decode computes them on the model's device instead."""
        with torch.no_grad():
            mel: torch.Tensor = self.log_mel(torch.from_numpy(self.window_audio(audio, frames))).contiguous()
        return mel

    def decode(self, audio: np.ndarray, trim: bool = True) -> TorchDecode:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        audio_s = len(audio) / SAMPLE_RATE
        if trim:
            bounds = loud_bounds(audio)
            if bounds is None:
                return TorchDecode(text="", audio_s=audio_s)
            pad = int(PAD_S * SAMPLE_RATE)
            audio = audio[max(0, bounds[0] - pad) : bounds[1] + pad]
        piece = int(MAX_WINDOW_S * SAMPLE_RATE)
        with self._lane() as lane:
            parts = [self._decode_piece(lane, audio[i : i + piece]) for i in range(0, len(audio), piece)]
        text = " ".join(p.text for p in parts if p.text)
        return TorchDecode(
            text=text,
            audio_s=audio_s,
            no_speech_prob=min(p.no_speech_prob for p in parts),
            encode_ms=sum(p.encode_ms for p in parts),
            generate_ms=sum(p.generate_ms for p in parts),
            window_s=parts[0].window_s,
            tokens=sum(p.tokens for p in parts),
        )

    def _decode_piece(self, lane: _Lane, audio: np.ndarray) -> TorchDecode:
        audio_s = len(audio) / SAMPLE_RATE
        frames = window_frames(audio_s, self.window_s)
        window = torch.from_numpy(self.window_audio(audio, frames))
        max_new = min(MAX_NEW_TOKENS, int(audio_s * 6) + 8, self.graph.max_len - len(self.prompt) + 1)
        if self.random_weights:
            max_new = min(max_new, random_decode_tokens(audio_s))
        g = lane.graph
        with torch.no_grad():
            t0 = time.perf_counter()
            g.set_audio(window)  # features, encoder and cross K/V: one graph replay on CUDA
            if g.device.type == "cuda":  # this lane's stream only: the other lanes go on
                (lane.stream or torch.cuda.current_stream(g.device)).synchronize()
            t1 = time.perf_counter()
            ids = g.greedy_ids(self.prompt, max_new, eos=self.eos, begin_suppress=self.begin_suppress)
            tokens = [t for t in ids[0] if t != self.eos]
            # the no-speech probability after <|startoftranscript|>, kept by the decode's first step
            no_speech = g.probe_first()[0] if self.no_speech_id is not None else 0.0
            t2 = time.perf_counter()
        text = self.tokenizer.decode(tokens, skip_special_tokens=True).strip() if self.tokenizer else ""
        text = " ".join(_ANNOTATION.sub(" ", text).split())
        if no_speech > NO_SPEECH_DROP:
            text = ""
        return TorchDecode(
            text=text,
            audio_s=audio_s,
            no_speech_prob=no_speech,
            encode_ms=(t1 - t0) * 1000,
            generate_ms=(t2 - t1) * 1000,
            window_s=frames / FRAMES_PER_S,
            tokens=len(tokens),
        )


class TorchWhisperASR:
    """The loaded model, shared by every session (implements ``ASRModel``)."""

    def __init__(self, decoder: TorchWhisperDecoder, name: str = "whisper") -> None:
        self.decoder = decoder
        self.name = name
        # partials on one thread (one lane at most), speculations and finals on the others: a partial in
        # flight never holds a final back while a lane is free
        self.executor = model_executor(1, "asr")
        finals = max(1, len(decoder.lanes) - 1)
        self.final_executor = model_executor(finals, "asr-final")

    @classmethod
    def load(cls, config: ASRConfig) -> TorchWhisperASR:
        decoder = TorchWhisperDecoder.load(config)
        decoder.warm()
        name = config.model if decoder.random_weights else Path(config.model).name
        return cls(decoder, name=name)

    def new_stream(self) -> TorchWhisperStream:
        return TorchWhisperStream(self)

    def describe(self) -> str:
        d = self.decoder
        graph = "eager"
        if d.graph.use_graph:
            graph = "CUDA graphs" if d.graph.encoder_graphs else "CUDA graphs, eager encoder"
        weights = ", random weights: benchmarks only" if d.random_weights else ""
        lanes = f", {len(d.lanes)} lanes" if len(d.lanes) > 1 else ""
        return (
            f"transformers whisper {self.name} ({d.device}, {graph}{lanes}, {d.window_s:g} s window{weights})"
        )

    async def transcribe(self, audio: np.ndarray) -> TorchDecode:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.decoder.decode, audio)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.final_executor.shutdown(wait=False, cancel_futures=True)


class TorchWhisperStream(SpeculativeStream[TorchDecode]):
    """The host's current utterance on the graph-captured torch decoder (see :mod:`engine.asr.stream`)."""
