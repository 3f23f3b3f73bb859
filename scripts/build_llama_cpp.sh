#!/usr/bin/env bash
# Build and install llama-cpp-python (llama.cpp from source: PyPI has no wheel for it) into the venv.
# Shows the compile's progress, keeps the whole log, and says what to do when the build fails.
# pip keeps the built wheel in its cache: later installs of the same version take seconds.
set -uo pipefail
PY=${1:?usage: build_llama_cpp.sh PYTHON SPEC}
SPEC=${2:?usage: build_llama_cpp.sh PYTHON SPEC}
LOG=${LLAMA_BUILD_LOG:-var/build/llama-cpp.log}
mkdir -p "$(dirname "$LOG")"
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('llama-cpp-python') == '${SPEC#*==}' else 1)" 2>/dev/null; then
  echo "llama.cpp: $SPEC already installed"
  exit 0
fi
echo "llama.cpp: building $SPEC from source (the first time ~6-8 min on 2 cores; pip caches the wheel)"
echo "llama.cpp: full log in $LOG"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$PY" -m pip install -v "$SPEC" >"$LOG" 2>&1 &
pid=$!
last=""
while kill -0 "$pid" 2>/dev/null; do
  sleep 15
  step=$(grep -aoE '^ *\[[0-9]+/[0-9]+\]' "$LOG" | tail -n 1 | tr -d ' []')
  if [ -n "$step" ] && [ "$step" != "$last" ]; then
    done_n=${step%/*}; total=${step#*/}
    echo "llama.cpp: compiled $done_n of $total ($((100 * done_n / total))%, $(( $(date +%s) - start )) s)"
    last=$step
  fi
done
wait "$pid"
rc=$?
if [ $rc -ne 0 ]; then
  echo
  echo "llama.cpp: THE BUILD FAILED (pip exit $rc). The last lines of $LOG:"
  tail -n 25 "$LOG" | sed 's/^/    /'
  echo
  echo "It needs a C/C++ compiler and CMake: on Debian/Ubuntu 'apt-get install build-essential cmake'."
  echo "Without it, set llm.backend = \"transformers\" in idolcast.toml (slower on a CPU)."
  exit $rc
fi
echo "llama.cpp: installed in $(( $(date +%s) - start )) s"
