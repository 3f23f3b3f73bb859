"""``idolcast bench --sessions N`` and ``--find-capacity``: many hosts at once, each measured at its receiver.

Every client is the single-session bench's own coroutine (:func:`engine.bench.voice.run_voice_bench`): its
own aiortc peer, its own clock, its own questions (the question list rotated, so the hosts do not ask the
same thing at the same moment), its first question ``stagger_s`` after the previous client's, so turns
overlap as several real hosts' would. The report has each session's figures and the pooled ones.

The clients decode every session's video to measure fps and lip sync, which costs a receiver as much as
the engine's encoders cost it; with many sessions one Python process cannot keep up and measures its own
backlog (the first H200 run: 16 clients in one process heard replies seconds after the engine sent them).
So ``client_procs`` spreads them over worker processes, a few clients each, started on one shared
wall-clock schedule, each worker pinned to its own slice of the cores: FFmpeg's VP8 decoder takes as many
threads as the process may use cores, and libvpx's threads spin while they wait, so on the H200 host
(16 cores) sixteen unpinned clients ran 256 spinning threads (load average 234): the engine's loop, which
then needed 0.2 core, was ~1 s late and no client answered ICE consent checks within their 30 s.

``--find-capacity`` runs one session for the reference P95, then raises N by one until the service level
breaks, and reports the largest N that held (with every step's figures, and the engine's own estimate
from ``/api/capacity`` taken at the peak of each step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from engine.bench.stats import summarize, summarize_costs
from engine.bench.voice import Question, run_voice_bench
from engine.cores import machine_cpu_times, usable_cores

log = logging.getLogger(__name__)


@dataclass
class ServiceLevel:
    """What every session must get for N sessions to count as held."""

    p95_factor: float = 1.5  # voice-to-voice P95 (pooled) ≤ this × the single-session P95
    v2v_p95_ms: float | None = None  # the bound itself (set from the single-session run)
    min_fps: int = 27  # in every 1 s window, every session (only checked when video arrived)
    max_unanswered: int = 0  # turns without an audible reply, all sessions together

    def check(self, pooled: dict[str, Any], with_video: bool) -> list[str]:
        """The broken conditions, in words (empty: held)."""
        broken = []
        p95 = pooled["voice_to_voice_ms"]["p95"]
        if pooled["refused"]:
            broken.append(f"the engine refused {pooled['refused']} session(s)")
        if pooled["failed"]:
            broken.append(f"{pooled['failed']} client(s) failed")
        if pooled["unanswered"] > self.max_unanswered:
            broken.append(f"{pooled['unanswered']} unanswered turn(s) (at most {self.max_unanswered})")
        if self.v2v_p95_ms is not None and (p95 is None or p95 > self.v2v_p95_ms):
            broken.append(f"voice-to-voice P95 {p95} ms > {self.v2v_p95_ms:.0f} ms")
        if with_video:
            low = pooled["fps_min_1s"]
            if low is None or low < self.min_fps:
                broken.append(f"lowest 1 s window {low} fps < {self.min_fps}")
        return broken


def rotated(questions: Sequence[Question], k: int) -> list[Question]:
    """Client ``k``'s questions: the same set, starting ``k`` further on."""
    if not questions:
        return []
    k %= len(questions)
    return list(questions[k:]) + list(questions[:k])


