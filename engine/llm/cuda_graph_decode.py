"""Decode a Llama/Qwen2-style Hugging Face model through its own static KV cache and one CUDA graph a step.

Eager ``generate`` on a GPU is bound by kernel-launch overhead (hundreds of small launches per token), not by
arithmetic. This module owns the decode step instead of going through the model's ``forward``:

* K/V live in two static tensors ``[layers, batch, kv_heads, max_len, head_dim]`` owned here;
* the position of the next token lives in a device tensor, so a step reads no host state;
* a step uses the model's own embeddings, projections, RMSNorms, MLPs, rotary table and LM head, writes its
  K/V with ``index_copy_`` at that position and attends with ``scaled_dot_product_attention`` over the whole
  buffer under the mask ``arange(max_len) <= pos`` (``enable_gqa``);
* on CUDA the whole step (all layers, the LM head and the position increment) is captured once into one
  CUDA graph and replayed; on CPU the very same step runs eagerly (that is how the CPU tests check the math).

Prefill writes into the same tensors, so a cached prefix (the persona/system prompt, the conversation so far)
is kept across turns and only the new tail is computed: :meth:`GraphDecoder.prefill_cached` finds the common
prefix by itself. With graphs, a tail is fed in chunks of ``PREFILL_CHUNK`` tokens through a second captured
graph (the same layer loop for ``PREFILL_CHUNK`` query rows at the device position, the unused rows of the last
chunk written past the end and overwritten later): a turn's tail of a few dozen tokens is then a few replays
instead of an eager forward, whose hundreds of launches cost 60-80 ms on a busy host (measured on the H200
host). Without graphs, prefill is eager (SDPA with an explicit causal mask over ``[prefix + tail]``).

:class:`BatchedDecoder` holds several conversations as the rows of one such cache and decodes the next token of
every row that asks in **one** captured step, each row at its own position (its own rotary angle, K/V write
and attention mask): decode reads the weights once a step whatever the rows, so conversations decoding at the
same time share that read instead of queueing their own steps. Each row is also a :class:`GraphDecoder` of
its own (views of the shared buffers) for its prefill.

The model's weights must not be replaced after construction (the graph holds their addresses).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

PREFILL_CHUNK = 16  # query rows of the captured prefill graph

RotaryFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Llama rotary formula, for models whose module has no ``apply_rotary_pos_emb``."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _model_rotary_fn(attn: Any) -> RotaryFn:
    """The model's own ``apply_rotary_pos_emb`` (``cos``/``sin`` come in as ``[*, T, head_dim]``)."""
    fn = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    if fn is None:
        return _apply_rotary

    def rotary(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = fn(q, k, cos, sin)  # unsqueezes cos/sin at dim 1 itself
        return out[0], out[1]

    return rotary


KVWrite = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class RowStorage:
    """One row's views of a :class:`BatchedDecoder`'s buffers: K and V ``[layers, 1, kv_heads, cap, head_dim]``,
    the position ``[1]`` and the token ids ``[1, cap]``."""

    k: torch.Tensor
    v: torch.Tensor
    pos: torch.Tensor
    ids: torch.Tensor


class GraphDecoder:
    """Static-KV, graph-replayed greedy-friendly decoder around a decoder-only HF causal LM.

    ``GraphDecoder(model, max_len, batch=1)``; then :meth:`prefill` (or :meth:`prefill_cached`) a prompt and
    :meth:`step` one token at a time. All rows of a batch share one length (no padding).

    ``use_graph`` defaults to "on CUDA"; pass ``False`` to run the same step eagerly (for debugging).
    """

    def __init__(
        self,
        model: nn.Module,
        max_len: int,
        batch: int = 1,
        use_graph: bool | None = None,
        storage: RowStorage | None = None,
    ) -> None:
        if max_len < 2:
            raise ValueError("max_len must be at least 2")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        inner = getattr(model, "model", None)
        lm_head = getattr(model, "lm_head", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or lm_head is None or any(not hasattr(inner, n) for n in needed):
            raise NotImplementedError(
                f"{type(model).__name__}: expected a Llama/Qwen2-style causal LM "
                "(model.embed_tokens, model.layers, model.norm, model.rotary_emb, lm_head)"
            )
        self.model = model
        self.config: Any = cast(Any, model).config
        self.max_len = max_len
        # The buffers are padded to a multiple of 64 positions so that the attention mask's rows stay aligned
        # for the memory-efficient SDPA kernel; only ``max_len`` of them are ever used.
        # (and hold a last prefill chunk's unused rows past ``max_len``).
        self._cap = -(-(max_len + PREFILL_CHUNK) // 64) * 64
        self.batch = batch
        # Typed loosely: these are the model's own (duck-typed) submodules.
        self._embed: Any = inner.embed_tokens
        self._layers: list[Any] = list(inner.layers)
        self._norm: Any = inner.norm
        self._lm_head: Any = lm_head
        self.vocab = int(lm_head.weight.shape[0])  # the logits' width
        attn0 = self._layers[0].self_attn
        for layer in self._layers:
            attn = layer.self_attn
            window = getattr(attn, "sliding_window", None)
            if window is not None and window < max_len:
                raise NotImplementedError("sliding-window attention layers are not supported")
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                if not hasattr(attn, name):
                    raise NotImplementedError(f"attention module {type(attn).__name__} has no {name}")
        cfg = self.config
        self.n_layers = len(self._layers)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(attn0, "head_dim", 0) or cfg.hidden_size // self.n_heads)
        self._scaling = float(getattr(attn0, "scaling", self.head_dim**-0.5))
        if self.n_heads % self.n_kv_heads:
            raise NotImplementedError("attention heads must be a multiple of the K/V heads")
        self._group = self.n_heads // self.n_kv_heads
        self._rotary = _model_rotary_fn(attn0)

        weight = self._embed.weight
        self.device: torch.device = weight.device
        self.dtype: torch.dtype = weight.dtype
        dev = self.device
        if storage is not None and batch != 1:
            raise ValueError("a row of a batched decoder has batch 1")
        with torch.no_grad():
            kv_shape = (self.n_layers, batch, self.n_kv_heads, self._cap, self.head_dim)
            if storage is None:
                self.k_cache = torch.zeros(kv_shape, dtype=self.dtype, device=dev)
                self.v_cache = torch.zeros(kv_shape, dtype=self.dtype, device=dev)
            else:
                self.k_cache, self.v_cache = storage.k, storage.v
            # The model's own rotary embedding, evaluated once for every position: [max_len, head_dim].
            positions = torch.arange(self._cap, device=dev).unsqueeze(0)
            probe = torch.zeros(1, 1, self.head_dim, dtype=self.dtype, device=dev)
            cos, sin = inner.rotary_emb(probe, positions)
            self._cos = cos[0].contiguous()
            self._sin = sin[0].contiguous()
            self._arange = torch.arange(self._cap, device=dev)
            # Device-side state of a step: the position of the token being fed, that token, the token ids.
            self.pos = torch.zeros(1, dtype=torch.long, device=dev) if storage is None else storage.pos
            self._tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
            self._ids = (
                torch.zeros(batch, self._cap, dtype=torch.long, device=dev)
                if storage is None
                else storage.ids
            )
            # The prefill chunk: its token ids, how many of them are real, and their offsets from ``pos``.
            self._chunk_tok = torch.zeros(batch, PREFILL_CHUNK, dtype=torch.long, device=dev)
            self._chunk_n = torch.ones(1, dtype=torch.long, device=dev)
            self._chunk_offsets = torch.arange(PREFILL_CHUNK, device=dev)
        self.length = 0  # host mirror of ``pos``: tokens held in the cache
        self._graph: torch.cuda.CUDAGraph | None = None
        self._logits: torch.Tensor | None = None
        self._chunk_graph: torch.cuda.CUDAGraph | None = None
        self._chunk_logits: torch.Tensor | None = None
        self.use_graph = (dev.type == "cuda") if use_graph is None else use_graph
        if self.use_graph:
            if dev.type != "cuda":
                raise ValueError("CUDA graphs need the model on a CUDA device")
            self._capture()

    # ------------------------------------------------------------------ the step

    def _attn_qkv(
        self, attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections (+ optional per-head q/k norms) and rotary: ``[B, heads, T, head_dim]`` each."""
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, -1, self.head_dim)
        k = attn.k_proj(x).view(b, t, -1, self.head_dim)
        v = attn.v_proj(x).view(b, t, -1, self.head_dim)
        q_norm = getattr(attn, "q_norm", None)
        k_norm = getattr(attn, "k_norm", None)
        if q_norm is not None and k_norm is not None:  # Qwen3-style per-head norms
            q, k = q_norm(q), k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = self._rotary(q, k, cos, sin)
        return q, k, v

    def _cached_layers(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, write: KVWrite
    ) -> torch.Tensor:
        """All layers for the ``T`` tokens ``h`` ``[B, T, H]`` with their rotary ``cos``/``sin``: their K/V
        put into the static cache by ``write(k_all, v_all, k, v)``, attention over the whole cache under
        ``mask`` (rows grouped as (head in group, position), broadcastable to ``[B, 1, group * T, cap]``).
        Returns the hidden states."""
        b, t, g = h.shape[0], h.shape[1], self._group
        kvh, hd = self.n_kv_heads, self.head_dim
        for i, layer in enumerate(self._layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q, k, v = self._attn_qkv(attn, x, cos, sin)
            k_all, v_all = self.k_cache[i], self.v_cache[i]
            write(k_all, v_all, k, v)
            # GQA without repeating K/V and without enable_gqa (masked GQA falls back to the math kernel on
            # CUDA, as transformers' SDPA integration notes): the queries of the heads that share a K/V head
            # become that K/V head's query rows.
            qg = q.reshape(b, kvh, g * t, hd)
            o = F.scaled_dot_product_attention(qg, k_all, v_all, attn_mask=mask, scale=self._scaling)
            o = o.view(b, kvh, g, t, hd).permute(0, 3, 1, 2, 4)
            h = h + attn.o_proj(o.reshape(b, t, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h

    def _layers_at(self, h: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """:meth:`_cached_layers` for tokens at the device ``positions`` ``[T]``, the same for every row."""
        cos = self._cos.index_select(0, positions).unsqueeze(0)  # [1, T, head_dim]
        sin = self._sin.index_select(0, positions).unsqueeze(0)

        def write(k_all: torch.Tensor, v_all: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
            k_all.index_copy_(2, positions, k)
            v_all.index_copy_(2, positions, v)

        return self._cached_layers(h, cos, sin, mask, write)

    def _step_impl(self) -> torch.Tensor:
        """One token for every row at position ``self.pos``; returns logits ``[B, vocab]``."""
        pos = self.pos
        self._ids.index_copy_(1, pos, self._tok)
        mask = (self._arange <= pos).view(1, 1, 1, self._cap)
        h = self._layers_at(self._embed(self._tok), pos, mask)
        logits = self._lm_head(self._norm(h))[:, -1, :]
        self.pos.add_(1)
        return logits

    def _chunk_impl(self) -> torch.Tensor:
        """``PREFILL_CHUNK`` tokens for every row at positions ``pos ..``, of which the first ``_chunk_n`` are
        real; returns the logits after the last real one ``[B, vocab]`` and advances ``pos`` by ``_chunk_n``.
        The other rows' K/V land past the new end, where the mask hides them until they are overwritten."""
        g, t = self._group, PREFILL_CHUNK
        positions = self.pos + self._chunk_offsets  # [T]
        self._ids.index_copy_(1, positions, self._chunk_tok)
        mask = (self._arange.view(1, -1) <= positions.view(-1, 1)).repeat(g, 1).view(1, 1, g * t, self._cap)
        h = self._layers_at(self._embed(self._chunk_tok), positions, mask)
        last = h.index_select(1, self._chunk_n - 1)  # [B, 1, H]
        logits = self._lm_head(self._norm(last))[:, -1, :]
        self.pos.add_(self._chunk_n)
        return logits

    def _capture(self) -> None:
        """Capture one step and one prefill chunk (called while the cache is empty)."""
        (self._graph, self._logits), (self._chunk_graph, self._chunk_logits) = self._capture_graphs(
            self._step_impl, self._chunk_impl
        )

    def _capture_graphs(
        self, *impls: Callable[[], torch.Tensor]
    ) -> list[tuple[torch.cuda.CUDAGraph, torch.Tensor]]:
        """Warm ``impls`` up on a side stream, then capture each into a graph of its own: (graph, its output
        buffer) each. The position is restored after every run and the cache emptied at the end."""
        saved_pos = self.pos.clone()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                for impl in impls:
                    self.pos.copy_(saved_pos)
                    impl()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        captured: list[tuple[torch.cuda.CUDAGraph, torch.Tensor]] = []
        with torch.no_grad():
            for impl in impls:
                graph = torch.cuda.CUDAGraph()
                self.pos.copy_(saved_pos)
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    out = impl()
                captured.append((graph, out))
            self.pos.copy_(saved_pos)
            self.k_cache.zero_()
            self.v_cache.zero_()
            self._ids.zero_()
        return captured

    def step(self, token_id: int | torch.Tensor) -> torch.Tensor:
        """Feed one token per row (an int, or a tensor of ``batch`` ids, ideally already on the device) and
        return the next-token logits ``[batch, vocab]`` in the model dtype.

        With a graph the result is a static buffer that the next step overwrites: read or clone it first.
        No host synchronisation happens here, so ``tok = logits.argmax(-1)`` can feed the next step as is.
        """
        if self.length >= self.max_len:
            raise RuntimeError(f"KV cache full ({self.max_len} tokens)")
        with torch.no_grad():
            if isinstance(token_id, int):
                self._tok.fill_(token_id)
            else:
                self._tok.copy_(token_id.reshape(self.batch, 1))
            if self._graph is not None:
                self._graph.replay()
                logits = self._logits
                assert logits is not None
            else:
                logits = self._step_impl()
        self.length += 1
        return logits

    # ------------------------------------------------------------------ prefill and cache control

    def prefill(self, input_ids: torch.Tensor, start_pos: int, all_logits: bool = False) -> torch.Tensor:
        """Run ``input_ids`` (``[batch, T]`` or ``[T]``) at positions ``start_pos .. start_pos+T-1`` on top of the
        first ``start_pos`` cached tokens (which must be held: ``start_pos <= length``); anything cached
        beyond ``start_pos`` is dropped. Returns the last position's logits ``[batch, vocab]`` (or all of them,
        ``[batch, T, vocab]``, with ``all_logits``)."""
        ids = input_ids.reshape(self.batch, -1) if input_ids.dim() < 2 else input_ids
        if ids.shape[0] != self.batch:
            raise ValueError(f"expected {self.batch} rows, got {ids.shape[0]}")
        t = ids.shape[1]
        if t < 1:
            raise ValueError("prefill needs at least one token")
        if not 0 <= start_pos <= self.length:
            raise ValueError(f"start_pos {start_pos} beyond the {self.length} cached tokens")
        end = start_pos + t
        if end > self.max_len:
            raise RuntimeError(f"prompt of {end} tokens exceeds max_len {self.max_len}")
        ids = ids.to(self.device)
        if self._chunk_graph is not None and not all_logits:
            return self.prefill_chunked(ids, start_pos)
        b = self.batch
        with torch.no_grad():
            self._ids[:, start_pos:end] = ids
            h = self._embed(ids)
            cos = self._cos[start_pos:end].unsqueeze(0)
            sin = self._sin[start_pos:end].unsqueeze(0)
            mask: torch.Tensor | None = None
            if start_pos > 0:  # query rows grouped as in ``_step_impl``: (head in group, position)
                q_pos = torch.arange(start_pos, end, device=self.device)
                mask = self._arange[:end].unsqueeze(0) <= q_pos.unsqueeze(1)
                mask = mask.repeat(self._group, 1).view(1, 1, self._group * t, end)
            g, kvh, hd = self._group, self.n_kv_heads, self.head_dim
            for i, layer in enumerate(self._layers):
                attn = layer.self_attn
                x = layer.input_layernorm(h)
                q, k, v = self._attn_qkv(attn, x, cos, sin)
                self.k_cache[i, :, :, start_pos:end] = k
                self.v_cache[i, :, :, start_pos:end] = v
                if mask is None:  # a fresh prompt: plain causal attention, the call HF's SDPA path makes
                    o = F.scaled_dot_product_attention(
                        q, k, v, is_causal=True, scale=self._scaling, enable_gqa=True
                    ).transpose(1, 2)
                else:
                    o = F.scaled_dot_product_attention(
                        q.reshape(b, kvh, g * t, hd),
                        self.k_cache[i, :, :, :end],
                        self.v_cache[i, :, :, :end],
                        attn_mask=mask,
                        scale=self._scaling,
                    )
                    o = o.view(b, kvh, g, t, hd).permute(0, 3, 1, 2, 4)
                h = h + attn.o_proj(o.reshape(b, t, -1))
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            if not all_logits:
                h = h[:, -1:, :]
            logits = self._lm_head(self._norm(h))
            self.pos.fill_(end)
        self.length = end
        return logits if all_logits else logits[:, -1, :]

    def prefill_chunked(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """:meth:`prefill` in ``PREFILL_CHUNK``-token pieces through the chunk graph (run eagerly without
        graphs: how the CPU tests check it). Returns the last position's logits ``[batch, vocab]``."""
        ids = input_ids.reshape(self.batch, -1) if input_ids.dim() < 2 else input_ids
        t = ids.shape[1]
        if t < 1 or not 0 <= start_pos <= self.length or start_pos + t > self.max_len:
            raise ValueError(
                f"cannot prefill {t} tokens at {start_pos} ({self.length} cached, max {self.max_len})"
            )
        ids = ids.to(self.device)
        logits: torch.Tensor | None = None
        with torch.no_grad():
            self.pos.fill_(start_pos)
            for off in range(0, t, PREFILL_CHUNK):
                n = min(PREFILL_CHUNK, t - off)
                self._chunk_tok[:, :n].copy_(ids[:, off : off + n])
                self._chunk_n.fill_(n)
                if self._chunk_graph is not None:
                    self._chunk_graph.replay()
                    logits = self._chunk_logits
                else:
                    logits = self._chunk_impl()
        self.length = start_pos + t
        assert logits is not None
        return logits.clone()  # the graph's output buffer is overwritten by the next chunk

    def reset_to(self, pos: int) -> None:
        """Crop the cache to its first ``pos`` tokens (a common prefix); later steps overwrite the rest."""
        if not 0 <= pos <= self.length:
            raise ValueError(f"cannot reset to {pos}: {self.length} tokens cached")
        with torch.no_grad():
            self.pos.fill_(pos)
        self.length = pos

    def cached_ids(self) -> torch.Tensor:
        """The token ids whose K/V are held, ``[batch, length]`` on the CPU (synchronises)."""
        return self._ids[:, : self.length].cpu()

    def prefill_cached(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Prefill a whole prompt, reusing the longest cached prefix it shares (all rows alike).

        Returns (last-position logits ``[batch, vocab]``, number of prompt tokens reused). At least one token
        is always recomputed, since its logits are needed."""
        ids = input_ids.reshape(self.batch, -1) if input_ids.dim() < 2 else input_ids
        ids = ids.cpu()
        held = self.cached_ids()
        n = min(held.shape[1], ids.shape[1] - 1)
        same = (held[:, :n] == ids[:, :n]).all(dim=0)
        mismatch = torch.nonzero(~same)
        common = int(mismatch[0, 0]) if mismatch.numel() else n
        self.reset_to(common)
        return self.prefill(ids[:, common:], common), common


class BatchedDecoder(GraphDecoder):
    """``rows`` conversations as the rows of one static KV cache; :meth:`step_rows` decodes the next token of
    any subset of them in one step (one graph replay on CUDA), each row at its own position.

    ``rows[r]`` is row ``r`` as a :class:`GraphDecoder` of its own over views of these buffers: prefill, crop
    and read a row there (its own graphs), never through this object. A row left out of a step keeps its K/V,
    ids, position and logits: the step writes its K/V and id at the buffer's last position, which no row ever
    uses (a prefill chunk's unused rows end ``PREFILL_CHUNK - 1`` past ``max_len``, below it), and leaves its
    logits row as it was. So a row may prefill, on the same stream, between two steps of the others.
    """

    def __init__(self, model: nn.Module, max_len: int, rows: int, use_graph: bool | None = None) -> None:
        if rows < 1:
            raise ValueError("rows must be at least 1")
        super().__init__(model, max_len, batch=rows, use_graph=False)  # the buffers; the graphs below
        dev = self.device
        with torch.no_grad():
            self.pos = torch.zeros(rows, dtype=torch.long, device=dev)
            self._scratch = torch.full((rows,), self._cap - 1, dtype=torch.long, device=dev)
            self.out = torch.zeros(rows, self.vocab, dtype=self.dtype, device=dev)  # each row's last logits
        self.use_graph = (dev.type == "cuda") if use_graph is None else use_graph
        if self.use_graph and dev.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.rows = [
            GraphDecoder(
                model,
                max_len,
                use_graph=self.use_graph,
                storage=RowStorage(
                    self.k_cache[:, r : r + 1],
                    self.v_cache[:, r : r + 1],
                    self.pos[r : r + 1],
                    self._ids[r : r + 1],
                ),
            )
            for r in range(rows)
        ]
        if self.use_graph:
            with torch.no_grad():
                self._tok.fill_(-1)
            ((self._graph, self._logits),) = self._capture_graphs(self._step_impl)

    def _step_impl(self) -> torch.Tensor:
        """The next token of every row whose ``_tok`` is a token (not -1), each at its own position; the rows'
        logits land in ``out``, the others' rows of ``out`` stay."""
        active = self._tok.view(-1) >= 0  # [rows]
        tok = self._tok.clamp_min(0)
        pos = torch.where(active, self.pos, self._scratch)
        self._ids.scatter_(1, pos.view(-1, 1), tok)
        mask = (self._arange.view(1, -1) <= pos.view(-1, 1)).view(-1, 1, 1, self._cap)
        cos = self._cos.index_select(0, pos).unsqueeze(1)  # [rows, 1, head_dim]
        sin = self._sin.index_select(0, pos).unsqueeze(1)
        where = pos.view(-1, 1, 1, 1).expand(-1, self.n_kv_heads, 1, self.head_dim)

        def write(k_all: torch.Tensor, v_all: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
            k_all.scatter_(2, where, k)
            v_all.scatter_(2, where, v)

        h = self._cached_layers(self._embed(tok), cos, sin, mask, write)
        logits = self._lm_head(self._norm(h))[:, -1, :]
        self.out.copy_(torch.where(active.view(-1, 1), logits, self.out))
        self.pos.add_(active.long())
        return self.out

    def step_rows(self, tokens: Mapping[int, int]) -> torch.Tensor:
        """Feed ``tokens`` (row -> token) in one step; returns ``out`` ``[rows, vocab]``, whose stepped rows hold
        their next logits until those rows are stepped again. No host synchronisation."""
        if not tokens:
            raise ValueError("a step needs at least one row")
        for r in tokens:
            if self.rows[r].length >= self.max_len:
                raise RuntimeError(f"KV cache row {r} full ({self.max_len} tokens)")
        feed = [-1] * len(self.rows)
        for r, token in tokens.items():
            feed[r] = token
        with torch.no_grad():
            self._tok.copy_(torch.tensor(feed, dtype=torch.long).view(-1, 1))
            if self._graph is not None:
                self._graph.replay()
            else:
                self._step_impl()
        for r in tokens:
            self.rows[r].length += 1
        return self.out

    def step(self, token_id: int | torch.Tensor) -> torch.Tensor:
        raise TypeError("a batched decoder steps rows: step_rows({row: token})")

    def prefill(self, input_ids: torch.Tensor, start_pos: int, all_logits: bool = False) -> torch.Tensor:
        raise TypeError("prefill a row of a batched decoder through .rows[row]")

    def prefill_chunked(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        raise TypeError("prefill a row of a batched decoder through .rows[row]")

    def reset_to(self, pos: int) -> None:
        raise TypeError("crop a row of a batched decoder through .rows[row]")
