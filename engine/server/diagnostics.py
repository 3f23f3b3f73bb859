"""Two signals for an engine in trouble, both writing to stderr and changing nothing.

``kill -USR1 <engine pid>``: every thread's Python stack and every asyncio task's. For an engine that has
stopped answering without an error: the threads show which model runtime or lock a worker waits in, the
tasks which await each session's coroutines are parked on; each thread's name comes with the id
``top -H`` shows, so a busy native thread can be told from a busy Python one.

``kill -USR2 <engine pid>``: a sampling profile of the event loop's thread for ``PROFILE_S`` seconds:
its stack read ``PROFILE_HZ`` times a second from a helper thread, the functions that were running
(self) and on the stack (inclusive) counted, the busiest printed. For an engine whose loop is late
(``event_loop_lag_ms`` in ``/api/capacity``): what on the loop costs the time.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
import threading
import time
from collections import Counter
from types import FrameType

TASK_FRAMES = 6  # innermost frames printed per task
PROFILE_S = 10.0
PROFILE_HZ = 200.0
PROFILE_TOP = 25


def dump_state(loop: asyncio.AbstractEventLoop) -> None:
    """Write every thread's stack, then every task's, to stderr (runs on the loop, from the signal)."""
    err = sys.stderr
    print("=== idolcast state dump: threads ===", file=err, flush=True)
    for thread in threading.enumerate():  # the names behind faulthandler's idents and top -H's thread ids
        print(f"thread {thread.ident:#018x} tid {thread.native_id} {thread.name}", file=err)
    faulthandler.dump_traceback(file=err, all_threads=True)
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    print(f"=== idolcast state dump: {len(tasks)} asyncio tasks ===", file=err)
    for task in tasks:
        print(f"--- {task.get_name()}", file=err)
        task.print_stack(limit=TASK_FRAMES, file=err)
    print("=== end of dump ===", file=err, flush=True)


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name} ({'/'.join(code.co_filename.split('/')[-2:])}:{code.co_firstlineno})"


def profile_thread(thread_id: int, seconds: float = PROFILE_S, hz: float = PROFILE_HZ) -> str:
    """Sample ``thread_id``'s Python stack for ``seconds``; the report's text (blocking: run it off the
    thread being sampled)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = idle = 0
    period = 1.0 / hz
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        frame = sys._current_frames().get(thread_id)
        if frame is None:
            break
        samples += 1
        if frame.f_code.co_name in ("select", "poll", "epoll"):  # the loop waiting for I/O: not busy
            idle += 1
        else:
            own[_where(frame)] += 1
            seen: set[str] = set()
            f: FrameType | None = frame
            while f is not None:
                where = _where(f)
                if where not in seen:
                    seen.add(where)
                    inclusive[where] += 1
                f = f.f_back
        time.sleep(period)
    busy = samples - idle

    def share(n: int) -> str:
        return f"{100.0 * n / max(1, samples):6.1f}"

    lines = [
        f"=== idolcast loop profile: {samples} samples over {seconds:.0f} s, busy in {busy} "
        f"({100.0 * busy / max(1, samples):.0f} %) ==="
    ]
    for title, counts in (("running (self)", own), ("on the stack (inclusive)", inclusive)):
        lines.append(f"--- {title}, % of samples")
        lines += [f"{share(n)}  {where}" for where, n in counts.most_common(PROFILE_TOP)]
    lines.append("=== end of profile ===")
    return "\n".join(lines)


def start_loop_profile(seconds: float = PROFILE_S) -> threading.Thread:
    """Profile the calling thread (the loop's) from a helper thread; the report goes to stderr."""
    loop_thread = threading.get_ident()

    def run() -> None:
        print(profile_thread(loop_thread, seconds), file=sys.stderr, flush=True)

    helper = threading.Thread(target=run, name="loop-profiler", daemon=True)
    helper.start()
    return helper


def install_dump_signal(loop: asyncio.AbstractEventLoop) -> None:
    """SIGUSR1 dumps the state, SIGUSR2 profiles the loop (Unix only; elsewhere nothing is installed)."""
    if hasattr(signal, "SIGUSR1"):
        loop.add_signal_handler(signal.SIGUSR1, dump_state, loop)
    if hasattr(signal, "SIGUSR2"):
        loop.add_signal_handler(signal.SIGUSR2, start_loop_profile)
