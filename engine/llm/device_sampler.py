"""Sampling on the logits' own device, one CUDA graph a decode slot: the GPU decode path's sampler.

The same controls as :mod:`engine.llm.sampling` (the numpy sampler of the llama.cpp path) and as the
transformers processors of the eager path: the reply's repetition penalty, its no-repeat n-gram bans,
temperature, then nucleus (top-p) sampling, or greedy at temperature 0.

Why not those processors here: every torch call from Python lets go of the GIL and takes it back, and the
processors cost ~20 calls and 2–3 host synchronisations a token. In an engine serving several sessions,
where encoders, the event loop and Piper want the GIL too, each of those hand-overs can wait out a switch
interval: the 1.5B decode ran at 35–50 tokens/s inside a 4-session engine against 165–176 alone. Here a
token costs three calls (the logits copied into the sampler's buffer, one graph replay, the token read),
plus two when the n-gram bans change.

State lives on the device: a per-token scale for the penalty (1 until the token is in the reply), an
additive ban row (0 or -inf), the logit bias of a random-weight shape (0 or -inf), and the settings as
0-d tensors, so one captured graph serves every call and every sibling's settings. The sampled token's
penalty is set inside the graph. Nucleus sampling sorts the full row on the device (a flat distribution,
as a random-weight model gives, keeps most of the vocabulary) and draws with the exponential-race trick
(``argmax(p / E)``, ``E ~ Exp(1)``), which the graph can replay with fresh noise each time.
"""

from __future__ import annotations

import torch

from engine.llm.sampling import banned_by_ngrams

KEEP_ALL = 2.0  # a top-p threshold no cumulative mass reaches: keep every token
TINY = 1e-30  # the exponential noise's floor (a 0 would make 0 / 0 a NaN, which argmax prefers)


class DeviceSampler:
    """Picks the next token from ``[1, vocab]`` logits on ``device``; a graph when ``use_graph``.

    Per reply: :meth:`begin` with the reply's settings, then :meth:`pick` once a token. Not thread-safe:
    one decode slot, one sampler.
    """

    def __init__(self, vocab: int, dtype: torch.dtype, device: torch.device, use_graph: bool) -> None:
        self.vocab = vocab
        self.device = device
        f32 = torch.float32
        with torch.no_grad():
            self._logits = torch.zeros((1, vocab), dtype=dtype, device=device)
            self._scale_pos = torch.ones(vocab, dtype=f32, device=device)  # 1, or 1/penalty once in the reply
            self._scale_neg = torch.ones(vocab, dtype=f32, device=device)  # 1, or penalty
            self._ban = torch.zeros(vocab, dtype=f32, device=device)  # -inf where a token repeats an n-gram
            self._bias = torch.zeros(vocab, dtype=f32, device=device)
            self._noise = torch.ones(vocab, dtype=f32, device=device)
            self._inv_temp = torch.ones((), dtype=f32, device=device)
            self._top_p = torch.full((), KEEP_ALL, dtype=f32, device=device)
            self._penalty = torch.ones((), dtype=f32, device=device)
            self._greedy = torch.zeros((), dtype=torch.bool, device=device)
            self.token = torch.zeros(1, dtype=torch.long, device=device)
        self._banned: list[int] = []
        self._ngram = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        if use_graph:
            if device.type != "cuda":
                raise ValueError("a sampler graph needs a CUDA device")
            self._capture()

    # ---- per reply

    def begin(
        self,
        temperature: float,
        top_p: float,
        repetition_penalty: float,
        no_repeat_ngram_size: int,
        bias: torch.Tensor | None = None,
    ) -> None:
        """A new reply: no token penalised or banned yet; these settings (``bias``: ``[1, vocab]``, added to
        the logits, or None)."""
        with torch.no_grad():
            self._scale_pos.fill_(1.0)
            self._scale_neg.fill_(1.0)
            if self._banned:
                self._ban.zero_()
            self._banned = []
            if bias is None:
                self._bias.zero_()
            else:
                self._bias.copy_(bias.reshape(self.vocab))
            greedy = temperature <= 0
            self._greedy.fill_(greedy)
            self._inv_temp.fill_(1.0 if greedy else 1.0 / temperature)
            self._top_p.fill_(top_p if top_p < 1.0 else KEEP_ALL)
            self._penalty.fill_(repetition_penalty)
        self._ngram = no_repeat_ngram_size

    def pick(self, logits: torch.Tensor, reply: list[int]) -> int:
        """The next token after ``reply`` (the tokens picked so far in this reply) given ``logits``
        (``[1, vocab]``, not modified)."""
        with torch.no_grad():
            self._logits.copy_(logits)
            banned = sorted(banned_by_ngrams(reply, self._ngram))
            if banned != self._banned:
                if self._banned:
                    self._ban.zero_()
                if banned:
                    self._ban[torch.tensor(banned, dtype=torch.long)] = float("-inf")
                self._banned = banned
            if self._graph is not None:
                self._graph.replay()
            else:
                self._draw()
            return int(self.token)

    # ---- the work, eager or captured

    def _draw(self) -> None:
        x = self._logits[0].float()
        x = x * torch.where(x > 0, self._scale_pos, self._scale_neg) + self._ban + self._bias
        best = torch.argmax(x, dim=0, keepdim=True)
        p = torch.softmax(x * self._inv_temp, dim=0)
        sp, order = torch.sort(p, descending=True)
        sp = torch.where(torch.cumsum(sp, dim=0) - sp < self._top_p, sp, 0.0)
        self._noise.exponential_().clamp_min_(TINY)
        drawn = order.gather(0, torch.argmax(sp / self._noise, dim=0, keepdim=True))
        self.token.copy_(torch.where(self._greedy, best, drawn))
        # The picked token is penalised from the next pick on (1/penalty on a positive logit, ×penalty on a
        # negative one, as the transformers processor and the numpy sampler do).
        self._scale_pos.index_fill_(0, self.token, 0.0).index_add_(0, self.token, 1.0 / self._penalty.view(1))
        self._scale_neg.index_fill_(0, self.token, 0.0).index_add_(0, self.token, self._penalty.view(1))

    def _capture(self) -> None:
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                self._draw()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._draw()
        self._graph = graph
        self.begin(1.0, 1.0, 1.0, 0)
