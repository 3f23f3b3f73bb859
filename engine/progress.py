"""Progress feedback for long loads (model dequantizing, first downloads, plan builds)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO


class Progress(Protocol):
    def __call__(self, stage: str, message: str, fraction: float | None = None) -> None: ...


class ConsoleProgress:
    """Writes one line per update to stderr (a TTY gets the line rewritten in place)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._tty = self.stream.isatty()

    def __call__(self, stage: str, message: str, fraction: float | None = None) -> None:
        pct = f" {fraction * 100:5.1f}%" if fraction is not None else ""
        line = f"[{stage}]{pct} {message}"
        if self._tty and fraction is not None and fraction < 1.0:
            self.stream.write("\r" + line.ljust(79))
        else:
            self.stream.write(("\r" if self._tty else "") + line + "\n")
        self.stream.flush()


def silent_progress(stage: str, message: str, fraction: float | None = None) -> None:
    return None


@contextmanager
def timed(progress: Progress, stage: str, what: str) -> Iterator[None]:
    """Report the start and the duration of a load."""
    progress(stage, f"loading {what}...")
    start = time.perf_counter()
    yield
    progress(stage, f"{what} ready in {time.perf_counter() - start:.1f}s", 1.0)