def _session_entry(i: int, n_questions: int, result: dict[str, Any] | BaseException) -> dict[str, Any]:
    if isinstance(result, BaseException):
        refused = "offer refused: 503" in str(result)
        return {
            "index": i,
            "session_id": None,
            "error": f"{type(result).__name__}: {result}",
            "refused": refused,
            "voice_to_voice_ms": summarize([]),
            "unanswered": n_questions,
            "fps_mean": None,
            "fps_min_1s": None,
            "lipsync_offset_ms": {"mean": None, "p95": None, "n": 0},
        }
    turns = result.get("turns", [])
    answered = sum(1 for t in turns if t.get("voice_to_voice_ms") is not None)
    # the single-session bench's own count when it keeps one, else the turns without an audible reply
    unanswered = result.get("unanswered")
    if not isinstance(unanswered, int):
        unanswered = n_questions - answered
    return {
        "index": i,
        "session_id": result.get("session_id"),
        "error": None,
        "refused": False,
        "voice_to_voice_ms": result["voice_to_voice_ms"],
        "unanswered": unanswered,
        "fps_mean": result.get("fps_mean"),
        "fps_min_1s": result.get("fps_min_1s"),
        # the lowest window by the frames' media time and by their packets' arrival: where a dip was made
        # (the engine's clock, the network, or the client's own decoding)
        "fps_min_1s_media": result.get("fps_min_1s_media"),
        "fps_min_1s_network": result.get("fps_min_1s_network"),
        # when the lowest windows (decoded, media) began, in Unix seconds: line them up with the other
        # sessions' and the engines' log lines
        "fps_min_1s_unix": result.get("fps_min_1s_unix"),
        "fps_min_1s_media_unix": result.get("fps_min_1s_media_unix"),
        "lipsync_offset_ms": result.get("lipsync_offset_ms"),
        "wer": result.get("wer"),
        "v2v_ms": [t.get("voice_to_voice_ms") for t in turns],
        "lipsync_replies_ms": [r["offset_ms"] for r in result.get("lipsync_per_reply", [])],
        "client_loop_lag_ms": result.get("client_loop_lag_ms"),
        "rtp_received": result.get("rtp_received") or {},
        # each turn's stages from the end of speech (the engine's timings: end of turn, LLM first token,
        # first chunk, TTS first audio, sent): where a session's voice-to-voice went
        "stages_ms": [t.get("stages_ms") or {} for t in turns],
        "asr_final": [t.get("asr") or {} for t in turns],  # each turn's final transcript's costs
        # the way there and back (same host: the engine's clock mapped to the client's): the host's last word
        # sent -> its end at the engine, her first audio sent by the engine -> heard here
        "uplink_ms": [t.get("uplink_ms") for t in turns],
        "downlink_ms": [t.get("downlink_ms") for t in turns],
    }


