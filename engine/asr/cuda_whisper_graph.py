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

    def __init__(
        self,
        model: nn.Module,
        max_len: int = 448,
        batch: int = 1,
        use_graph: bool | None = None,
        encoder_graphs: bool | None = None,
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
            self._next = torch.zeros(batch, dtype=torch.long, device=dev)
        self.enc_len = 0  # encoder frames (after the stride-2 conv) whose cross K/V are set
        self.length = 0  # host mirror of ``pos``
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.use_graph = (dev.type == "cuda") if use_graph is None else use_graph
        if self.use_graph and dev.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.encoder_graphs = self.use_graph if encoder_graphs is None else encoder_graphs and self.use_graph
        self.n_mels = int(cast(Any, inner.encoder.conv1).in_channels)
        # mel frames -> (graph, its static input); the encoder graphs share one memory pool (they never run
        # at once: a decoder is one decode at a time, and their outputs are the static cross K/V)
        self._enc_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
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
        frames = int(features.shape[-1])
        if not self.encoder_graphs:
            self.set_encoder(self.encode(features))
            return
        if int(features.shape[0]) != self.batch:
            raise ValueError(f"features {tuple(features.shape)} do not fit batch {self.batch}")
        graph, mel = self._encoder_graph_for(frames)
        with torch.no_grad():
            mel.copy_(features, non_blocking=True)
            graph.replay()
        self.enc_len = frames // 2
        self.reset()

    def _encoder_graph_for(self, frames: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        got = self._enc_graphs.get(frames)
        if got is not None:
            return got
        mel = torch.zeros(self.batch, self.n_mels, frames, dtype=self.dtype, device=self.device)
        saved_k, saved_v = self.cross_k.clone(), self.cross_v.clone()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                self._cross_kv(self.encode(mel))
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._enc_pool is None:
            self._enc_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            with torch.cuda.graph(graph, pool=self._enc_pool, capture_error_mode="thread_local"):
                self._cross_kv(self.encode(mel))
            self.cross_k.copy_(saved_k)  # capture ran it once for real
            self.cross_v.copy_(saved_v)
        self._enc_graphs[frames] = (graph, mel)
        return graph, mel

    def capture_encoder(self, frames: int) -> None:
        """Capture the encoder for ``frames`` mel frames ahead of time (no-op without encoder graphs)."""
        if self.encoder_graphs:
            self._encoder_graph_for(frames)

    def reset(self) -> None:
        """Start decoding again at position 0 over the same encoder output."""
        with torch.no_grad():
            self.pos.zero_()
        self.length = 0

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
        self.pos.add_(1)
        return logits

    def _graph_for(self, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        got = self._graphs.get(t)
        if got is not None:
            return got
        saved_pos = self.pos.clone()
        saved_k, saved_v = self.k_cache.clone(), self.v_cache.clone()
        saved_ids, saved_next = self._ids.clone(), self._next.clone()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                self.pos.copy_(saved_pos)
                self._step_impl(t)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            self.pos.copy_(saved_pos)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                logits = self._step_impl(t)
            # Capture ran the step once for real: restore what it touched.
            self.pos.copy_(saved_pos)
            self.k_cache.copy_(saved_k)
            self.v_cache.copy_(saved_v)
            self._ids.copy_(saved_ids)
            self._next.copy_(saved_next)
        self._graphs[t] = (graph, logits)
        return graph, logits

    def capture(self, enc_frames: int) -> None:
        """Capture the step for ``enc_frames`` encoder positions ahead of time (no-op without graphs)."""
        if self.use_graph:
            self._graph_for(enc_frames)

    def _run(self) -> torch.Tensor:
        if self.enc_len == 0:
            raise RuntimeError("set_encoder first")
        if self.length >= self.max_len:
            raise RuntimeError(f"decoder cache full ({self.max_len} tokens)")
        with torch.no_grad():
            if self.use_graph:
                graph, logits = self._graph_for(self.enc_len)
                graph.replay()
            else:
                logits = self._step_impl(self.enc_len)
        self.length += 1
        return logits

    def step(self, token_id: int | torch.Tensor) -> torch.Tensor:
        """Feed one token per row and return the next-token logits ``[batch, vocab]`` (float32, bias added).

        With a graph the result is a static buffer the next step overwrites: read or clone it first."""
        with torch.no_grad():
            if isinstance(token_id, int):
                self._tok.fill_(token_id)
            else:
                self._tok.copy_(token_id.reshape(self.batch, 1))
        return self._run()

    def set_suppressed(self, token_ids: Sequence[int]) -> None:
        """Token ids that greedy decoding never picks (a -inf bias on their logits)."""
        with torch.no_grad():
            self.bias.zero_()
            ids = [i for i in token_ids if 0 <= i < self.vocab]
            if ids:
                self.bias[torch.tensor(ids, device=self.device)] = float("-inf")

    def greedy(
        self,
        prompt: Sequence[int],
        max_new: int,
        eos: int | None = None,
        begin_suppress: Sequence[int] = (),
        check_every: int = 4,
    ) -> torch.Tensor:
        """Greedy decode after ``prompt`` (all rows alike): up to ``max_new`` new ids ``[batch, n]`` on the
        device. With ``eos`` the host checks for it every ``check_every`` steps (a sync) and stops once every
        row has emitted it; ids after a row's EOS are EOS. Without ``eos`` exactly ``max_new`` steps run, with
        no host synchronisation."""
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) + max_new - 1 > self.max_len:
            raise RuntimeError(f"{len(prompt)} + {max_new} tokens exceed max_len {self.max_len}")
        self.reset()
        for tok in prompt[:-1]:
            self.step(int(tok))
        saved = self.bias.clone() if begin_suppress else None
        if saved is not None:
            with torch.no_grad():
                self.bias[torch.tensor(list(begin_suppress), device=self.device)] = float("-inf")
        self.step(int(prompt[-1]))
        if saved is not None:
            with torch.no_grad():
                self.bias.copy_(saved)
        out = torch.empty(self.batch, max_new, dtype=torch.long, device=self.device)
        n = 0
        with torch.no_grad():
            while True:
                out[:, n] = self._next
                n += 1
                if n >= max_new:
                    break
                if eos is not None and n % check_every == 0 and bool((out[:, :n] == eos).any(dim=1).all()):
                    break
                self._tok.copy_(self._next.view(self.batch, 1))
                self._run()
        ids = out[:, :n]
        if eos is not None:
            hit = (ids == eos).int().cumsum(dim=1) > 0
            ids = ids.masked_fill(hit, eos)
            ends = hit.all(dim=0).nonzero()
            if ends.numel():  # cut after the first column where every row has ended
                ids = ids[:, : int(ends[0, 0]) + 1]
        return ids


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
    with torch.no_grad():
        dec.bias.zero_()
    return torch.stack([dec.step(feed[:, i].to(dec.device)).clone() for i in range(feed.shape[1])])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error of ``a`` against ``b`` (per call: the whole tensor)."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))
