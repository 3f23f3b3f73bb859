"""How long Piper takes for a reply's first chunk, by ONNX Runtime threads and chunk length, alone and while
the LLM decodes on the same cores (as it does: the model writes the rest of the reply meanwhile).

    .venv/bin/python scripts/tts_first_chunk.py [--repeats 8] [--threads 1,2] [--llm-threads 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from engine.config import load_settings
from engine.llm.factory import load_llm
from engine.progress import silent_progress
from engine.tts.piper_backend import load_piper

CHUNKS = {
    2: "Oh, hello!",
    3: "I love music.",
    4: "There are so many",
    6: "There are so many colors to",
}


def decode_forever(llm: object, stop: threading.Event) -> None:
    async def run() -> None:
        messages = [{"role": "user", "content": "Tell me a very long story about a dragon who sings."}]
        while not stop.is_set():
            async for _ in llm.stream(messages, cache_key="busy"):  # type: ignore[attr-defined]
                if stop.is_set():
                    break

    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--threads", default="1,2", help="Piper's ONNX Runtime threads to try")
    ap.add_argument("--llm-threads", default="1,2", help="llama.cpp decode threads to try beside it")
    args = ap.parse_args()
    settings = load_settings(environ={})
    llms = {
        n: load_llm(settings.llm.model_copy(update={"max_new_tokens": 200, "threads": n}), silent_progress)
        for n in [int(t) for t in args.llm_threads.split(",")]
    }
    for threads in [int(t) for t in args.threads.split(",")]:
        tts = load_piper(settings.tts.model_copy(update={"threads": threads}), silent_progress)
        for busy in (0, *llms):
            llm = llms.get(busy)
            stop = threading.Event()
            worker = threading.Thread(target=decode_forever, args=(llm, stop), daemon=True)
            if llm is not None:
                worker.start()
                time.sleep(1.0)
            for words, text in CHUNKS.items():
                ms = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    tts.synthesize_blocking(text)
                    ms.append((time.perf_counter() - t0) * 1000)
                print(
                    f"tts.threads {threads}  llm decoding on: {busy or '-'} threads  {words} words  "
                    f"median {statistics.median(ms):6.1f} ms  min {min(ms):6.1f} ms"
                )
            stop.set()
            if llm is not None:
                worker.join(5)
        tts.close()


if __name__ == "__main__":
    main()
