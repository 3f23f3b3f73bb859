"""Replies generated at the same time decode together: one :class:`BatchedDecoder` step for all of them.

Each reply runs in its own generation thread on a row of the batched cache (its slot) and feeds its next
token through :meth:`SharedStep.step`. The step is launched when every reply that is decoding has handed its
token in; the thread that completes the set launches it for all. A reply that is not back ``gather_s`` after
its last step was launched (held up elsewhere: its consumer behind, say) is not waited for. The window
counts from that reply's own last launch, not from the waiting one's arrival: a reply comes back one device
step plus one pick after its launch, so replies that fell out of step (one launched alone while another
was still picking) meet again at the next step instead of taking turns. Launching only queues the graph on
the device, so each reply then reads its own logits (its sampler waits for the device) while the next set
gathers. A reply joins with its first token and leaves when it ends (:meth:`leave`).

Why: decoding a token reads all the weights whatever the batch, so four replies stepping one by one cost
four reads of the weights a token each; stepped together, about one.
"""

from __future__ import annotations

import threading
import time

import torch

from engine.llm.cuda_graph_decode import BatchedDecoder

GATHER_S = 0.025  # after its last launch, how long a decoding reply's next token is waited for


class SharedStep:
    """The gathering of the decoding rows' tokens into steps of one :class:`BatchedDecoder`. Thread-safe."""

    def __init__(self, decoder: BatchedDecoder, gather_s: float = GATHER_S) -> None:
        self.decoder = decoder
        self.gather_s = gather_s
        self._cond = threading.Condition()
        self._joined: set[int] = set()  # rows decoding a reply
        self._pending: dict[int, int] = {}  # row -> the token it handed in
        self._served: set[int] = set()  # rows whose token was stepped, not yet collected
        self._launched: dict[int, float] = {}  # row -> when its last step was launched (monotonic)
        self._failed: dict[int, BaseException] = {}
        self.steps = 0
        self.rows_stepped = 0  # over ``steps``: the mean batch

    def step(self, row: int, token: int) -> torch.Tensor:
        """Feed ``token`` to ``row``; its next logits ``[1, vocab]`` (a view of the decoder's output, valid
        until this row is stepped again)."""
        dec = self.decoder
        if dec.rows[row].length >= dec.max_len:
            raise RuntimeError(f"KV cache full ({dec.max_len} tokens)")
        with self._cond:
            if row in self._pending:
                raise RuntimeError(f"row {row} already has a token waiting")
            self._joined.add(row)
            self._pending[row] = token
            while row not in self._served:
                left = self._wait_left()
                if left <= 0:
                    self._launch()
                else:
                    self._cond.wait(left)
            self._served.discard(row)
            error = self._failed.pop(row, None)
        if error is not None:
            raise RuntimeError("the shared decode step failed") from error
        return dec.out[row : row + 1]

    def _wait_left(self) -> float:
        """Seconds to go before the pending rows are stepped without the decoding rows not back yet (0: now)."""
        away = self._joined - self._pending.keys()
        if not away:
            return 0.0
        now = time.monotonic()
        return max(self._launched.get(r, now) + self.gather_s for r in away) - now

    def _launch(self) -> None:
        """Step every pending row (the lock held: launching only queues work on the device)."""
        batch = dict(self._pending)
        self._pending.clear()
        try:
            self.decoder.step_rows(batch)
        except Exception as e:  # each waiting reply gets the error, not a hang
            self._failed.update(dict.fromkeys(batch, e))
        now = time.monotonic()
        self._launched.update(dict.fromkeys(batch, now))
        self.steps += 1
        self.rows_stepped += len(batch)
        self._served.update(batch)
        self._cond.notify_all()

    def leave(self, row: int) -> None:
        """``row``'s reply has ended: the others no longer wait for its tokens."""
        with self._cond:
            self._joined.discard(row)
            self._pending.pop(row, None)
            self._served.discard(row)
            self._failed.pop(row, None)
            self._launched.pop(row, None)
            self._cond.notify_all()

    def mean_batch(self) -> float:
        with self._cond:
            return self.rows_stepped / self.steps if self.steps else 0.0