def pooled_stages(per_session: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every stage over all sessions' turns (ms from the end of speech)."""
    turns = [t for s in per_session for t in s.get("stages_ms", [])]
    names = sorted({k for t in turns for k in t})
    return {k: summarize([t[k] for t in turns if t.get(k) is not None]) for k in names}


def pool(per_session: list[dict[str, Any]]) -> dict[str, Any]:
    """All sessions' turns together; fps as the mean of the means and the lowest window anywhere."""
    v2v = [v for s in per_session for v in s.get("v2v_ms", []) if v is not None]
    fps = [s["fps_mean"] for s in per_session if s["fps_mean"] is not None]
    lows = [s["fps_min_1s"] for s in per_session if s["error"] is None]
    lips = [v for s in per_session for v in s.get("lipsync_replies_ms", [])]
    lags = [
        lag["max"] for s in per_session if (lag := s.get("client_loop_lag_ms")) and lag["max"] is not None
    ]
    return {
        "voice_to_voice_ms": summarize(v2v),
        "unanswered": sum(s["unanswered"] for s in per_session),
        "refused": sum(1 for s in per_session if s["refused"]),
        "refusals": [s["error"] for s in per_session if s["refused"]],
        "failed": sum(1 for s in per_session if s["error"] is not None and not s["refused"]),
        "fps_mean": round(sum(fps) / len(fps), 2) if fps else None,
        "fps_min_1s": _lowest(lows),
        "fps_min_1s_media": _lowest([s.get("fps_min_1s_media") for s in per_session if s["error"] is None]),
        "fps_min_1s_network": _lowest(
            [s.get("fps_min_1s_network") for s in per_session if s["error"] is None]
        ),
        "lipsync_offset_ms": summarize(lips) if lips else summarize([]),
        "lipsync_abs_p95_ms": summarize([abs(v) for v in lips])["p95"] if lips else None,
        "client_loop_lag_max_ms": max(lags, default=None),
        "stages_ms": pooled_stages(per_session),
        "asr_final_ms": summarize_costs([c for s in per_session for c in s.get("asr_final", []) if c]),
        "uplink_ms": _pooled(per_session, "uplink_ms"),
        "downlink_ms": _pooled(per_session, "downlink_ms"),
        "video_packets_lost": sum(
            (s.get("rtp_received") or {}).get("video", {}).get("lost", 0) for s in per_session
        ),
    }


def _pooled(per_session: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """A per-turn figure over every session's turns (turns without it left out)."""
    return summarize([v for s in per_session for v in s.get(key, []) if v is not None])


def _lowest(lows: list[int | None]) -> int | None:
    """The lowest window of any session; None when no session got video, 0 for one that got none."""
    if all(x is None for x in lows):
        return None
    return min(x if x is not None else 0 for x in lows)


def host_token() -> str:
    """The credential the bench's clients present (an engine without credentials needs none)."""
    try:
        from engine.server.credentials import read_host_token
    except ImportError:
        return os.environ.get("IDOLCAST_TOKEN", "")
    return read_host_token() or ""


async def engine_capacity(url: str, token: str | None = None) -> dict[str, Any] | None:
    """The engine's own view (``GET /api/capacity``), or None when it has none (or refuses us)."""
    token = host_token() if token is None else token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.get(f"{url.rstrip('/')}/api/capacity", timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            return dict(await r.json()) if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def default_client_procs(n: int) -> int:
    """Worker processes for ``n`` clients: one per two clients, one per two cores at most (1: in-process)."""
    return max(1, min((n + 1) // 2, usable_cores() // 2))


def core_slices(cores: Sequence[int], procs: int) -> list[set[int]]:
    """Worker ``k``'s cores: ``procs`` disjoint slices of ``cores`` (shared round-robin when fewer cores)."""
    cores = sorted(cores)
    if len(cores) < procs:
        return [{cores[k % len(cores)]} for k in range(procs)]
    per = len(cores) // procs
    return [set(cores[k * per : (k + 1) * per]) for k in range(procs)]


# A client's place in the run: its index, the engine it talks to, its questions, its delay.
Scheduled = tuple[int, str, list[Question], float]


def spread(
    urls: str | Sequence[str], questions: Sequence[Question], n: int, stagger_s: float
) -> list[Scheduled]:
    """``n`` clients over the engines at ``urls`` in turn (one URL: all on it), each asking ``questions`` in
    its own order, the first questions ``stagger_s`` apart."""
    engines = [urls] if isinstance(urls, str) else list(urls)
    if not engines:
        raise ValueError("no engine to bench")
    return [(i, engines[i % len(engines)], rotated(questions, i), i * stagger_s) for i in range(n)]


async def _run_clients(
    schedule: list[Scheduled],
    client_kwargs: dict[str, Any],
    offset: float = 0.0,
) -> list[dict[str, Any] | BaseException]:
    """The scheduled clients side by side in this process (barge-in is the single-session bench's measure)."""
    return await asyncio.gather(
        *(
            run_voice_bench(url, qs, None, 0, start_delay_s=offset + d, **client_kwargs)
            for _, url, qs, d in schedule
        ),
        return_exceptions=True,
    )


def _client_group(
    assigned: list[Scheduled],
    start_at: float,
    client_kwargs: dict[str, Any],
    cores: set[int] | None = None,
    ice_debug: bool = False,
) -> list[dict[str, Any] | str]:
    """A worker process's clients (index, engine, questions, delay after ``start_at``): results, or the error's
    text.

    Its log goes to the bench's stderr, stamped with the time and the worker's pid: warnings, and the
    clients' ICE (aioice) at INFO, its consent expiries included, or with ``ice_debug`` every STUN message
    sent and received (the connectivity checks, then one consent check each way every ~5 s)."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s client[%(process)d] %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aioice.ice").setLevel(logging.DEBUG if ice_debug else logging.INFO)
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)  # before any decoder exists: it sizes its threads by these

    offset = max(0.0, start_at - time.time())  # the same schedule in every process
    results = asyncio.run(_run_clients(assigned, client_kwargs, offset))
    return [r if isinstance(r, dict) else f"{type(r).__name__}: {r}" for r in results]


async def _clients_in_processes(
    schedule: list[Scheduled],
    procs: int,
    client_kwargs: dict[str, Any],
    ice_debug: bool = False,
) -> list[dict[str, Any] | BaseException]:
    groups = [schedule[k::procs] for k in range(procs)]
    start_at = time.time() + 6.0  # a spawned worker imports aiortc and numpy first (~2-4 s)
    loop = asyncio.get_running_loop()
    results: list[dict[str, Any] | BaseException] = [RuntimeError("no result")] * len(schedule)
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    slices: list[set[int] | None] = list(core_slices(sorted(affinity), procs)) if affinity else [None] * procs
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            loop.run_in_executor(pool, _client_group, g, start_at, client_kwargs, cores, ice_debug)
            for g, cores in zip(groups, slices, strict=True)
        ]
        for group, outcome in zip(
            groups, await asyncio.gather(*futures, return_exceptions=True), strict=True
        ):
            for k, (i, _, _, _) in enumerate(group):
                if isinstance(outcome, BaseException):
                    results[i] = outcome
                else:
                    r = outcome[k]
                    results[i] = r if isinstance(r, dict) else RuntimeError(r)
    return results


async def run_sessions(
    url: str | Sequence[str],
    questions: Sequence[Question],
    n: int,
    *,
    character: str = "builtin:default",
    client_jitter_frames: int = 2,
    same_host: bool = False,
    stagger_s: float = 1.0,
    token: str | None = None,
    client_procs: int = 0,
    client_ice_debug: bool = False,
) -> dict[str, Any]:
    """N clients at once against the engine at ``url`` (or spread over several engines in turn: replicas on
    one box, ``--engines``); the report of ``--sessions N``.

    The clients present the host credential as the single-session bench does ($IDOLCAST_TOKEN, else the
    local engine's); ``token`` is only for the engine's ``/api/capacity``, read beside them.
    ``client_procs``: worker processes for the clients (0: :func:`default_client_procs`; 1: this one);
    ``client_ice_debug``: the workers log every STUN message (:func:`_client_group`).
    """
    procs = min(n, client_procs or default_client_procs(n))
    client_kwargs: dict[str, Any] = {
        "character": character,
        "client_jitter_frames": client_jitter_frames,
        "same_host": same_host,
    }
    schedule = spread(url, questions, n, stagger_s)
    engines = list(dict.fromkeys(u for _, u, _, _ in schedule))
    if procs > 1:
        clients = _clients_in_processes(schedule, procs, client_kwargs, client_ice_debug)
    else:
        clients = _run_clients(schedule, client_kwargs)
    peak: dict[str, Any] = {}

    async def sample_peak() -> None:  # each engine's own estimate while all N are connected
        await asyncio.sleep(1.5 + n * stagger_s + (6.0 if procs > 1 else 0.0))
        cpu = await asyncio.to_thread(machine_cpu_times)  # the box's, from here to the clients' end
        peak["host_cpu"] = (time.monotonic(), cpu)
        peak["engines"] = await asyncio.gather(*(engine_capacity(u, token) for u in engines))

    sampler = asyncio.ensure_future(sample_peak())
    try:
        results = await clients
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    # and again at the end, the sessions closed: the loops' worst lag over the whole run, the render's batches
    ended = await asyncio.gather(*(engine_capacity(u, token) for u in engines))
    host = None
    if "host_cpu" in peak:  # reached the peak: the box's CPU from there to the clients' end
        t0, before = peak["host_cpu"]
        host = host_cpu_split(t0, before, time.monotonic(), machine_cpu_times())
    per_session = [_session_entry(i, len(questions), r) for i, r in enumerate(results)]
    for s in per_session:
        if s["error"]:
            log.warning("session %d: %s", s["index"], s["error"])
    return {
        "sessions": n,
        "client_procs": procs,
        "per_session": per_session,
        "pooled": pool(per_session),
        "engines": len(engines),
        "engine_capacity": (peak.get("engines") or [None])[0],  # the first engine's
        "engine_capacities": peak.get("engines") or [],
        "engine_capacities_end": list(ended),
        "host_cpu": host,
    }


def host_cpu_split(
    t0: float, before: dict[str, float] | None, t1: float, after: dict[str, float] | None
) -> dict[str, Any] | None:
    """The whole box's CPU between two readings of :func:`~engine.cores.machine_cpu_times` (engines, clients
    and anything else on it): each kind's share of all the cores' time (``steal``: a virtual machine's cores
    taken by its host), and the cores busy on average. None without both readings."""
    if before is None or after is None or t1 <= t0:
        return None
    spent = {k: max(0.0, after[k] - before.get(k, 0.0)) for k in after}
    total = sum(spent.values())
    if total <= 0:
        return None
    out: dict[str, Any] = {k: round(v / total, 3) for k, v in spent.items()}
    out["busy_cores"] = round((total - spent.get("idle", 0.0) - spent.get("iowait", 0.0)) / (t1 - t0), 2)
    out["cores"] = os.cpu_count()
    out["seconds"] = round(t1 - t0, 1)
    return out


EngineFactory = Callable[[], AbstractContextManager[str | list[str]]]


async def find_capacity(
    url: str | list[str] | EngineFactory,
    questions: Sequence[Question],
    level: ServiceLevel,
    *,
    max_sessions: int = 8,
    probes: Sequence[int] | None = None,
    with_video: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """Raise N from 1 until ``level`` breaks; the report carries the largest N that held. ``probes``: the
    counts tried, in order, instead of every N from 1 to ``max_sessions`` (the first sets the P95 bound when
    ``level`` has none: 1, as a rule).

    ``url``: running engines, or a factory of fresh ones (a context manager giving their URLs), entered
    for every step: each N then starts from the same state (the memory bank grows with every turn the
    idol hears, and with it the next step's prompts).
    """
    steps: list[dict[str, Any]] = []
    held: dict[str, Any] | None = None
    broke: list[str] = []
    counts = list(probes) if probes else list(range(1, max_sessions + 1))
    for i, n in enumerate(counts):
        if isinstance(url, (str, list)):
            report = await run_sessions(url, questions, n, **kwargs)
        else:
            with contextlib.ExitStack() as stack:
                # starting an engine blocks (a subprocess, waiting for its models): off the loop
                step_url = await asyncio.to_thread(stack.enter_context, url())
                report = await run_sessions(step_url, questions, n, **kwargs)
        pooled = report["pooled"]
        if i == 0 and level.v2v_p95_ms is None and pooled["voice_to_voice_ms"]["p95"] is not None:
            level.v2v_p95_ms = round(level.p95_factor * pooled["voice_to_voice_ms"]["p95"], 1)
        broken = level.check(pooled, with_video)
        steps.append(
            {
                "sessions": n,
                "held": not broken,
                "broken": broken,
                "pooled": pooled,
                "per_session": report["per_session"],
                "engine_capacity": report["engine_capacity"],
                "host_cpu": report["host_cpu"],
            }
        )
        log.info("capacity: %d session(s) %s", n, "held" if not broken else f"broke: {'; '.join(broken)}")
        if broken:
            broke = broken
            break
        held = report
    largest = held["sessions"] if held is not None else 0
    base = held or report
    return {
        "sessions": base["sessions"],
        "per_session": base["per_session"],
        "pooled": base["pooled"],
        "capacity": {
            "largest_n_held": largest,
            "probed_up_to": steps[-1]["sessions"],
            "probed": [step["sessions"] for step in steps],
            "broken_at_next": broke,  # empty: it held up to --max-probe
            "service_level": asdict(level) | {"video_checked": with_video},
            "steps": steps,
        },
    }
