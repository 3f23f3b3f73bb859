"""idolcast engine: a real-time AI virtual idol, from the host's voice to her animated reply."""

import os
from collections.abc import MutableMapping

__version__ = "0.1.0"

# Idle OpenMP workers sleep instead of spinning, after a short spin that keeps the barriers inside one
# forward pass fast (engine/native.py says why); what the environment sets is kept.
QUIET_THREAD_POOLS = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
SHORT_SPIN = {"GOMP_SPINCOUNT": "1000"}  # only with the policy set here: it would override a user's ACTIVE
# OpenCV (the sent picture's colour conversion, the CPU render) runs in the calling thread: each session's
# frames are converted in its own media thread already, and OpenCV's own pool (a worker per core, woken for
# every call) cost more than the conversion on a 16-core box (engine/native.py).
SEQUENTIAL_OPENCV = {"OPENCV_FOR_THREADS_NUM": "1"}


def quiet_thread_pools(environ: MutableMapping[str, str] = os.environ) -> None:
    if "OMP_WAIT_POLICY" not in environ:
        for name, value in SHORT_SPIN.items():
            environ.setdefault(name, value)
    for name, value in (QUIET_THREAD_POOLS | SEQUENTIAL_OPENCV).items():
        environ.setdefault(name, value)


quiet_thread_pools()  # before any native library starts its threads: every entry point imports engine first
