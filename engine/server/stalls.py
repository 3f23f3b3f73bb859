"""A watch on the sessions' video pace: when a track's next frame is overdue, say where while it is.

A video track drops the frames it can no longer send on time (engine/transport/video_out.py); the
drop is seen only once the track runs again, when whatever held it has let go. This watch looks from
its own thread, every ``interval_s``, at each open session's track: a frame that has been rendering,
or waiting on the sender (aiortc's encode and send), for more than ``threshold_s`` is a stall, and the
watch writes one WARNING with the session, the phase, how long, and every Python thread's innermost
frames at that moment (the render thread, the encoders' workers, the models' threads, the loop), at
most once every ``cooldown_s``. Its own work is a dictionary read every 50 ms; nothing is changed.

``server.stall_report_ms`` sets the threshold (0: no watch).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Protocol

log = logging.getLogger(__name__)

STACK_FRAMES = 8  # innermost frames written per thread
# a thread whose innermost frame is one of these (function, file) is waiting for work, not doing it (a pool's
# idle worker, an event or queue wait, the loop's select): left out of the report
IDLE_FRAMES = frozenset(
    {
        ("_worker", "thread.py"),
        ("wait", "threading.py"),
        ("get", "queue.py"),
        ("select", "selectors.py"),
        ("poll", "selectors.py"),
    }
)


def _idle(frame: FrameType) -> bool:
    code = frame.f_code
    return (code.co_name, code.co_filename.rsplit("/", 1)[-1]) in IDLE_FRAMES


class PacedTrack(Protocol):
    def stalled(self) -> tuple[str, float] | None:
        """(phase, seconds) when the track's frame in hand is overdue, on the track's own clock."""
        ...


Tracks = Callable[[], Iterable[tuple[str, PacedTrack]]]


def thread_stacks(frames: int = STACK_FRAMES) -> str:
    """Every busy Python thread's innermost ``frames`` frames, each headed by its name and native id."""
    threads = {t.ident: t for t in threading.enumerate()}
    own = threading.get_ident()
    lines: list[str] = []
    for ident, frame in sys._current_frames().items():
        if ident == own or _idle(frame):
            continue
        thread = threads.get(ident)
        name = thread.name if thread is not None else "?"
        native = thread.native_id if thread is not None else "?"
        lines.append(f"--- thread {name} (tid {native})")
        lines += [line.rstrip() for line in traceback.format_stack(frame, limit=frames)]
    return "\n".join(lines)


class StallWatch:
    """The thread that watches the tracks (``start`` / ``stop``; ``check`` is one look, for tests)."""

    def __init__(
        self,
        tracks: Tracks,
        threshold_s: float,
        interval_s: float = 0.05,
        cooldown_s: float = 30.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tracks = tracks
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.cooldown_s = cooldown_s
        self.now = now
        self.stalls = 0  # stalls seen, reported or not (each counted once, at its first look)
        self._reported_at = -float("inf")
        self._in_stall: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and self.threshold_s > 0:
            self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a diagnostic never takes the engine down
                log.debug("stall watch: a look failed", exc_info=True)

    def _snapshot(self) -> list[tuple[str, PacedTrack]]:
        for _ in range(3):  # the loop may add or remove a session while we copy
            try:
                return list(self.tracks())
            except RuntimeError:
                continue
        return []

    def check(self) -> str | None:
        """One look: the report written, if a stall was found and none was reported within the cooldown."""
        now = self.now()
        stalled = []
        for name, track in self._snapshot():
            found = track.stalled()
            if found is not None and found[1] >= self.threshold_s:
                stalled.append((name, *found))
        names = {name for name, _, _ in stalled}
        new, self._in_stall = names - self._in_stall, names
        self.stalls += len(new)
        if not new or now - self._reported_at < self.cooldown_s:
            return None
        self._reported_at = now
        what = ", ".join(f"session {name}: {phase} for {s * 1000:.0f} ms" for name, phase, s in stalled)
        report = f"video stalled ({what}); the busy threads now:\n{thread_stacks()}"
        log.warning("%s", report)
        return report


__all__ = ["PacedTrack", "StallWatch", "thread_stacks"]
