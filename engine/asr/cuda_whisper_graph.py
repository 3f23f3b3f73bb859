"""Whisper decoding through its own static KV tensors and one CUDA graph a step.

Eager Hugging Face ``generate`` on a GPU is bound by kernel-launch overhead: a Whisper-small-shaped encoder
runs a 30 s window in ~10 ms on an H200, but 24 eager decode steps take ~235 ms. This module owns the decoder
step of a ``WhisperForConditionalGeneration`` instead of calling its ``forward``:

* the encoder runs once per decode, through the model's own conv stem and layers; unlike HF's forward (which
  rejects anything but 3,000 mel frames) it slices the positional table, so a shorter window (10 s = 1,000
  frames) works, as in CTranslate2;
* the cross-attention K/V of every decoder layer are computed once per decode into static tensors
  ``[layers, batch, heads, 1500, head_dim]`` (a shorter window uses a prefix of them);
* on CUDA :meth:`WhisperGraphDecoder.set_features` runs the encoder and those projections as one CUDA graph
  per window length (~350 kernels launched from Python otherwise: with many sessions in one process each
  launch waits its turn for the GIL);
* the self-attention K/V live in static tensors ``[layers, batch, heads, cap, head_dim]``; the position of
  the token being fed lives in a device tensor; a step writes its K/V with ``index_copy_`` and attends under
  the mask ``arange(cap) <= pos``;
* the step also adds a suppression bias to the logits, takes the greedy argmax into the next input token and
  advances the position, so a whole greedy decode is a series of graph replays with no host round trip;
* on CUDA the step is captured into one CUDA graph per encoder length (captured lazily, then replayed); on the
  CPU the very same step runs eagerly (that is how the CPU tests check the math against HF's forward).

The model's weights must not be replaced after construction (the graphs hold their addresses).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

N_FRAMES = 3000  # mel frames of a 30 s window (hop 10 ms)
FRAMES_PER_S = 100

# Shapes of the published checkpoints (random weights are built from these numbers; nothing is downloaded).
WHISPER_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "d_model": 384,
        "encoder_layers": 4,
        "decoder_layers": 4,
        "encoder_attention_heads": 6,
        "decoder_attention_heads": 6,
        "encoder_ffn_dim": 1536,
        "decoder_ffn_dim": 1536,
        "num_mel_bins": 80,
        "vocab_size": 51865,
    },
    "small": {
        "d_model": 768,
        "encoder_layers": 12,
        "decoder_layers": 12,
        "encoder_attention_heads": 12,
        "decoder_attention_heads": 12,
        "encoder_ffn_dim": 3072,
        "decoder_ffn_dim": 3072,
        "num_mel_bins": 80,
        "vocab_size": 51865,
    },
    "large-v3-turbo": {
        "d_model": 1280,
        "encoder_layers": 32,
        "decoder_layers": 4,
        "encoder_attention_heads": 20,
        "decoder_attention_heads": 20,
        "encoder_ffn_dim": 5120,
        "decoder_ffn_dim": 5120,
        "num_mel_bins": 128,
        "vocab_size": 51866,
    },
    # A toy of the same family, for CPU tests and smoke runs of the bench.
    "toy": {
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "num_mel_bins": 80,
        "vocab_size": 512,
        "pad_token_id": 1,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "decoder_start_token_id": 508,
        "begin_suppress_tokens": None,
        "suppress_tokens": None,
    },
}

# The English, transcribe, no-timestamps prompt of the multilingual v1/v2 vocabulary (51865 ids):
# <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>. v3 (51866 ids) shifts the task ids by one.
PROMPT_IDS: dict[int, list[int]] = {
    51865: [50258, 50259, 50359, 50363],
    51866: [50258, 50259, 50360, 50364],
}


def prompt_ids_for(model: nn.Module) -> list[int]:
    """sot, en, transcribe, notimestamps (sot, notimestamps for an English-only model): from the model's
    generation_config when it has the maps, else by vocabulary size (the published ids), else the last four
    ids below the vocabulary (toy models)."""
    cfg: Any = cast(Any, model).config
    gen: Any = getattr(model, "generation_config", None)
    lang = getattr(gen, "lang_to_id", None)
    task = getattr(gen, "task_to_id", None)
    no_ts = getattr(gen, "no_timestamps_token_id", None)
    sot = getattr(gen, "decoder_start_token_id", None)
    if no_ts is not None and sot is not None and getattr(gen, "is_multilingual", None) is False:
        return [int(sot), int(no_ts)]  # an English-only model (tiny.en): no language, no task
    if lang and task and no_ts is not None and sot is not None:
        prompt = [int(sot)]
        if getattr(gen, "is_multilingual", True) and "<|en|>" in lang:
            prompt += [int(lang["<|en|>"]), int(task["transcribe"])]
        return [*prompt, int(no_ts)]
    vocab = int(cfg.vocab_size)
    if vocab in PROMPT_IDS:
        return list(PROMPT_IDS[vocab])
    return [vocab - 4, vocab - 3, vocab - 2, vocab - 1]


def build_whisper(
    shape: str, device: str | torch.device, dtype: torch.dtype, seed: int = 0, std: float = 0.02
) -> nn.Module:
    """A ``WhisperForConditionalGeneration`` of a published shape with random N(0, std) weights."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    kwargs: dict[str, Any] = {
        **WHISPER_SHAPES[shape],
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "attn_implementation": "sdpa",
    }
    cfg = WhisperConfig(**kwargs)
    torch.manual_seed(seed)
    with torch.device(device):
        model: Any = WhisperForConditionalGeneration(cfg)
        model = model.to(dtype)
    init_normal(model, std=std, seed=seed)
    return model.eval()


