"""A bounded soak: `idolcast bench --turns N` with the engine's memory and threads sampled as the turns go.

    python scripts/soak.py --turns 100 --out docs/results/soak-YYYY-MM-DD.json [-- extra bench args]

The bench starts its own engine (a child process); this script finds that child and reads its
``/proc/PID/status`` (VmRSS, Threads) every ``--every`` seconds, and counts the turns done from the bench's
log. The report: the samples, RSS and threads after turn 10 and after the last turn, the bench's own report
(voice-to-voice, unanswered turns, lip-sync offset of every reply: the first and the last compared).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def status(pid: int) -> dict[str, int] | None:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


def engine_pid(bench_pid: int) -> int | None:
    """The bench's engine: its child running `engine.cli run` (or any python child)."""
    for c in children(bench_pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "engine" in cmd:
            return c
    return None


def at_turn(samples: list[dict[str, Any]], turn: int) -> dict[str, Any] | None:
    """The first sample taken once ``turn`` turns were done."""
    return next((s for s in samples if s["turns"] >= turn), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--out", required=True)
    ap.add_argument("bench_args", nargs="*")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "engine.cli", "bench", "--turns", str(args.turns), "--barge-rounds", "0"]
    cmd += ["--json", *args.bench_args]
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    turns = 0
    log_tail: list[str] = []

    def read_log() -> None:
        nonlocal turns
        assert bench.stderr is not None
        for line in bench.stderr:
            if "engine.bench.voice: turn" in line:  # 'turn: ...' and 'turn unanswered: ...'
                turns += 1 if "turn unanswered" not in line else 0
                if "turn unanswered" in line:
                    log_tail.append(line.strip())
            sys.stderr.write(line)

    out_text: list[str] = []

    def read_report() -> None:  # drained as it comes: a report bigger than the pipe would block the bench
        assert bench.stdout is not None
        out_text.append(bench.stdout.read())

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    report_reader = threading.Thread(target=read_report, daemon=True)
    report_reader.start()
    samples: list[dict[str, Any]] = []
    start = time.monotonic()
    pid: int | None = None
    partial = Path(args.out).with_suffix(".samples.jsonl")  # kept as it goes: a crash loses nothing
    with partial.open("w") as log:
        while bench.poll() is None:
            pid = pid or engine_pid(bench.pid)
            st = status(pid) if pid else None
            if st and "VmRSS" in st:  # a zombie (the engine exiting) has no memory to report
                sample = {
                    "t_s": round(time.monotonic() - start, 1),
                    "turns": turns,
                    "rss_mib": round(st["VmRSS"] / 1024, 1),
                    "threads": st.get("Threads", 0),
                }
                samples.append(sample)
                log.write(json.dumps(sample) + "\n")
                log.flush()
            time.sleep(args.every)
    report_reader.join(timeout=30)
    report = json.loads("".join(out_text) or "{}")
    reader.join(timeout=5)
    after10, last = at_turn(samples, 10), (samples[-1] if samples else None)
    # the last sample with the engine still serving (before the bench shut it down): the max turn reached
    done = [s for s in samples if s["turns"] == max((x["turns"] for x in samples), default=0)]
    end = done[0] if done else last
    per_reply = report.get("lipsync_per_reply") or []
    out = {
        "command": " ".join(cmd),
        "turns_requested": args.turns,
        "after_turn_10": after10,
        "after_last_turn": end,
        "rss_growth_mib": round(end["rss_mib"] - after10["rss_mib"], 1) if after10 and end else None,
        "threads_growth": end["threads"] - after10["threads"] if after10 and end else None,
        "unanswered": report.get("unanswered"),
        "voice_to_voice_ms": report.get("voice_to_voice_ms"),
        "wer": report.get("wer"),
        "lipsync_first_reply_ms": per_reply[0]["offset_ms"] if per_reply else None,
        "lipsync_last_reply_ms": per_reply[-1]["offset_ms"] if per_reply else None,
        "lipsync_offset_ms": report.get("lipsync_offset_ms"),
        "fps_mean": report.get("fps_mean"),
        "samples": samples,
        "unanswered_log": log_tail,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=1))
    return bench.returncode or 0


if __name__ == "__main__":
    raise SystemExit(main())
