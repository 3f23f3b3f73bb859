"""The native libraries' OpenMP workers sleep when idle (engine/native.py), unless the user says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from engine import quiet_thread_pools


def _omp_settings(**env: str) -> str:
    """What the OpenMP runtimes of llama.cpp and CTranslate2 report at start, in a fresh process."""
    ours = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT")
    environ = {k: v for k, v in os.environ.items() if k not in ours}
    environ.update(OMP_DISPLAY_ENV="VERBOSE", **env)
    run = subprocess.run(
        [sys.executable, "-c", "import engine, ctranslate2, llama_cpp"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return run.stderr


@pytest.mark.unit
def test_idle_openmp_workers_sleep_in_every_runtime_the_engine_loads() -> None:
    report = _omp_settings()
    assert report.count("OPENMP DISPLAY ENVIRONMENT BEGIN") >= 2  # llama.cpp's libgomp and CTranslate2's
    assert report.count("OMP_WAIT_POLICY = 'PASSIVE'") == report.count("OPENMP DISPLAY ENVIRONMENT BEGIN")
    # ... after a short spin (barriers inside one forward pass stay fast)
    assert report.count("GOMP_SPINCOUNT = '1000'") == report.count("OPENMP DISPLAY ENVIRONMENT BEGIN")


@pytest.mark.unit
def test_a_users_own_wait_policy_is_kept() -> None:
    report = _omp_settings(OMP_WAIT_POLICY="ACTIVE")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in report and "'PASSIVE'" not in report
    assert "GOMP_SPINCOUNT = '1000'" not in report  # it would cut the user's ACTIVE spin short
    environ = {"KMP_BLOCKTIME": "200"}
    quiet_thread_pools(environ)
    assert environ == {
        "KMP_BLOCKTIME": "200",
        "OMP_WAIT_POLICY": "PASSIVE",
        "GOMP_SPINCOUNT": "1000",
        "OPENCV_FOR_THREADS_NUM": "1",
    }
    environ = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "50", "OPENCV_FOR_THREADS_NUM": "4"}
    quiet_thread_pools(environ)
    assert environ == {
        "OMP_WAIT_POLICY": "PASSIVE",
        "GOMP_SPINCOUNT": "50",
        "KMP_BLOCKTIME": "0",
        "OPENCV_FOR_THREADS_NUM": "4",
    }


def _opencv_threads(code: str, **env: str) -> int:
    """``cv2.getNumThreads()`` after ``code``, in a fresh process."""
    environ = {k: v for k, v in os.environ.items() if k != "OPENCV_FOR_THREADS_NUM"}
    environ.update(env)
    run = subprocess.run(
        [sys.executable, "-c", f"{code}; import cv2; print(cv2.getNumThreads())"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(run.stdout.strip().splitlines()[-1])


@pytest.mark.unit
def test_opencv_converts_in_the_calling_thread_once_the_engine_is_imported() -> None:
    """The sent picture's conversion (engine/avatar/picture.py) wakes no pool of OpenCV's own; a user's
    setting is kept. Without the engine OpenCV would size its pool by the cores (more than one where the
    machine has them)."""
    assert _opencv_threads("import engine.avatar.picture") == 1
    assert _opencv_threads("import engine.avatar.picture", OPENCV_FOR_THREADS_NUM="2") == 2
    if (os.cpu_count() or 1) > 1:
        assert _opencv_threads("pass") > 1


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.fixture
def model_nice() -> Iterator[int]:
    from engine import native

    native.set_model_nice(5)
    try:
        yield 5
    finally:
        native.set_model_nice(0)


def test_model_threads_run_nicer_and_the_threads_they_start_too(model_nice: int) -> None:
    import threading

    from engine.native import model_executor

    base = _nice(threading.get_native_id())
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = _nice(threading.get_native_id())

    def job() -> None:
        seen["model"] = _nice(threading.get_native_id())
        t = threading.Thread(target=child)  # as a native runtime's own pool starts from it
        t.start()
        t.join()

    pool = model_executor(1, "test-model")
    try:
        pool.submit(job).result()
        pool.submit(job).result()  # once per thread: not nicer again
    finally:
        pool.shutdown()
    other = threading.Thread(target=lambda: seen.__setitem__("other", _nice(threading.get_native_id())))
    other.start()
    other.join()
    assert seen == {"model": base + model_nice, "child": base + model_nice, "other": base}
    assert _nice(threading.get_native_id()) == base  # the caller (the event loop's thread) untouched


async def test_llama_cpp_decodes_in_model_threads_with_its_own_workers(model_nice: int) -> None:
    """The bundled GGUF on llama.cpp: its prewarm, its reply stream and the OpenMP workers they start run
    nicer than the loop's thread; the loop's default executor (aiortc's encoders) is left as it is."""
    import asyncio
    import threading

    from engine.llm.config import LLMConfig
    from engine.llm.llama_cpp_backend import LlamaCppLLM

    def niced() -> set[int]:
        found: set[int] = set()
        for t in (int(t) for t in os.listdir("/proc/self/task")):
            try:  # a thread may end between the listing and the look (another test's pool winding down)
                if _nice(t) == base + model_nice:
                    found.add(t)
            except ProcessLookupError:
                continue
        return found

    base = _nice(threading.get_native_id())
    before = niced()
    llm = LlamaCppLLM(LLMConfig(backend="llama.cpp", max_new_tokens=4, prefill_threads=2))  # type: ignore[call-arg]
    try:
        messages = [{"role": "user", "content": "Say hi."}]
        await llm.prewarm(messages, cache_key="a")  # type: ignore[arg-type]
        async for _ in llm.stream(messages, cache_key="a"):  # type: ignore[arg-type]
            pass
        after = niced()
        assert len(after - before) >= 2, (before, after)  # its job thread, the stream's, their OpenMP team
        executor_tid = await asyncio.get_running_loop().run_in_executor(None, threading.get_native_id)
        assert _nice(executor_tid) == base
        assert _nice(threading.get_native_id()) == base
    finally:
        llm.close()
