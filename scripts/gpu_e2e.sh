#!/usr/bin/env bash
# The GPU end-to-end run (docs/PERFORMANCE.md, "GPU: end to end"), on the lent H200. Only 64 MiB travel per
# device call and the checkout there is copied afresh for every call, so the wheels are installed outside it,
# under $STORE (/var/tmp/idolcast), which stays while the machine is warm (30 s after a call ends): three
# calls, each made at once after the one before.
#
#   here, once:  python -m engine.bench.gpu_carry            # fills .whl/ .gpu/ .voice/ (ignored folders)
#   call 1:      carry [".whl", ".gpu"]  bash scripts/gpu_e2e.sh install && bash scripts/gpu_e2e.sh checks
#   call 2:      carry [".voice"]        bash scripts/gpu_e2e.sh stash
#                (or [".voice-xz"]: the voice xz-compressed, 58 MB; docs/PERFORMANCE.md "The next device run")
#   call 3:      bash scripts/gpu_e2e.sh bench (the persona's .whl2 only for a bench with the persona on: with it
#                off, the default here, the engine never imports usearch; with .voice-xz, stash and bench are one call)
#
# With real words (issue 16's turn-taking judged from them): `python -m engine.bench.gpu_carry --real` also
# fills .real0/ .real1/ ... (tiny.en on CTranslate2, the SmolLM2 GGUF, their wheels: one tar in parts); after
# call 1, each call carries one part (.real-voice-a, .real-voice-b, .real0, ...) and runs `stash`, made at once after the one before; the last
# one carries the last part and .whl2 and runs `stash && REAL=1 bash scripts/gpu_e2e.sh bench`, which unpacks them: tiny.en decodes on the
# GPU (the transformers backend reads the CTranslate2 folder; CTranslate2's own wheels are CUDA 12 builds, the
# image is CUDA 13; ASR_CPU=1 runs it on the host's CPU instead), the real SmolLM2 replies on the GPU
# (transformers, CUDA graphs) and judges the end of turn itself; the end-of-turn silence is the engine's. Piper
# runs on the GPU when the parts brought onnxruntime-gpu and its first chunk is quicker there (timed first; TTS_CPU=1 / TTS_GPU=1 choose).
#
# `install` puts the wheels into $STORE/site and the tokenizer into $STORE/tokenizer. `checks` runs tests/gpu
# and the stage benches (engine/bench/gpu_stages.py, gpu_llm_together.py, scripts/render_beside_load.py, scripts/render_memory.py, scripts/opencv_pool.py). `bench` runs `idolcast bench` with the whole pipeline:
# engine subprocess + aiortc client on this host, a Whisper-small-shaped ASR and a Qwen2.5-1.5B-shaped LLM
# (random weights, CUDA graphs), Piper on the host CPU, the CUDA-graph avatar at 720p, then times the voice's
# first chunk alone. Results go to $OUT. EOT_MS overrides the end-of-turn silence (default: the engine's
# 400 ms; a question's 200 ms); PAUSE_MS the pause that starts the speculative decode (64 ms here; the
# engine's default, 96 ms, suits a CPU); TURNS and BARGE the bench's questions and barge-in rounds; any other
# IDOLCAST_* variable set by the caller is passed on. Many sessions (issue 13): SESSIONS=N runs
# `idolcast bench --sessions N`, FIND_CAPACITY=MAX runs `--find-capacity --max-probe MAX` (PROBE=1,8,16 tries those counts instead; STAGGER_S the
# seconds between the hosts' first questions, SL_P95_FACTOR / SL_MIN_FPS the service level, CLIENT_PROCS the
# worker processes the bench's clients are spread over, 0 = one per two clients; ENGINES the engine processes
# the sessions are spread over, replicas sharing the GPU, each sizing its pools for the whole box unless
# IDOLCAST_SERVER__CPUS gives its share; ICE_DEBUG=1 has the client workers log every STUN
# message); both write
# $OUT/sessions.json instead of bench.json and skip the single-session report. VERBOSE=1: the single-session
# bench and its engine log at debug level (each pause's speculation and turn-end judgement) into bench.log.
# STALL_MS: an engine's video stall report threshold (server.stall_report_ms, 250 here; 0 = off). MPS=1 (many
# sessions): the engines share the GPU through NVIDIA's MPS daemon, started and stopped by the run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STORE=${STORE:-/var/tmp/idolcast}
TOKENIZER=$STORE/tokenizer
export PYTHONPATH="$STORE/site" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