def init_normal(model: nn.Module, std: float = 0.02, seed: int = 0) -> None:
    """Matrices and embeddings ~ N(0, std), biases ~ N(0, std), layer-norm gains 1 (positional tables kept)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue  # the sinusoidal table of the encoder
            if "layer_norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            elif "layer_norm" in name:
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)


class WhisperGraphDecoder:
    """Greedy Whisper decoding with static K/V and a CUDA graph per step.

    ``dec = WhisperGraphDecoder(model, max_len=64)``; then ``enc = dec.encode(features)`` (``[batch, mels,
    frames]``, frames ≤ 3000 and even), ``dec.set_encoder(enc)``, and either :meth:`step` token by token
    (teacher forcing: returns logits) or :meth:`greedy` for a whole decode.

    ``use_graph`` defaults to "on CUDA"; pass ``False`` to run the same step eagerly. ``encoder_graphs``
    (default: ``use_graph``) has :meth:`set_features` replay the encoder as a graph too.
    """

    CHAIN = 4  # greedy steps a graph replay runs (then the host checks for EOS)

    def __init__(
        self,
        model: nn.Module,
        max_len: int = 448,
        batch: int = 1,
        use_graph: bool | None = None,
        encoder_graphs: bool | None = None,
        log_mel: nn.Module | None = None,
    ) -> None:
        inner: Any = getattr(model, "model", None)
        proj: Any = getattr(model, "proj_out", None)
        if inner is None or proj is None or not hasattr(inner, "encoder") or not hasattr(inner, "decoder"):
            raise NotImplementedError(f"{type(model).__name__}: expected a WhisperForConditionalGeneration")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.model = model
        self.config: Any = cast(Any, model).config
        self._enc: Any = inner.encoder
        self._dec: Any = inner.decoder
        self._proj: Any = proj
        self._layers: list[Any] = list(self._dec.layers)
        cfg = self.config
        n_pos = int(self._dec.embed_positions.weight.shape[0])
        if not 2 <= max_len <= n_pos:
            raise ValueError(f"max_len must be within 2..{n_pos}")
        self.max_len = max_len
        self._cap = -(-max_len // 64) * 64  # rows of the mask stay aligned for the efficient SDPA kernel
        self.batch = batch
        self.n_layers = len(self._layers)
        self.n_heads = int(cfg.decoder_attention_heads)
        self.d_model = int(cfg.d_model)
        self.head_dim = self.d_model // self.n_heads
        self._scaling = float(self._layers[0].self_attn.scaling)
        self.enc_positions = int(self._enc.embed_positions.weight.shape[0])  # 1500
        self.vocab = int(self._proj.weight.shape[0])
        weight = self._proj.weight
        self.device: torch.device = weight.device
        self.dtype: torch.dtype = weight.dtype
        dev, dt = self.device, self.dtype
        with torch.no_grad():
            self_shape = (self.n_layers, batch, self.n_heads, self._cap, self.head_dim)
            self.k_cache = torch.zeros(self_shape, dtype=dt, device=dev)
            self.v_cache = torch.zeros(self_shape, dtype=dt, device=dev)
            cross_shape = (self.n_layers, batch, self.n_heads, self.enc_positions, self.head_dim)
            self.cross_k = torch.zeros(cross_shape, dtype=dt, device=dev)
            self.cross_v = torch.zeros(cross_shape, dtype=dt, device=dev)
            # Decoder positional table padded to the cap (rows beyond max_len are never read).
            table = self._dec.embed_positions.weight
            self._pos_table = torch.zeros(self._cap, self.d_model, dtype=dt, device=dev)
            self._pos_table[: min(self._cap, n_pos)] = table[: self._cap]
            self._arange = torch.arange(self._cap, device=dev)
            self.pos = torch.zeros(1, dtype=torch.long, device=dev)
            self._tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
            self._ids = torch.zeros(batch, self._cap, dtype=torch.long, device=dev)
            self.bias = torch.zeros(self.vocab, dtype=torch.float32, device=dev)  # added before the argmax
            self._base_bias = torch.zeros_like(self.bias)  # the suppression alone (no begin-suppress)
            self._next = torch.zeros(batch, dtype=torch.long, device=dev)
            self._eos = torch.full((1,), -1, dtype=torch.long, device=dev)  # -1: none
            self._hit = torch.zeros(batch, dtype=torch.bool, device=dev)  # a row has emitted EOS
            # set_probe's token, and each row's probability of it at the first step
            self._probe = torch.zeros(1, 1, dtype=torch.long, device=dev)
            self._probe_first = torch.zeros(batch, dtype=torch.float32, device=dev)
        self._eos_id = -1  # host mirror of ``_eos``
        self._begin_bias: dict[tuple[int, ...], torch.Tensor] = {}
        # set_prompt: the prompt every decode starts with, fed right after the encoder (in its graph)
        self._prompt: list[int] = []
        self._prompt_begin: tuple[int, ...] = ()
        self._prompt_ids = torch.zeros(batch, 0, dtype=torch.long, device=dev)
        self._prompted = False  # the prompt has been fed over the current encoder output
        self.enc_len = 0  # encoder frames (after the stride-2 conv) whose cross K/V are set
        self.length = 0  # host mirror of ``pos``
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.use_graph = (dev.type == "cuda") if use_graph is None else use_graph
        if self.use_graph and dev.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.encoder_graphs = self.use_graph if encoder_graphs is None else encoder_graphs and self.use_graph
        self.n_mels = int(cast(Any, inner.encoder.conv1).in_channels)
        self.log_mel = log_mel.to(dev) if log_mel is not None else None
        self.hop = int(getattr(log_mel, "hop_length", 160))  # audio samples a mel frame
        # (input kind, length) -> (graph, its static input); the encoder graphs share one memory pool (they
        # never run at once: a decoder is one decode at a time, and their outputs are the static cross K/V)
        self._enc_graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._enc_pool: Any = None

    # ------------------------------------------------------------------ encoder

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """The encoder's hidden states ``[batch, frames // 2, d_model]`` for mel ``features`` of at most 3,000
        frames (HF's own forward accepts exactly 3,000; the positional table is sliced here instead)."""
        enc = self._enc
        frames = int(features.shape[-1])
        if frames % 2 or frames > 2 * self.enc_positions or frames < 2:
            raise ValueError(f"mel frames must be even and at most {2 * self.enc_positions}, got {frames}")
        with torch.no_grad():
            x = features.to(self.device, self.dtype)
            x = F.gelu(enc.conv1(x))
            x = F.gelu(enc.conv2(x)).permute(0, 2, 1)
            h = x + enc.embed_positions.weight[: x.shape[1]]
            for layer in enc.layers:
                h = layer(h, None)
            out: torch.Tensor = enc.layer_norm(h)
        return out

    def set_encoder(self, hidden: torch.Tensor) -> None:
        """Compute every decoder layer's cross-attention K/V from ``hidden`` and start a new decode."""
        b, t, _ = hidden.shape
        if b != self.batch or t > self.enc_positions:
            raise ValueError(f"encoder output {tuple(hidden.shape)} does not fit batch {self.batch}")
        self._cross_kv(hidden)
        self.enc_len = t
        self.reset()

    def _cross_kv(self, hidden: torch.Tensor) -> None:
        b, t, _ = hidden.shape
        with torch.no_grad():
            hidden = hidden.to(self.device, self.dtype)
            for i, layer in enumerate(self._layers):
                attn = layer.encoder_attn
                k = attn.k_proj(hidden).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
                v = attn.v_proj(hidden).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
                self.cross_k[i, :, :, :t] = k
                self.cross_v[i, :, :, :t] = v

    def set_features(self, features: torch.Tensor) -> None:
        """``set_encoder(encode(features))``: with encoder graphs, one replay of the graph captured for this
        many mel frames (captured now if :meth:`capture_encoder` was not called for them)."""
        self._set_input("mel", features)

    def set_audio(self, audio: torch.Tensor) -> None:
        """``set_features(log_mel(audio))`` for ``[batch, samples]`` audio already padded to the window: with
        encoder graphs the features are in the same replay as the encoder."""
        if self.log_mel is None:
            raise RuntimeError("set_audio needs the decoder built with log_mel")
        self._set_input("audio", audio)

    def _front(self, kind: str, x: torch.Tensor) -> torch.Tensor:
        if kind == "audio":
            assert self.log_mel is not None
            return self.encode(self.log_mel(x))
        return self.encode(x)

    def _set_input(self, kind: str, x: torch.Tensor) -> None:
        if not self.encoder_graphs:
            with torch.no_grad():
                self.set_encoder(self._front(kind, x.to(self.device)))
                if self._prompt and not self.use_graph:  # all eager: the graph's own prompt steps
                    self._prefill_prompt(self.enc_len)
                    self.length = len(self._prompt)
                    self._prompted = True
                elif self._prompt:  # the steps' graphs, fed from the host
                    self._feed_prompt(self._prompt, self._prompt_begin)
                    self._prompted = True
            return
        if int(x.shape[0]) != self.batch:
            raise ValueError(f"input {tuple(x.shape)} does not fit batch {self.batch}")
        length = int(x.shape[-1])
        graph, static = self._encoder_graph_for(kind, length)
        with torch.no_grad():
            static.copy_(x, non_blocking=True)
            graph.replay()  # the front, the encoder, the cross K/V and the prompt's steps
        self.enc_len = self._enc_frames(kind, length)
        self.length = len(self._prompt)
        self._prompted = bool(self._prompt)

    def set_prompt(self, prompt: Sequence[int], begin_suppress: Sequence[int] = ()) -> None:
        """The prompt every decode starts with: :meth:`set_features` / :meth:`set_audio` feed it right after
        the encoder (with encoder graphs, in the same replay), ``begin_suppress`` on its last step, and a
        :meth:`greedy_ids` for this prompt goes on from there. Drops the encoder graphs captured so far."""
        if len(prompt) > self.max_len:
            raise ValueError(f"a prompt of {len(prompt)} tokens does not fit max_len {self.max_len}")
        self._prompt = [int(t) for t in prompt]
        self._prompt_begin = tuple(int(t) for t in begin_suppress)
        with torch.no_grad():
            row = torch.tensor([self._prompt], dtype=torch.long, device=self.device)
            self._prompt_ids = row.expand(self.batch, -1).contiguous()
        self._begin_bias_for(self._prompt_begin)
        self._enc_graphs.clear()
        self._prompted = False

    def _prefill_prompt(self, t: int) -> None:
        """The prompt's steps as device work only (captured in the encoder's graph)."""
        begin = self._begin_bias_for(self._prompt_begin) if self._prompt_begin else None
        self.pos.zero_()
        last = len(self._prompt) - 1
        for i in range(len(self._prompt)):
            self._tok.copy_(self._prompt_ids[:, i : i + 1])
            if i == last:
                if begin is not None:
                    self.bias.copy_(begin)
                self._hit.zero_()
            self._step_impl(t)
        if begin is not None:
            self.bias.copy_(self._base_bias)

    def _feed_prompt(self, prompt: Sequence[int], begin_suppress: Sequence[int]) -> None:
        """``prompt`` fed from the host from position 0, a step at a time (the steps as graphs or eager),
        ``begin_suppress`` on its last step, whose pick is the first new id."""
        self.reset()
        begin = self._begin_bias_for(begin_suppress) if begin_suppress else None
        with torch.no_grad():
            for tok in prompt[:-1]:
                self.step(int(tok))
            if begin is not None:
                self.bias.copy_(begin)
            self._hit.zero_()
            self.step(int(prompt[-1]))
            if begin is not None:
                self.bias.copy_(self._base_bias)

    def _enc_frames(self, kind: str, length: int) -> int:
        """Encoder positions for an input of ``length`` (mel frames, or samples of audio)."""
        frames = length // self.hop if kind == "audio" else length
        return frames // 2

    def _encoder_graph_for(self, kind: str, length: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        got = self._enc_graphs.get((kind, length))
        if got is not None:
            return got
        if kind == "audio":
            static = torch.zeros(self.batch, length, dtype=torch.float32, device=self.device)
        else:
            static = torch.zeros(self.batch, self.n_mels, length, dtype=self.dtype, device=self.device)
        t = self._enc_frames(kind, length)
        state = [self.cross_k, self.cross_v, *self._step_state()]
        saved = [x.clone() for x in state]

        def body() -> None:
            self._cross_kv(self._front(kind, static))
            if self._prompt:
                self._prefill_prompt(t)

        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                body()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._enc_pool is None:
            self._enc_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            with torch.cuda.graph(graph, pool=self._enc_pool, capture_error_mode="thread_local"):
                body()
            for x, old in zip(state, saved, strict=True):  # capture ran it once for real
                x.copy_(old)
        self._enc_graphs[(kind, length)] = (graph, static)
        return graph, static

    def _step_state(self) -> list[torch.Tensor]:
        """What a step writes besides its outputs' static buffers (restored after a capture)."""
        return [
            self.pos,
            self.k_cache,
            self.v_cache,
            self._ids,
            self._next,
            self._tok,
            self._hit,
            self._probe_first,
        ]

    def capture_encoder(self, frames: int) -> None:
        """Capture the encoder for ``frames`` mel frames ahead of time, from audio where the decoder has
        ``log_mel`` (no-op without encoder graphs)."""
        if not self.encoder_graphs:
            return
        if self.log_mel is not None:
            self._encoder_graph_for("audio", frames * self.hop)
        else:
            self._encoder_graph_for("mel", frames)

    def reset(self) -> None:
        """Start decoding again at position 0 over the same encoder output."""
        with torch.no_grad():
            self.pos.zero_()
        self.length = 0
        self._prompted = False

    # ------------------------------------------------------------------ the step

    def _step_impl(self, t: int) -> torch.Tensor:
        """Feed ``self._tok`` at ``self.pos`` over ``t`` encoder frames; logits ``[B, vocab]`` (float32 with the
        bias added); ``self._next`` gets the argmax and the position advances."""
        b, nh, hd = self.batch, self.n_heads, self.head_dim
        pos = self.pos
        self._ids.index_copy_(1, pos, self._tok)
        h = self._dec.embed_tokens(self._tok) + self._pos_table.index_select(0, pos).unsqueeze(0)
        mask = (self._arange <= pos).view(1, 1, 1, self._cap)
        for i, layer in enumerate(self._layers):
            sa = layer.self_attn
            x = layer.self_attn_layer_norm(h)
            q = (sa.q_proj(x) * self._scaling).view(b, 1, nh, hd).transpose(1, 2)
            k = sa.k_proj(x).view(b, 1, nh, hd).transpose(1, 2)
            v = sa.v_proj(x).view(b, 1, nh, hd).transpose(1, 2)
            k_all, v_all = self.k_cache[i], self.v_cache[i]
            k_all.index_copy_(2, pos, k)
            v_all.index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=1.0)
            h = h + sa.out_proj(o.transpose(1, 2).reshape(b, 1, -1))
            ca = layer.encoder_attn
            x = layer.encoder_attn_layer_norm(h)
            q = (ca.q_proj(x) * self._scaling).view(b, 1, nh, hd).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q, self.cross_k[i, :, :, :t], self.cross_v[i, :, :, :t], scale=1.0
            )
            h = h + ca.out_proj(o.transpose(1, 2).reshape(b, 1, -1))
            x = layer.final_layer_norm(h)
            h = h + layer.fc2(layer.activation_fn(layer.fc1(x)))
        logits = self._proj(self._dec.layer_norm(h))[:, -1, :].float() + self.bias
        torch.argmax(logits, dim=-1, out=self._next)
        prob = torch.softmax(logits, dim=-1).gather(1, self._probe.expand(b, 1)).squeeze(1)
        self._probe_first.copy_(torch.where(pos == 0, prob, self._probe_first))
        # the next step feeds the pick unless the host sets ``_tok`` first (teacher forcing): greedy steps
        # chain on the device, several to a graph
        self._tok.copy_(self._next.view(b, 1))
        self._hit.logical_or_(self._next == self._eos)
        self.pos.add_(1)
        return logits

    def _steps_impl(self, t: int, steps: int) -> torch.Tensor:
        logits = self._step_impl(t)
        for _ in range(steps - 1):
            logits = self._step_impl(t)
        return logits

    def _graph_for(self, t: int, steps: int = 1) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The graph of ``steps`` chained steps over ``t`` encoder frames, and its last step's logits."""
        got = self._graphs.get((t, steps))
        if got is not None:
            return got
        state = self._step_state()
        saved = [x.clone() for x in state]
        saved_pos = saved[0]  # _step_state() lists pos first
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                self.pos.copy_(saved_pos)
                self._steps_impl(t, steps)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            self.pos.copy_(saved_pos)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                logits = self._steps_impl(t, steps)
            # Capture ran the steps once for real: restore what they touched.
            for x, old in zip(state, saved, strict=True):
                x.copy_(old)
        self._graphs[(t, steps)] = (graph, logits)
        return graph, logits

    def capture(self, enc_frames: int) -> None:
        """Capture the step, and the chain of :attr:`CHAIN` steps, for ``enc_frames`` encoder positions ahead
        of time (no-op without graphs)."""
        if self.use_graph:
            self._graph_for(enc_frames)
            self._graph_for(enc_frames, self.CHAIN)

    def _run(self, steps: int = 1) -> torch.Tensor:
        if self.enc_len == 0:
            raise RuntimeError("set_encoder first")
        if self.length + steps > self.max_len:
            raise RuntimeError(f"decoder cache full ({self.max_len} tokens)")
        with torch.no_grad():
            if self.use_graph:
                graph, logits = self._graph_for(self.enc_len, steps)
                graph.replay()
            else:
                logits = self._steps_impl(self.enc_len, steps)
        self.length += steps
        return logits

    def step(self, token_id: int | torch.Tensor) -> torch.Tensor:
        """Feed one token per row and return the next-token logits ``[batch, vocab]`` (float32, bias added).

        With a graph the result is a static buffer the next step overwrites: read or clone it first."""
        with torch.no_grad():
            if isinstance(token_id, int):
                self._tok.fill_(token_id)
            else:
                self._tok.copy_(token_id.reshape(self.batch, 1))
        self._prompted = False
        return self._run()

    def set_suppressed(self, token_ids: Sequence[int]) -> None:
        """Token ids that greedy decoding never picks (a -inf bias on their logits)."""
        with torch.no_grad():
            self.bias.zero_()
            ids = [i for i in token_ids if 0 <= i < self.vocab]
            if ids:
                self.bias[torch.tensor(ids, device=self.device)] = float("-inf")
            self._base_bias.copy_(self.bias)
            for key, begin in self._begin_bias.items():  # in place: captured graphs read them
                self._fill_begin(begin, key)

    def set_probe(self, token_id: int) -> None:
        """The token whose probability after the first fed token :meth:`probe_first` gives (Whisper's
        no-speech probability after <|startoftranscript|>), read with the decode's ids instead of a step
        of its own."""
        if not 0 <= token_id < self.vocab:
            raise ValueError(f"token id {token_id} is outside the vocabulary ({self.vocab})")
        with torch.no_grad():
            self._probe.fill_(token_id)

    def probe_first(self) -> list[float]:
        """Each row's probability of the :meth:`set_probe` token at the first position of the last decode
        (softmax of the logits, the suppression bias included)."""
        out: list[float] = self._probe_first.tolist()
        return out

    def _begin_bias_for(self, begin_suppress: Sequence[int]) -> torch.Tensor:
        """The bias of the first generated step: the suppression plus ``begin_suppress`` (made once)."""
        key = tuple(int(i) for i in begin_suppress if 0 <= int(i) < self.vocab)
        got = self._begin_bias.get(key)
        if got is None:
            got = torch.empty_like(self._base_bias)
            self._fill_begin(got, key)
            self._begin_bias[key] = got
        return got

    def _fill_begin(self, bias: torch.Tensor, key: tuple[int, ...]) -> None:
        with torch.no_grad():
            bias.copy_(self._base_bias)
            if key:
                bias[torch.tensor(list(key), device=self.device)] = float("-inf")

    def greedy(
        self,
        prompt: Sequence[int],
        max_new: int,
        eos: int | None = None,
        begin_suppress: Sequence[int] = (),
        check_every: int | None = None,
    ) -> torch.Tensor:
        """Greedy decode after ``prompt`` (all rows alike): up to ``max_new`` new ids ``[batch, n]`` on the
        device (see :meth:`greedy_ids`)."""
        return torch.tensor(
            self.greedy_ids(prompt, max_new, eos, begin_suppress, check_every), device=self.device
        )

    def greedy_ids(
        self,
        prompt: Sequence[int],
        max_new: int,
        eos: int | None = None,
        begin_suppress: Sequence[int] = (),
        check_every: int | None = None,
    ) -> list[list[int]]:
        """Greedy decode after ``prompt`` (all rows alike): up to ``max_new`` new ids a row. The steps chain on
        the device, :attr:`CHAIN` to a graph replay; with ``eos`` the host checks for it after the first pick
        and then every ``check_every`` (default :attr:`CHAIN`) steps (a sync), and stops once every row has
        emitted it; ids after a row's EOS are EOS, cut after the first column where every row has ended.
        Without ``eos`` exactly ``max_new`` steps run. Few torch calls: each gives up the GIL and waits to
        take it back, ~5 ms apiece beside busy threads."""
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) + max_new - 1 > self.max_len:
            raise RuntimeError(f"{len(prompt)} + {max_new} tokens exceed max_len {self.max_len}")
        every = max(1, self.CHAIN if check_every is None else check_every)
        eos_id = -1 if eos is None else int(eos)
        fed = self._prompted and list(prompt) == self._prompt and tuple(begin_suppress) == self._prompt_begin
        self._prompted = False  # a second decode over the same encoder output feeds it again
        with torch.no_grad():
            if eos_id != self._eos_id:
                self._eos.fill_(eos_id)
                self._eos_id = eos_id
            if not fed:  # (set_prompt's prompt is fed by the encoder's graph)
                self._feed_prompt(prompt, begin_suppress)
            n = 1
            while n < max_new:
                if eos is not None and (n - 1) % every == 0 and bool(self._hit.all()):
                    break
                # a whole chain where the cache has room, even past max_new (its extra ids are cut)
                k = every if every == self.CHAIN and self.length + every <= self.max_len else 1
                self._run(k)
                n += k
            p = len(prompt)
            rows: list[list[int]] = torch.cat(
                [self._ids[:, p : p + n - 1], self._next.view(-1, 1)], 1
            ).tolist()
        rows = [row[:max_new] for row in rows]
        if eos is not None:
            for row in rows:
                if eos in row:
                    at = row.index(eos)
                    row[at:] = [eos] * (len(row) - at)
            ended = [row.index(eos) for row in rows if eos in row]
            if len(ended) == len(rows):  # cut after the first column where every row has ended
                cut = max(ended) + 1
                rows = [row[:cut] for row in rows]
        return rows


