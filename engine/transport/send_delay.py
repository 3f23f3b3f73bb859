"""How long a track's frames take from their pts time to the wire (for lip-phase compensation)."""

from __future__ import annotations


class SendDelay:
    """Exponential average of how long a track's frames take from their pts time to the wire:
    how late ``recv`` returned, plus how long the sender took before asking for the next frame
    (aiortc encodes and sends in between)."""

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.value_s = 0.0
        self._returned: float | None = None
        self._late_s = 0.0

    def returned(self, now: float, late_s: float) -> None:
        self._returned = now
        self._late_s = max(0.0, late_s)

    def next_requested(self, now: float) -> None:
        if self._returned is None:
            return
        busy = now - self._returned
        self._returned = None
        sample = self._late_s + busy
        self.value_s += self.alpha * (sample - self.value_s)
