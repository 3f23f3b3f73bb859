"""``kill -USR1 <engine pid>``: every thread's Python stack and every asyncio task's, on stderr.

For an engine that has stopped answering without an error: the threads show which model runtime or lock
a worker waits in, the tasks which await each session's coroutines are parked on. Nothing is changed.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys

TASK_FRAMES = 6  # innermost frames printed per task


def dump_state(loop: asyncio.AbstractEventLoop) -> None:
    """Write every thread's stack, then every task's, to stderr (runs on the loop, from the signal)."""
    err = sys.stderr
    print("=== idolcast state dump: threads ===", file=err, flush=True)
    faulthandler.dump_traceback(file=err, all_threads=True)
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    print(f"=== idolcast state dump: {len(tasks)} asyncio tasks ===", file=err)
    for task in tasks:
        print(f"--- {task.get_name()}", file=err)
        task.print_stack(limit=TASK_FRAMES, file=err)
    print("=== end of dump ===", file=err, flush=True)


def install_dump_signal(loop: asyncio.AbstractEventLoop) -> None:
    """SIGUSR1 dumps the state (Unix only; elsewhere nothing is installed)."""
    if hasattr(signal, "SIGUSR1"):
        loop.add_signal_handler(signal.SIGUSR1, dump_state, loop)