# ---------------------------------------------------------------------- the eager reference


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "past_key_values", None)
    return cache if cache is not None else getattr(out, "cache", None)


def _cache_kwarg(model: nn.Module) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (earlier 5.x), whichever ``forward`` takes."""
    params = inspect.signature(cast(Any, model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def eager_teacher_forced(model: nn.Module, features: torch.Tensor, feed: torch.Tensor) -> torch.Tensor:
    """HF's own forward with its cache, one decoder token at a time: logits ``[T, batch, vocab]`` (float32)
    after each token of ``feed`` (``[batch, T]``)."""
    m: Any = model
    kw = _cache_kwarg(model)
    with torch.no_grad():
        enc = m.model.encoder(features.to(m.device, m.dtype))
        cache: Any = None
        steps = []
        for i in range(feed.shape[1]):
            out = m(
                encoder_outputs=enc,
                decoder_input_ids=feed[:, i : i + 1].to(m.device),
                **{kw: cache},
                use_cache=True,
            )
            cache = _cache_of(out)
            steps.append(out.logits[:, -1, :].float())
    return torch.stack(steps)


def graph_teacher_forced(
    dec: WhisperGraphDecoder, features: torch.Tensor, feed: torch.Tensor
) -> torch.Tensor:
    """The same through :class:`WhisperGraphDecoder`: logits ``[T, batch, vocab]`` (float32, no bias)."""
    dec.set_features(features)
    dec.reset()  # teacher forcing from position 0, whatever prompt the decoder feeds itself
    with torch.no_grad():
        dec.bias.zero_()
    return torch.stack([dec.step(feed[:, i].to(dec.device)).clone() for i in range(feed.shape[1])])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error of ``a`` against ``b`` (per call: the whole tensor)."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))
