"""``idolcast bench``: voice-to-voice latency, barge-in, WER (and --sessions N, --find-capacity, --render, --memory)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import wave
from collections.abc import Iterator
from math import gcd
from typing import Any

import numpy as np

from engine.bench.voices import BY_NAME, STYLES, VoiceStyle, apply_style, noise_bed, synthesis_scale
from engine.config import Settings
from engine.cores import CPU_TIME_KINDS
from engine.native import preload_native_modules
from engine.progress import ConsoleProgress


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("wavs", nargs="*", help="question WAVs, each with a sidecar .txt transcript")
    p.add_argument("--url", help="bench a running engine instead of starting one")
    p.add_argument("--turns", type=int, default=10, help="number of questions (default 10)")
    p.add_argument("--barge-rounds", type=int, default=3, help="barge-in measurements (0 to skip)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--client-jitter-frames",
        type=int,
        default=2,
        help="20 ms frames the bench's receiver holds the reply audio before playing it: 2 (40 ms) is what "
        "Chromium held on average in --browser-jitter here (39 ms); aiortc's own default is 4",
    )
    p.add_argument(
        "--browser-jitter",
        action="store_true",
        help="measure Chromium's receive jitter buffer on the idol's audio (needs /usr/bin/chromium)",
    )
    p.add_argument(
        "--sessions",
        type=int,
        default=1,
        help="N clients at once, each its own host with its own questions (engine/bench/sessions.py)",
    )
    p.add_argument(
        "--find-capacity",
        action="store_true",
        help="raise the sessions from 1 until the service level breaks; report the largest N that held",
    )
    p.add_argument("--max-probe", type=int, default=8, help="--find-capacity: the most sessions tried")
    p.add_argument(
        "--probe",
        default=None,
        help="--find-capacity: the session counts tried, in order, comma-separated (e.g. 1,8,12,16,20,24; the "
        "first sets the P95 bound, so 1 comes first); default every N from 1 to --max-probe",
    )
    p.add_argument(
        "--client-procs",
        type=int,
        default=0,
        help="--sessions: worker processes for the clients, which decode every session's video "
        "(0: one per two clients, at most one per two cores; 1: all in the bench's own process)",
    )
    p.add_argument(
        "--engines",
        type=int,
        default=1,
        help="--sessions/--find-capacity: engine processes the bench starts, the sessions spread over them "
        "in turn (replicas on one box: each has its own event loop and GIL; each sizes its pools for the "
        "whole box unless IDOLCAST_SERVER__CPUS gives its share); with --url, give several URLs "
        "comma-separated instead",
    )
    p.add_argument(
        "--client-ice-debug",
        action="store_true",
        help="--sessions: the client workers log every STUN message they send and receive (to stderr)",
    )
    p.add_argument(
        "--stagger-s", type=float, default=1.0, help="--sessions: seconds between clients' first questions"
    )
    p.add_argument(
        "--sl-p95-factor",
        type=float,
        default=1.5,
        help="--find-capacity: voice-to-voice P95 bound, × the single-session P95",
    )
    p.add_argument("--sl-min-fps", type=int, default=27, help="--find-capacity: fps in every 1 s window")
    p.add_argument("--sl-max-unanswered", type=int, default=0, help="--find-capacity: unanswered turns")
    p.add_argument(
        "--voices",
        default="plain",
        help="the hosts' voices: 'plain' (the Piper voice as it is), 'varied' (fast, slow, high, low, quiet, "
        "loud, noisy... in turn: engine/bench/voices.py), or comma-separated style names",
    )
    p.add_argument(
        "--turn-end",
        action="store_true",
        help="judge the end of turn on a labelled set of finished and cut-off utterances (no server)",
    )
    p.add_argument("--render", action="store_true", help="frame-generation ms per frame per backend")
    p.add_argument("--memory", action="store_true", help="persona memory bank recall and search latency")
    p.add_argument("--backends", help="--render: comma-separated backends (default: all available)")
    p.add_argument("--profiles", default="720p,1080p", help="--render: comma-separated output profiles")
    p.add_argument("--batches", default="1,8,32,64", help="--render: comma-separated batch sizes (1 to 64)")
    p.add_argument("--frames", type=int, default=30, help="--render: frames timed per row")


def run_bench(args: argparse.Namespace, settings: Settings) -> int:
    if args.render:
        from engine.bench.render import run_render_bench_cli

        return run_render_bench_cli(args, settings)
    if args.memory:
        from persona.bench import run_memory_bench_cli

        return run_memory_bench_cli(args, settings)
    if args.turn_end:
        from engine.bench.turn_end import run_turn_end_bench, turn_end_table

        preload_native_modules()
        report = asyncio.run(run_turn_end_bench(settings))
        print(json.dumps(report, indent=2) if args.json else turn_end_table(report))
        return 0
    preload_native_modules()
    if args.browser_jitter:
        report = asyncio.run(_browser_jitter(args))
        print(json.dumps(report, indent=2) if args.json else report)
        return 0
    questions, barge = build_questions(args, settings)
    if args.sessions > 1 or args.find_capacity:
        report = asyncio.run(_many(args, settings, questions))
        print(json.dumps(report, indent=2, default=str) if args.json else many_table(report))
        return 0
    report = asyncio.run(_voice(args, settings, questions, barge))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_table(report)
    return 0


def _resample(pcm: np.ndarray, src: int, dst: int) -> np.ndarray:
    from scipy.signal import resample_poly

    if src == dst:
        return pcm.astype(np.int16)
    g = gcd(src, dst)
    y = resample_poly(pcm.astype(np.float32), dst // g, src // g)
    return np.clip(y, -32768, 32767).astype(np.int16)


def read_wav(path: str) -> np.ndarray:
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM")
        raw = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        ch, rate = w.getnchannels(), w.getframerate()
    mono = raw.reshape(-1, ch).mean(axis=1) if ch > 1 else raw
    return _resample(mono, rate, 48000)


def _with_silence(pcm: np.ndarray, before_s: float = 0.3, after_s: float = 1.5) -> np.ndarray:
    z = np.zeros
    return np.concatenate([z(int(48000 * before_s), np.int16), pcm, z(int(48000 * after_s), np.int16)])


def build_questions(args: argparse.Namespace, settings: Settings) -> tuple[list[Any], Any]:
    from engine.bench.peer import speech_bounds
    from engine.bench.voice import (
        BARGE_IN_PROMPT,
        BARGE_IN_QUESTION,
        DEFAULT_QUESTIONS,
        Question,
        load_questions,
    )
    from engine.tts.factory import load_tts

    questions: list[Question] = []
    if args.wavs:
        for text, path in load_questions(args.wavs):
            questions.append(Question(text, _with_silence(read_wav(str(path)))))
    styles = host_styles(args.voices)
    plain = load_tts(settings.tts, ConsoleProgress())
    voices: dict[float, Any] = {1.0: plain}

    async def synth(text: str, style: VoiceStyle, seed: int = 0) -> Question:
        scale = round(synthesis_scale(style), 3)
        if scale not in voices:
            cfg = settings.tts.model_copy(update={"length_scale": settings.tts.length_scale * scale})
            voices[scale] = await asyncio.to_thread(load_tts, cfg, ConsoleProgress())
        s = await voices[scale].synthesize(text)
        pcm = apply_style(s.pcm, style, seed)
        spoken = _with_silence(pcm)
        # where the speech is, read on the same voice without its level, clipping or noise
        clean = apply_style(s.pcm, dataclasses.replace(style, peak_dbfs=-3.0, noise_snr_db=None, clip=False))
        bounds = speech_bounds(_with_silence(clean))
        return Question(text, spoken + noise_bed(len(spoken), style, pcm, seed), bounds)

    async def all_synth() -> tuple[list[Question], tuple[Question, Question]]:
        out = list(questions)
        i = 0
        while len(out) < args.turns and not args.wavs:
            out.append(await synth(DEFAULT_QUESTIONS[i % len(DEFAULT_QUESTIONS)], styles[i % len(styles)], i))
            i += 1
        return out, (await synth(BARGE_IN_PROMPT, styles[0]), await synth(BARGE_IN_QUESTION, styles[0]))

    return asyncio.run(all_synth())


def host_styles(spec: str) -> list[VoiceStyle]:
    """``--voices``: 'plain', 'varied' (every style in turn) or style names."""
    if spec == "plain":
        return [BY_NAME["plain"]]
    if spec == "varied":
        return list(STYLES)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise SystemExit(f"--voices: unknown style(s) {unknown} (known: plain, varied, {', '.join(BY_NAME)})")
    return [BY_NAME[n] for n in names]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send it SIGTERM when its parent (the bench) exits."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def engine_process(args: argparse.Namespace) -> Iterator[str]:
    """Start ``idolcast serve`` on a free port and wait until its models are loaded."""
    with engine_processes(args, 1) as urls:
        yield urls[0]


@contextlib.contextmanager
def engine_processes(args: argparse.Namespace, count: int) -> Iterator[list[str]]:
    """Start ``count`` engines (``idolcast serve``, each on its own free ports with its own memory bank),
    loading side by side, and wait until all are ready; stopped together however the bench ends."""
    scratch = tempfile.TemporaryDirectory(prefix="idolcast-bench-")
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for k in range(count):
            port, mqtt_port = _free_port(), _free_port()
            cmd = [sys.executable, "-m", "engine.cli", *(["-v"] * getattr(args, "verbose", 0)), "serve"]
            cmd += ["--port", str(port)]
            if getattr(args, "config", None):
                cmd += ["--config", args.config]
            env = os.environ.copy()
            # A fresh memory bank per run: what earlier runs taught the idol must not change its prompts.
            env.setdefault("IDOLCAST_PERSONA__MEMORY_DB", os.path.join(scratch.name, f"memory-{k}.sqlite3"))
            env.setdefault("IDOLCAST_MQTT__EMBEDDED_PORT", str(mqtt_port))  # beside a running engine's broker
            # keep our stdout for the report; the engine dies with the bench, however it ends (even SIGKILL)
            proc = subprocess.Popen(cmd, env=env, stdout=sys.stderr, preexec_fn=_die_with_parent)
            started.append((proc, f"http://127.0.0.1:{port}"))
        for proc, url in started:
            wait_ready(url, proc)
        yield [url for _, url in started]
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        scratch.cleanup()


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the engine exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=2) as r:
                health = json.loads(r.read())
        except OSError:
            time.sleep(0.3)
            continue
        if health["state"] == "ready":
            return
        if health["state"] == "failed":
            raise RuntimeError(f"the engine failed to load: {health['error']}")
        if health["message"] != last:
            last = health["message"]
            print(f"[bench] engine: {last}", file=sys.stderr)
        time.sleep(0.3)
    raise TimeoutError("the engine did not become ready")


async def _voice(
    args: argparse.Namespace, settings: Settings, questions: list[Any], barge: Any
) -> dict[str, Any]:
    from engine.bench.voice import run_voice_bench

    rounds = args.barge_rounds
    character = settings.avatar.character
    jitter = args.client_jitter_frames
    if args.url:
        wait_ready(args.url)
        return await run_voice_bench(
            args.url, questions, barge if rounds else None, rounds, character, jitter
        )
    with engine_process(args) as url:
        return await run_voice_bench(
            url, questions, barge if rounds else None, rounds, character, jitter, same_host=True
        )


def probe_counts(probe: str | None, max_probe: int) -> list[int]:
    """The session counts ``--find-capacity`` tries, in order: ``--probe``'s, or 1 to ``--max-probe``."""
    if not probe:
        return list(range(1, max(1, max_probe) + 1))
    try:
        counts = [int(x) for x in probe.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--probe {probe!r}: expected session counts such as 1,8,16") from None
    if not counts or any(n < 1 for n in counts) or counts != sorted(set(counts)):
        raise SystemExit(f"--probe {probe!r}: expected rising session counts of at least 1, such as 1,8,16")
    return counts


async def _many(args: argparse.Namespace, settings: Settings, questions: list[Any]) -> dict[str, Any]:
    from engine.bench.sessions import ServiceLevel, find_capacity, run_sessions

    probes = probe_counts(args.probe, args.max_probe) if args.find_capacity else None
    top = max(probes) if probes else args.sessions
    kwargs: dict[str, Any] = {
        "character": settings.avatar.character,
        "client_jitter_frames": args.client_jitter_frames,
        "stagger_s": args.stagger_s,
        "client_procs": args.client_procs,
        "client_ice_debug": args.client_ice_debug,
    }

    level = ServiceLevel(args.sl_p95_factor, None, args.sl_min_fps, args.sl_max_unanswered)
    video = settings.avatar.enabled
    if args.url:
        urls = [u.strip() for u in args.url.split(",") if u.strip()]
        for u in urls:
            wait_ready(u)
        if args.find_capacity:
            return await find_capacity(urls, questions, level, probes=probes, with_video=video, **kwargs)
        return await run_sessions(urls, questions, args.sessions, **kwargs)
    # The bench's own engines: room for every probed session, and their admission off, so what is measured
    # is what the machine holds (each one's own estimate is read from /api/capacity and reported beside it).
    engines = max(1, args.engines)
    os.environ.setdefault("IDOLCAST_SERVER__MAX_SESSIONS", str(max(-(-top // engines), 8)))
    os.environ.setdefault("IDOLCAST_CAPACITY__ADMISSION", "false")
    kwargs["same_host"] = True
    if args.find_capacity:  # fresh engines (and memory banks) for every step
        return await find_capacity(
            lambda: engine_processes(args, engines),
            questions,
            level,
            probes=probes,
            with_video=video,
            **kwargs,
        )
    with engine_processes(args, engines) as urls:
        return await run_sessions(urls, questions, args.sessions, **kwargs)


def many_table(report: dict[str, Any]) -> str:
    lines = [
        f"{'session':>7}  {'v2v p50':>7} {'p95':>6}  {'unans':>5}  {'fps':>5} {'min1s':>5}  lipsync mean"
    ]
    for s in report["per_session"]:
        v, ls = s["voice_to_voice_ms"], s["lipsync_offset_ms"] or {}
        lines.append(
            f"{s['index']:>7}  {v['p50']!s:>7} {v['p95']!s:>6}  {s['unanswered']:>5}  {s['fps_mean']!s:>5} "
            f"{s['fps_min_1s']!s:>5}  {ls.get('mean')}" + (f"  ERROR {s['error']}" if s["error"] else "")
        )
    p = report["pooled"]
    v = p["voice_to_voice_ms"]
    lines.append(
        f"pooled ({report['sessions']} sessions): v2v p50 {v['p50']} p95 {v['p95']} n {v['n']}, "
        f"unanswered {p['unanswered']}, fps mean {p['fps_mean']} min(1s) {p['fps_min_1s']} (by media time "
        f"{p.get('fps_min_1s_media')}, by packet arrival {p.get('fps_min_1s_network')}), "
        f"lipsync mean {p['lipsync_offset_ms']['mean']} |p95| {p['lipsync_abs_p95_ms']}, "
        f"clients' loop lag max {p.get('client_loop_lag_max_ms')} ms"
    )
    host = report.get("host_cpu")
    if host:
        kinds = ", ".join(f"{k} {v:.0%}" for k, v in host.items() if k in CPU_TIME_KINDS and v >= 0.005)
        lines.append(
            f"the box's CPU from the peak on: {host['busy_cores']} of {host['cores']} cores busy ({kinds})"
        )
    cap = report.get("capacity")
    if cap:
        for step in cap["steps"]:
            sv = step["pooled"]["voice_to_voice_ms"]
            est = (step.get("engine_capacity") or {}).get("capacity")
            lines.append(
                f"  N={step['sessions']}: {'held' if step['held'] else 'broke'} p95 {sv['p95']} "
                f"(engine's estimate {est}) {'; '.join(step['broken'])}"
            )
        lines.append(
            f"capacity: {cap['largest_n_held']} session(s) held the service level {cap['service_level']}"
        )
    return "\n".join(lines)


async def _browser_jitter(args: argparse.Namespace) -> dict[str, Any]:
    from engine.bench.browser_receiver import measure_browser_jitter

    if args.url:
        wait_ready(args.url)
        return await measure_browser_jitter(args.url)
    with engine_process(args) as url:
        return await measure_browser_jitter(url)


def print_table(report: dict[str, Any]) -> None:
    print(
        f"{'turn':>4}  {'v2v ms':>7}  {'asr':>6} {'llm1':>6} {'chunk1':>6} {'tts1':>6} {'sent1':>6}  transcript"
    )
    for i, t in enumerate(report["turns"], 1):
        s = t["stages_ms"]

        def f(k: str, s: dict[str, float] = s) -> str:
            return f"{s[k]:6.0f}" if k in s else "     -"

        v = t["voice_to_voice_ms"]
        print(
            f"{i:>4}  {v if v is not None else '-':>7}  {f('asr_final')} {f('llm_first_token')} "
            f"{f('first_chunk_text')} {f('tts_first_audio')} {f('first_audio_sent')}  {t['transcript']!r}"
            + (f"  UNANSWERED: {t['unanswered']}" if t.get("unanswered") else "")
        )
    print(f"unanswered: {report.get('unanswered', 0)}")
    for key in ("voice_to_voice_ms", "barge_in_stop_ms", "barge_in_cut_ms"):
        if (s := report.get(key)) is not None:
            print(f"{key}: p50 {s['p50']} p95 {s['p95']} n {s['n']}")
    print(f"wer: {report['wer']}")
    if (quiet := report.get("silences_in_replies")) is not None:
        print(
            f"silences inside replies: {quiet['replies']} of {quiet['of']} replies, {quiet['silences']} in all, "
            f"longest {quiet['longest_ms']} ms"
        )
    if report.get("video_size"):
        ls = report["lipsync_offset_ms"]
        print(
            f"video {report['video_size']}: fps mean {report['fps_mean']} min(1s) {report['fps_min_1s']}"
            f" (by media time {report.get('fps_min_1s_media')}, by packet arrival {report.get('fps_min_1s_network')})"
        )
        print(f"lipsync_offset_ms: mean {ls['mean']} p95 {ls['p95']} n {ls['n']} (positive = video late)")
