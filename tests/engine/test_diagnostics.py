"""The state dump of a hung engine (``kill -USR1``): every thread's stack and every task's."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from engine.server.diagnostics import dump_state, install_dump_signal


@pytest.mark.unit
async def test_the_dump_names_the_parked_tasks_and_the_threads(capfd: pytest.CaptureFixture[str]) -> None:
    parked = asyncio.Event()

    async def waiting_for_the_asr() -> None:
        await parked.wait()

    blocked = threading.Event()
    worker = threading.Thread(target=blocked.wait, name="asr-final_0", daemon=True)
    worker.start()
    task = asyncio.create_task(waiting_for_the_asr(), name="session-abc-final")
    await asyncio.sleep(0)
    try:
        loop = asyncio.get_running_loop()
        install_dump_signal(loop)
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.2)  # the handler runs on the loop
        dump_state(loop)  # and called directly
        err = capfd.readouterr().err
        assert err.count("=== idolcast state dump: threads ===") == 2  # the signal's dump and the call's
        assert "session-abc-final" in err and "waiting_for_the_asr" in err
        assert "Thread 0x" in err and "in wait" in err  # the blocked worker's frame
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        parked.set()
        blocked.set()
        await task