info() {
    { date -u +"%F %T UTC"; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
      python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)'
      nproc; lscpu | grep -E '^(Model name|Thread\(s\) per core|CPU\(s\) scaling MHz|CPU max MHz)' || true
      grep -E '^(cpu |procs_running)' /proc/stat; } 2>&1 | tee "$OUT/machine.txt"
}

install_late() {  # .whl2: the persona memory's index wheels, carried with the voice (call 1 is full)
    if ls .whl2/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STORE/site" \
            .whl2/*.whl && echo "installed .whl2"
    fi
}

unpack_real() {
    [ -d "$STORE/real" ] && return 0
    ls "$STORE"/parts/real* > /dev/null 2>&1 || { echo "no parts in $STORE/parts: carry .real0 ... with stash"; return 1; }
    # parts in order: real0 real1 ... real10
    ls "$STORE"/parts/ | sort -t l -k 2 -n | sed "s|^|$STORE/parts/|" | xargs cat | tar -x -C "$STORE" || return 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STORE/site" \
        "$STORE"/real/wheels/*.whl || return 1
    rm -rf "$STORE/parts"
}

tts_gpu_quicker() {  # the voice's first chunk on the GPU against the host's CPU (8 threads: the engine's auto)
    python3 -m engine.bench.gpu_stages --tts "$1" --tts-threads 8 --repeats 5 --out "$OUT/tts-pick.json" \
        > /dev/null 2>&1 || { echo "Piper's first chunk could not be timed: the host's CPU"; return 1; }
    python3 - "$OUT/tts-pick.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))["tts"]
gpu, cpu = t.get("cuda_first_chunk_ms"), t.get("threads_8_first_chunk_ms")
quicker = gpu is not None and cpu is not None and gpu < cpu
print(f"Piper's first chunk: GPU {gpu} ms, host CPU (8 threads) {cpu} ms: on the {'GPU' if quicker else 'CPU'}")
sys.exit(0 if quicker else 1)
EOF
}

