"""The state dump of a hung engine (``kill -USR1``): every thread's stack and every task's."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from engine.server.diagnostics import dump_state, install_dump_signal, profile_thread


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
        assert f"tid {worker.native_id} asr-final_0" in err  # named, with the id top -H shows
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        parked.set()
        blocked.set()
        await task


@pytest.mark.unit
def test_the_loop_profile_names_what_keeps_a_thread_busy() -> None:
    stop = threading.Event()

    def spin_in_the_render() -> None:  # a stand-in for CPU work left on the loop's thread
        while not stop.is_set():
            sum(range(1000))

    busy = threading.Thread(target=spin_in_the_render, daemon=True)
    busy.start()
    try:
        assert busy.ident is not None
        report = profile_thread(busy.ident, seconds=0.5, hz=200.0)
    finally:
        stop.set()
    head, *rows = report.splitlines()
    busy_share = float(head.split("(")[1].split("%")[0])
    assert busy_share >= 90.0  # a thread that never waits on I/O is busy in (nearly) every sample
    running = rows[rows.index("--- running (self), % of samples") + 1]
    assert "spin_in_the_render" in running  # the busiest function is the one that spins
