"""``idolcast bench --memory``: recall of planted facts and retrieval latency at scale.

Recall: ``recall_n`` synthetic memories (viewers' facts over 30 simulated days of streams,
self-facts, stream events, some facts contradicted later), really embedded with MiniLM; a set
of planted facts is then asked for, as a live turn would (the viewer asks in the first person,
``recall_at_5``) and in the third person with no speaker known (``recall_at_5_third_person``).
A hit is the planted (current, not superseded) memory in the top 5 of the full retrieval.

Scale: the bank is then filled up to ``n_memories`` with random unit vectors (embedding
100,000 texts would take ~30 min; the cost of a search does not depend on the content),
and timed: ``search_p95_ms`` is the vector search alone, ``retrieval_p95_ms`` the whole
retrieval of a turn (query embedding with an empty cache, search, SQLite fetch, speaker
memories, scoring).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.progress import Progress, silent_progress
from persona.bank import MemoryBank
from persona.embed import Embedder
from persona.retrieval import embed_text

_CATEGORIES: dict[str, list[str]] = {
    "food": [
        "okonomiyaki",
        "ramen",
        "tacos",
        "lasagna",
        "pho",
        "sushi",
        "curry",
        "pierogi",
        "falafel",
        "paella",
    ],
    "anime": ["Cowboy Bebop", "Naruto", "Frieren", "Mushishi", "Haikyuu", "Akira", "Mob Psycho", "Clannad"],
    "game": [
        "Tetris",
        "Elden Ring",
        "Stardew Valley",
        "Celeste",
        "Hades",
        "Minecraft",
        "Splatoon",
        "Portal 2",
    ],
    "colour": ["teal", "crimson", "lavender", "mustard yellow", "forest green", "coral", "navy blue"],
    "song": ["Plastic Love", "Bohemian Rhapsody", "Stay With Me", "Blinding Lights", "Dancing Queen"],
    "movie": ["Spirited Away", "Alien", "Paddington 2", "Inception", "Amelie", "Your Name", "Heat"],
    "drink": ["matcha latte", "oolong tea", "cold brew", "mango lassi", "hot chocolate", "lemonade"],
    "sport": ["volleyball", "climbing", "table tennis", "cycling", "fencing", "surfing", "chess"],
}
_CITIES = [
    "Osaka",
    "Lisbon",
    "Toronto",
    "Nairobi",
    "Krakow",
    "Lima",
    "Busan",
    "Oslo",
    "Perth",
    "Austin",
    "Hanoi",
    "Munich",
    "Cork",
    "Porto Alegre",
    "Manila",
    "Reykjavik",
    "Tbilisi",
    "Kyoto",
]
_JOBS = [
    "nurse",
    "welder",
    "teacher",
    "barista",
    "software developer",
    "electrician",
    "librarian",
    "pharmacist",
    "truck driver",
    "illustrator",
    "accountant",
    "chef",
    "student",
]
_PETS = ["dog", "cat", "parrot", "hamster", "rabbit", "turtle"]
_PET_NAMES = ["Mochi", "Rex", "Biscuit", "Luna", "Pixel", "Tofu", "Nori", "Captain", "Waffles", "Ziggy"]
_LIKES = [
    "rainy days",
    "horror movies",
    "karaoke",
    "baking bread",
    "retro games",
    "jazz",
    "hiking",
    "puzzles",
    "spicy food",
    "night walks",
    "cosplay",
    "gardening",
    "drawing",
    "board games",
]
_QUESTIONS = {
    "favourite": ("Aiko, do you remember what my favourite {c} is?", "What is {u}'s favourite {c}?"),
    "home": ("Do you remember where I'm from?", "Where is {u} from?"),
    "job": ("Hey, do you remember what I do for work?", "What does {u} work as?"),
    "pet": ("What's the name of my {c} again?", "What is the name of {u}'s {c}?"),
}


def _viewer_facts(rng: random.Random, user: str) -> list[tuple[str, str, str]]:
    """(slot, text, question category) facts about one viewer."""
    facts = [
        (f"favourite:{c}", f"{user}'s favourite {c} is {rng.choice(v)}", c)
        for c, v in rng.sample(sorted(_CATEGORIES.items()), 5)
    ]
    facts.append(("home", f"{user} is from {rng.choice(_CITIES)}", ""))
    facts.append(("job", f"{user} works as a {rng.choice(_JOBS)}", ""))
    pet = rng.choice(_PETS)
    facts.append((f"pet:{pet}", f"{user} has a {pet} named {rng.choice(_PET_NAMES)}", pet))
    facts += [(f"opinion:{x}", f"{user} likes {x}", "") for x in rng.sample(_LIKES, 3)]
    return facts


def _fill_recall_set(
    bank: MemoryBank, n: int, n_queries: int, seed: int, progress: Progress
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    now = time.time()
    rows: list[dict[str, Any]] = []
    viewers = [
        f"{rng.choice(['neko', 'star', 'pix', 'moon', 'kai', 'ren', 'sol', 'yu'])}_{i:04d}"
        for i in range(n // 12 + 1)
    ]
    for user in viewers:
        for slot, text, cat in _viewer_facts(rng, user):
            rows.append(
                {
                    "kind": "viewer_fact",
                    "subject": user,
                    "slot": slot,
                    "text": text,
                    "cat": cat,
                    "t": now - rng.uniform(0, 30 * 86400),
                }
            )
    while len(rows) < n:
        i = len(rows)
        if i % 2:
            rows.append(
                {
                    "kind": "stream_event",
                    "subject": "stream",
                    "slot": None,
                    "cat": "",
                    "text": f"On stream {i % 97} the host and chat played {rng.choice(_CATEGORIES['game'])} "
                    f"and talked about {rng.choice(_LIKES)}",
                    "t": now - rng.uniform(0, 30 * 86400),
                }
            )
        else:
            rows.append(
                {
                    "kind": "self_fact",
                    "subject": "aiko",
                    "slot": None,
                    "cat": "",
                    "text": f"Aiko told chat she once tried {rng.choice(_LIKES)} with {rng.choice(viewers)}",
                    "t": now - rng.uniform(0, 30 * 86400),
                }
            )
    rows = rows[:n]
    candidates = [
        i
        for i, r in enumerate(rows)
        if r["kind"] == "viewer_fact" and r["slot"].split(":")[0] in ("favourite", "home", "job", "pet")
    ]
    planted = rng.sample(candidates, min(n_queries, len(candidates)))
    # a fifth of the planted facts were contradicted: an older value is kept as superseded history
    olds = []
    for i in planted[: len(planted) // 5]:
        r = rows[i]
        olds.append({**r, "text": r["text"].rsplit(" ", 1)[0] + " Nothing", "t": r["t"] - 86400, "old_of": i})
    progress("memory-bench", f"embedding {len(rows) + len(olds):,} synthetic memories with MiniLM...")
    t0 = time.perf_counter()
    vecs = bank.embedder.embed([embed_text(r["kind"], r["subject"], r["text"]) for r in rows + olds])
    embed_s = time.perf_counter() - t0
    ids: list[int] = []
    with bank.write() as conn:
        for r, v in zip(rows + olds, vecs, strict=True):
            ids.append(
                bank.store.insert_memory(
                    conn,
                    persona=bank.persona,
                    kind=r["kind"],
                    subject=r["subject"],
                    text=r["text"],
                    embedding=v,
                    slot=r["slot"],
                    importance=0.5,
                    now=r["t"],
                    source="bench",
                )
            )
        for j, o in enumerate(olds):
            conn.execute(
                "UPDATE memories SET superseded_by = ? WHERE id = ?", (ids[o["old_of"]], ids[len(rows) + j])
            )
    bank.index.rebuild(bank.store, bank.persona)
    queries = []
    for i in planted:
        r = rows[i]
        kind = r["slot"].split(":")[0]
        first, third = _QUESTIONS[kind]
        queries.append(
            {
                "id": ids[i],
                "speaker": r["subject"],
                "first": first.format(c=r["cat"], u=r["subject"]),
                "third": third.format(c=r["cat"], u=r["subject"]),
                "embed_s": embed_s,
            }
        )
    return queries


def _pct(xs: list[float], p: float) -> float:
    return round(float(np.percentile(np.asarray(xs) * 1e3, p)), 2)


def run_memory_bench(
    n_memories: int = 100_000,
    recall_n: int = 10_000,
    n_queries: int = 200,
    timing_queries: int = 300,
    seed: int = 0,
    embedder: Embedder | None = None,
    progress: Progress = silent_progress,
    workdir: str | Path | None = None,
) -> dict[str, Any]:
    from persona.embed import MiniLMEmbedder

    emb = embedder or MiniLMEmbedder(cache_size=100_000)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        bank = MemoryBank.open(Path(tmp) / "bench.sqlite3", emb, "aiko")
        try:
            queries = _fill_recall_set(bank, recall_n, n_queries, seed, progress)
            progress(
                "memory-bench", f"recall@5 over {len(queries)} planted facts among {recall_n:,} memories"
            )
            hits = sum(
                any(s.memory.id == q["id"] for s in bank.search(q["first"], 5, q["speaker"])) for q in queries
            )
            hits3 = sum(any(s.memory.id == q["id"] for s in bank.search(q["third"], 5)) for q in queries)
            result: dict[str, Any] = {
                "recall_at_5": round(hits / len(queries), 4),
                "recall_at_5_third_person": round(hits3 / len(queries), 4),
                "recall_memories": recall_n,
                "recall_queries": len(queries),
                "embed_batch_ms_per_text": round(queries[0]["embed_s"] / (recall_n * 1.02) * 1e3, 2),
            }
            rng = np.random.default_rng(seed)
            fill = n_memories - bank.store.count(bank.persona, active_only=True)
            progress(
                "memory-bench",
                f"filling to {n_memories:,} memories with {max(fill, 0):,} random unit vectors...",
            )
            t0 = time.perf_counter()
            for start in range(0, max(fill, 0), 10_000):
                m = min(10_000, fill - start)
                vecs = rng.standard_normal((m, emb.dim)).astype(np.float32)
                vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
                with bank.write() as conn:
                    ids = [
                        bank.store.insert_memory(
                            conn,
                            persona=bank.persona,
                            kind="stream_event",
                            subject="filler",
                            text=f"filler memory {start + j}",
                            embedding=v,
                            source="bench",
                        )
                        for j, v in enumerate(vecs)
                    ]
                bank.index.add(ids, vecs)
                progress(
                    "memory-bench", f"{start + m:,}/{fill:,} filler memories indexed", (start + m) / fill
                )
            build_s = time.perf_counter() - t0
            progress(
                "memory-bench",
                f"timing {timing_queries} searches and retrievals at {len(bank.index):,} memories",
            )
            clear = getattr(emb, "clear_cache", None)
            if callable(clear):
                clear()
            texts = [f"{q['first']} (take {i})" for i, q in enumerate((queries * 10)[:timing_queries])]
            speakers = [q["speaker"] for q in (queries * 10)[:timing_queries]]
            qv = emb.embed(texts[:50])
            search_t, retr_t, embed_t = [], [], []
            for i in range(timing_queries):
                t = time.perf_counter()
                bank.index.search(qv[i % len(qv)], bank.weights.candidates)
                search_t.append(time.perf_counter() - t)
            for text, speaker in zip(texts, speakers, strict=True):
                if callable(clear):
                    clear()
                t = time.perf_counter()
                emb.embed([text + " ?"])
                embed_t.append(time.perf_counter() - t)
                if callable(clear):
                    clear()
                t = time.perf_counter()
                bank.search(text, 5, speaker)
                retr_t.append(time.perf_counter() - t)
            import torch

            result.update(
                {
                    "memories": len(bank.index),
                    "search_p50_ms": _pct(search_t, 50),
                    "search_p95_ms": _pct(search_t, 95),
                    "retrieval_p50_ms": _pct(retr_t, 50),
                    "retrieval_p95_ms": _pct(retr_t, 95),
                    "query_embed_p50_ms": _pct(embed_t, 50),
                    "query_embed_p95_ms": _pct(embed_t, 95),
                    "filler_index_s": round(build_s, 1),
                    "index": "usearch HNSW, int8, cosine, M=16, ef_add=64, ef_search=64; exact re-score",
                    "filler": f"{max(fill, 0):,} random unit vectors (search cost does not depend on content)",
                    "torch_threads": torch.get_num_threads(),
                    "cpus": os.cpu_count(),
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                }
            )
            return result
        finally:
            bank.close()


def run_memory_bench_cli(args: Any, settings: Any) -> int:
    import json

    from engine.progress import ConsoleProgress

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    n = int(os.environ.get("IDOLCAST_BENCH_MEMORIES", "100000"))
    recall_n = int(os.environ.get("IDOLCAST_BENCH_RECALL_MEMORIES", "10000"))
    report = run_memory_bench(n_memories=n, recall_n=recall_n, progress=ConsoleProgress())
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2))
    else:
        for k, v in report.items():
            print(f"{k:28} {v}")
    return 0