case "${1:-}" in
stash)
    install_late
    mkdir -p "$STORE/parts"
    for d in .real[0-9]*; do [ -f "$d/part" ] && cp "$d/part" "$STORE/parts/${d#.}" && echo "stashed $d"; done
    mkdir -p "$STORE/voice"
    if [ -d .voice ]; then cp .voice/* "$STORE/voice/" && echo "stashed .voice"; fi
    # the voice xz-compressed (58 MB: it fits one call beside the tree, with nothing else): .voice-xz
    if [ -f .voice-xz/en_US-joe-medium.onnx.xz ]; then
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            .voice-xz/en_US-joe-medium.onnx.xz "$STORE/voice/en_US-joe-medium.onnx" \
            && cp .voice-xz/*.json "$STORE/voice/" && echo "stashed .voice-xz: the voice is whole"
    fi
    # the voice in two halves (it does not fit one call beside the tree): .real-voice-a, then .real-voice-b
    if [ -f .real-voice-a/part ]; then cp .real-voice-a/part "$STORE/voice/a" && echo "stashed .real-voice-a"; fi
    if [ -f .real-voice-b/part ] && [ -f "$STORE/voice/a" ]; then
        cat "$STORE/voice/a" .real-voice-b/part > "$STORE/voice/en_US-joe-medium.onnx" && rm "$STORE/voice/a"
        cp .real-voice-b/*.json "$STORE/voice/" && echo "stashed .real-voice-b: the voice is whole"
    fi
    ls -la "$STORE/parts" "$STORE/voice" 2> /dev/null
    ;;
install)
    mkdir -p "$STORE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STORE/site" \
        .whl/*.whl || exit 1
    tar -xzf .gpu/tokenizer.tar.gz -C "$STORE"
    python3 -c 'import aiortc, av, piper, silero_vad, aiomqtt, pydantic, engine.server.app; print("imports ok")'
    ;;
checks)
    info
    python3 -m pytest -q -p no:cacheprovider tests/gpu tests/llm/test_random_and_graph_path.py tests/avatar/test_backends.py -rs 2>&1 \
        | tee "$OUT/tests.txt" | tail -25
    python3 -m engine.bench.gpu_stages --llm --asr --tokenizer "$TOKENIZER" --out "$OUT/stages.json" 2>&1 \
        | tee "$OUT/stages.txt" | grep -v sample_
    # replies decoded at once: each slot alone against the shared step (llm.cuda_graph_batched)
    python3 -m engine.bench.gpu_llm_together --shape 1.5B --replies 1,2,4,8 --out "$OUT/llm-together.json" 2>&1 | tail -10
    # a frame's GPU round trip beside other GPU work of the process: the default stream against its own
    PYTHONPATH=.:$PYTHONPATH python3 scripts/render_beside_load.py --batch 4 --seconds 5 --out "$OUT/render-beside-load.json" 2>&1 | tail -25
    # what the avatar's graphs hold on the GPU: rows captured for, one shared pool or a pool a bucket
    PYTHONPATH=.:$PYTHONPATH python3 scripts/render_memory.py --profile 720p --max-batch 8 32 --out "$OUT/render-memory.json" 2>&1 | tail -6
    # what OpenCV's own pool costs the sent picture's conversion on this host's cores
    python3 scripts/opencv_pool.py --sessions 4 --seconds 3 --threads -1 1
    ;;
bench)
    info
    test -d "$STORE/site/aiortc" || { echo "no $STORE/site: run 'install' first on this machine"; exit 1; }
    install_late
    VOICE=.voice/en_US-joe-medium.onnx
    [ -f "$VOICE" ] || VOICE=$STORE/voice/en_US-joe-medium.onnx
    export IDOLCAST_TTS__VOICE=$VOICE \
        IDOLCAST_AVATAR__BACKEND=cuda-graph IDOLCAST_PERSONA__ENABLED=false IDOLCAST_MQTT__ENABLED=false
    if [ -n "${REAL:-}" ]; then
        unpack_real || exit 1
        GGUF=$(ls "$STORE"/real/llm/*.gguf)
        # tiny.en on the GPU: the transformers backend reads the CTranslate2 folder's weights itself
        # (engine/asr/ct2_whisper.py) and decodes with CUDA graphs. ASR_CPU=1: faster-whisper on the host's
        # CPU instead, on the engine's default threads (4 here; 8 were slower, docs/PERFORMANCE.md)
        if [ -n "${ASR_CPU:-}" ]; then
            export IDOLCAST_ASR__BACKEND=faster-whisper IDOLCAST_ASR__DEVICE=cpu
        else
            export IDOLCAST_ASR__BACKEND=transformers IDOLCAST_ASR__DEVICE=cuda
        fi
        # Piper where its first chunk is quicker: the parts may bring onnxruntime-gpu (gpu_carry --real; --tts-cpu
        # leaves it out), and then the first chunk is timed on the GPU and on the host's CPU at the engine's 8
        # threads ($OUT/tts-pick.json, ~20 s). TTS_CPU=1 / TTS_GPU=1: the host's CPU / the GPU, untimed
        if [ -z "${TTS_CPU:-}" ] && ls "$STORE"/site/onnxruntime_gpu-*.dist-info > /dev/null 2>&1; then
            if [ -n "${TTS_GPU:-}" ] || tts_gpu_quicker "$VOICE"; then export IDOLCAST_TTS__DEVICE=cuda;
            else export IDOLCAST_TTS__DEVICE=cpu; fi
        fi
        export IDOLCAST_ASR__MODEL="$STORE/real/asr" \
            IDOLCAST_LLM__BACKEND=transformers IDOLCAST_LLM__MODEL="$GGUF" IDOLCAST_LLM__DEVICE=cuda
    else
        export IDOLCAST_ASR__BACKEND=transformers IDOLCAST_ASR__MODEL=random:small IDOLCAST_ASR__DEVICE=cuda \
            IDOLCAST_ASR__TOKENIZER="$TOKENIZER" \
            IDOLCAST_LLM__MODEL=random:qwen2.5-1.5b IDOLCAST_LLM__TOKENIZER="$TOKENIZER" IDOLCAST_LLM__DEVICE=cuda \
            IDOLCAST_LLM__DTYPE=bfloat16 IDOLCAST_LLM__MAX_NEW_TOKENS=32
    fi
    if [ -n "${EOT_MS:-}" ]; then export IDOLCAST_VAD__END_OF_TURN_SILENCE_MS=$EOT_MS; fi
    export IDOLCAST_SERVER__STALL_REPORT_MS=${STALL_MS:-250}
    # on a GPU the speculative decode at a pause costs ~22 ms: speculate sooner (docs/configuration.md)
    export IDOLCAST_VAD__PAUSE_MS=${PAUSE_MS:-64}
    { env | grep '^IDOLCAST_' | sort; python3 -m engine.cli config show; } > "$OUT/config.txt" 2>&1
    if [ -n "${FIND_CAPACITY:-}" ] || [ "${SESSIONS:-1}" -gt 1 ]; then
        # MPS=1: the engines' kernels run side by side on the GPU through NVIDIA's MPS daemon (started here
        # on a pipe folder of our own, so only this run's processes use it; stopped at the end), instead of
        # the driver time-slicing between processes. The GPU's own settings are not touched.
        MPS_STARTED=""
        if [ -n "${MPS:-}" ]; then
            if command -v nvidia-cuda-mps-control > /dev/null; then
                export CUDA_MPS_PIPE_DIRECTORY=$STORE/mps/pipe CUDA_MPS_LOG_DIRECTORY=$STORE/mps/log
                mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
                nvidia-cuda-mps-control -d && MPS_STARTED=1 && echo "MPS daemon started"
            else
                echo "MPS=1: nvidia-cuda-mps-control is not on this machine; the engines share the GPU by time-slicing"
            fi
        fi
        if [ -n "${FIND_CAPACITY:-}" ]; then MANY=(--find-capacity --max-probe "$FIND_CAPACITY" ${PROBE:+--probe "$PROBE"});
        else MANY=(--sessions "$SESSIONS"); fi
        # 20 s before the limit, the engine dumps every thread's and task's stack (engine/server/diagnostics.py)
        ( sleep $(( ${BENCH_TIMEOUT:-540} - 20 )); pkill -USR1 -f "engine.cli serve"
          top -b -n 1 -H -w 200 | head -60 > "$OUT/top-threads.txt" ) > /dev/null 2>&1 &
        DUMPER=$!
        timeout "${BENCH_TIMEOUT:-540}" python3 -m engine.cli bench --turns "${TURNS:-5}" "${MANY[@]}" \
            --stagger-s "${STAGGER_S:-1.0}" --client-procs "${CLIENT_PROCS:-0}" --engines "${ENGINES:-1}" --sl-p95-factor "${SL_P95_FACTOR:-1.5}" \
            --sl-min-fps "${SL_MIN_FPS:-27}" ${ICE_DEBUG:+--client-ice-debug} --json > "$OUT/sessions.json" 2> "$OUT/sessions.log"
        echo "bench exit $?"
        kill "$DUMPER" 2> /dev/null
        if [ -n "$MPS_STARTED" ]; then echo quit | nvidia-cuda-mps-control && echo "MPS daemon stopped"; fi
        tail -5 "$OUT/sessions.log"
        # the engines' word on their video: frames dropped as late, stalls with the busy threads' stacks
        # (server.stall_report_ms; STALL_MS here, 250 by default); the log travels compressed
        echo "drop warnings: $(grep -c 'dropped as late' "$OUT/sessions.log"), stall reports: $(grep -c 'video stalled' "$OUT/sessions.log")"
        # the audio senders' word: did a sender fall behind the clock (her words reach the viewer that late)?
        grep -ho 'audio: [0-9]* frames asked for more than [0-9]* ms late, the latest [0-9]* ms' "$OUT/sessions.log" \
            | sort -k13 -n | tail -3 | sed 's/^/worst /'
        grep -m 3 -A 40 'video stalled' "$OUT/sessions.log" | cut -c1-220 | head -120
        gzip -f "$OUT/sessions.log"
        python3 - "$OUT/sessions.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["per_session"]:
    print(s["index"], "v2v", s["voice_to_voice_ms"], "unanswered", s["unanswered"], "fps", s["fps_mean"],
          s["fps_min_1s"], "(media", s.get("fps_min_1s_media"), "network", s.get("fps_min_1s_network"), ")",
          "lowest at", s.get("fps_min_1s_unix"), "media", s.get("fps_min_1s_media_unix"),
          "rtp", s.get("rtp_received"),
          "lipsync", s["lipsync_offset_ms"], "client loop lag", s.get("client_loop_lag_ms"),
          s["error"] or "")
stages = r["pooled"].pop("stages_ms", {})
print("pooled", r["sessions"], "engines", r.get("engines"), "client processes", r.get("client_procs"), r["pooled"])
print("stages P50 / P95 from the end of speech:", {k: (v.get("p50"), v.get("p95")) for k, v in stages.items()})
print("host CPU from the peak on", r.get("host_cpu"))
for step in (r.get("capacity") or {}).get("steps", []):
    est = step.get("engine_capacity") or {}
    print("N", step["sessions"], "held" if step["held"] else "broke", step["pooled"]["voice_to_voice_ms"],
          step["broken"], "engine's estimate:", est.get("capacity"), est.get("bounded_by"))
print("capacity", (r.get("capacity") or {}).get("largest_n_held"))
for e in r.get("engine_capacities_end") or []:
    e = e or {}
    print("engine at the end: loop lag", e.get("event_loop_lag_ms"), "render", e.get("render"))
e = r.get("engine_capacity") or {}
for e in r.get("engine_capacities") or [e]:
    e = e or {}
    print("engine at the peak:", e.get("capacity"), e.get("bounded_by"), "loop lag", e.get("event_loop_lag_ms"),
          "render", e.get("render"),
          {k: (v.get("in_use"), v.get("per_session")) for k, v in (e.get("resources") or {}).items()})
EOF
        exit 0
    fi
    timeout "${BENCH_TIMEOUT:-480}" python3 -m engine.cli ${VERBOSE:+-v -v} bench --turns "${TURNS:-20}" --barge-rounds "${BARGE:-3}" \
        --json > "$OUT/bench.json" 2> "$OUT/bench.log"
    echo "bench exit $?"
    tail -5 "$OUT/bench.log"
    # a debug log is larger than a call brings back whole: it travels compressed
    if [ -n "${VERBOSE:-}" ]; then gzip -f "$OUT/bench.log"; fi
    python3 - "$OUT/bench.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("v2v", r["voice_to_voice_ms"], "barge", r["barge_in_stop_ms"])
print("uplink", r.get("uplink_ms"), "downlink", r.get("downlink_ms"))
print("lipsync unsynced", r.get("lipsync_offset_unsynced_ms"), "shift", r.get("lipsync_sync_shift_ms"))
print("lipsync", r.get("lipsync_offset_ms"), "frames", r.get("lipsync_offset_frames_mean"), "fps", r.get("fps_mean"), r.get("fps_min_1s"))
for k, v in r["stages_ms"].items():
    print(k, v)
EOF
    if [ -n "${TTS_STAGE-1}" ]; then  # TTS_STAGE= (empty) skips it
        python3 -m engine.bench.gpu_stages --tts "$VOICE" --repeats 10 --out "$OUT/tts.json" | tail -3
    fi
    ;;
ab)
    # Settings compared on one host (issue 13): VARIANTS, ';'-separated, each a few VAR=value words ('-': none),
    # run ROUNDS times (default 2) interleaved, each a whole `bench` with the caller's SESSIONS, ENGINES, ...:
    #   VARIANTS='-;IDOLCAST_SERVER__CPUS=4;IDOLCAST_SERVER__MODEL_NICE=0' SESSIONS=16 ENGINES=4 TURNS=2 \
    #   EOT_MS=200 IDOLCAST_VAD__TURN_DETECTOR=off IDOLCAST_TTS__DEVICE=cpu BENCH_TIMEOUT=150 bash scripts/gpu_e2e.sh ab
    # A call brings back 8 files: each run's sessions.json as $OUT/ab-<round>-<variant>.json and its log as
    # ab-<round>-<variant>.log.gz (so at most 4 runs a call), and a few lines each.
    IFS=';' read -ra VARIANT_LIST <<< "${VARIANTS:--}"
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for k in "${!VARIANT_LIST[@]}"; do
            settings=${VARIANT_LIST[$k]}; [ "$settings" = "-" ] && settings=""
            rm -rf "$STORE/ab/$round-$k"
            # shellcheck disable=SC2086  # the words of one variant
            ( if [ -n "$settings" ]; then export $settings; fi; OUT=$STORE/ab/$round-$k bash "$0" bench > "$STORE/ab-$round-$k.txt" 2>&1 )
            cp "$STORE/ab/$round-$k/sessions.json" "$OUT/ab-$round-$k.json" 2> /dev/null || tail -3 "$STORE/ab-$round-$k.txt"
            cp "$STORE/ab/$round-$k/sessions.log.gz" "$OUT/ab-$round-$k.log.gz" 2> /dev/null
            grep -E '^(drop warnings|--- thread|  File)' "$STORE/ab-$round-$k.txt" | head -40
            python3 - "$OUT/ab-$round-$k.json" "$round" "${settings:-(none)}" <<'EOF_AB'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(0)
p, h = r["pooled"], r.get("host_cpu") or {}
engines = r.get("engine_capacities") or []
lag = [e["event_loop_lag_ms"]["p50"] for e in engines]
stages = [e["resources"]["cpu"].get("per_session_stages", {}) for e in engines]
native = {k: round(sum(s.get(k, 0.0) for s in stages) / max(1, len(stages)), 3) for k in ("native", "native_models", "native_media", "encode", "tts", "render", "loop")}
render = [(e.get("render") or {}) for e in engines]
batching = [(r.get("frames_per_batch"), (r.get("render_ms") or {}).get("p95")) for r in render]
print(f"round {sys.argv[2]} {sys.argv[3]}: v2v {p['voice_to_voice_ms'].get('p50')} / {p['voice_to_voice_ms'].get('p95')}",
      f"render frames a batch, p95 ms {batching}",
      f"unanswered {p['unanswered']} fps {p['fps_mean']} low {p['fps_min_1s']} (media {p.get('fps_min_1s_media')})",
      f"loop lag p50 {lag} per-session cores {native} box {h.get('busy_cores')} busy, system {h.get('system')} steal {h.get('steal')}")
print("  the way back: her first audio sent -> heard (P50 / P95):", (p.get("downlink_ms") or {}).get("p50"), "/", (p.get("downlink_ms") or {}).get("p95"))
asr = p.get("asr_final_ms") or {}
print("  the final transcript's costs (P50 / P95):", {k: (v.get("p50"), v.get("p95")) if isinstance(v, dict) else v for k, v in asr.items()})
EOF_AB
        done
    done
    ;;
*)
    echo "usage: $0 install|checks|stash|bench|ab"; exit 2 ;;
esac
