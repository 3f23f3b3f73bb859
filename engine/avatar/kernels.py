"""The procedural features compiled for the CPU: one C++ loop a feature instead of its small tensor ops.

An eye is ~300 elementwise torch ops on a 67×70 patch (720p), the mouth ~100 on 62×49: each op costs a few
microseconds of dispatch whatever its size, so eager torch spends 0.9 ms on an eye and 0.5 ms on the mouth
(720p, one core). ``torch.compile`` (Inductor's C++ backend) fuses a feature's ops into one loop: 0.15 and
0.07 ms, the same maths to float rounding (docs/PERFORMANCE.md, "2026-12-05 noon").

Compiling needs a C++ compiler and costs ~45 s on two cores the first time on a machine, ~5 s
after (Inductor caches under ``$TORCHINDUCTOR_CACHE_DIR``, :data:`CACHE_DIR` unless set). ``mode``:

* ``"off"``: eager, as the GPU backends' modules run;
* ``"auto"``: compiled where it works; a feature whose compile fails stays eager (logged once);
* ``"on"``: compiled or an error (a test, or a machine where the cost matters).

:class:`FeatureKernels` draws a list of features for one frame, twins (the two eyes,
:func:`~engine.avatar.features.twin_groups`) in one batched call, with the compiled kernel of each group where
there is one and eagerly where not.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from engine.avatar.config import KernelMode
from engine.avatar.features import Feature, ProceduralFeature, twin_groups
from engine.progress import Progress

log = logging.getLogger(__name__)

CACHE_DIR = "var/cache/inductor"

Kernel = Callable[[Tensor], Tensor]


class KernelsUnavailable(RuntimeError):
    """``mode = "on"`` and a feature could not be compiled here; the message says why."""


def compiler_missing() -> str | None:
    """Why Inductor's C++ backend cannot build here, or None."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not on PATH)"
    return None


def _compile(fn: Kernel) -> Kernel:
    # importing torch's compiler raises the recursion limit process-wide: put it back (compiling raises it
    # again, to 2,000; the server bounds JSON nesting itself, engine/server/errors.py)
    limit = sys.getrecursionlimit()
    import torch._inductor.config as inductor

    sys.setrecursionlimit(limit)

    inductor.cpp.threads = 1  # the features are a few thousand pixels: one thread, no OpenMP team to wake
    # not fullgraph: with it, a call during which Python code outside the kernel runs first (a garbage
    # collection's callbacks, engine/heap.py) can fail with "found no compiled frames" (seen once in a bench
    # at 720p: it stopped that session's video); the features have no graph breaks (tests/avatar/test_kernels.py)
    compiled: Kernel = torch.compile(fn, dynamic=False)
    return compiled


class FeatureKernels:
    """Compiled kernels for a character's procedural features, drawn by index (see module docstring)."""

    def __init__(self, feats: Sequence[Feature], mode: KernelMode = "auto") -> None:
        self.feats = list(feats)
        self.mode = mode
        self._kernels: dict[tuple[int, ...], Kernel] = {}

    @property
    def compiled(self) -> int:
        """How many feature groups (a single feature, or twins) run compiled."""
        return len(self._kernels)

    def build(self, example: Tensor, progress: Progress | None = None) -> None:
        """Compile every procedural feature alone and every set of twins together, each run once on
        ``example`` (``[1, P]``) under inference mode, as the renderer calls them. Blocking: seconds."""
        if self.mode == "off" or not any(isinstance(f, ProceduralFeature) for f in self.feats):
            return
        why = compiler_missing()
        if why is not None:
            if self.mode == "on":
                raise KernelsUnavailable(f"avatar.cpu_kernels = on, but there is {why}")
            log.info("avatar features run eagerly: %s", why)
            return
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(CACHE_DIR))
        groups = self._groups()
        started = time.monotonic()
        for n, group in enumerate(groups):
            if progress is not None:
                progress(
                    "avatar",
                    f"compiling the face's features ({n + 1}/{len(groups)}; ~45 s the first start on a machine, "
                    "cached after)",
                    n / len(groups),
                )
            try:
                kernel = _compile(self._eager(group))
                with torch.inference_mode():
                    kernel(example)
            except Exception as e:
                if self.mode == "on":
                    raise KernelsUnavailable(f"compiling {self._name(group)} failed: {e}") from e
                log.warning("avatar feature %s runs eagerly: compiling it failed (%s)", self._name(group), e)
                continue
            self._kernels[group] = kernel
        log.info(
            "avatar features compiled: %d of %d in %.1f s",
            len(self._kernels),
            len(groups),
            time.monotonic() - started,
        )

    def draw(self, items: Sequence[int], p: Tensor) -> list[Tensor]:
        """Each feature's output ``[1, 4, h, w]`` for one frame ``p`` ``[1, P]``, in ``items``' order."""
        out: dict[int, Tensor] = {}
        for group in twin_groups([self.feats[i] for i in items]):
            key = tuple(items[k] for k in group)
            kernel = self._kernels.get(key)
            drawn = None
            if kernel is not None:
                try:
                    drawn = kernel(p)
                except Exception:  # never the frame: this group is drawn eagerly from now on
                    log.exception(
                        "avatar feature %s: its compiled kernel failed; drawn eagerly now", self._name(key)
                    )
                    del self._kernels[key]
            if drawn is None:
                drawn = self._eager(key)(p)
            for k, i in enumerate(key):
                out[i] = drawn[k : k + 1]
        return [out[i] for i in items]

    def _groups(self) -> list[tuple[int, ...]]:
        """Every procedural feature alone, and every set of twins together."""
        procedural = [i for i, f in enumerate(self.feats) if isinstance(f, ProceduralFeature)]
        singles = [(i,) for i in procedural]
        twins = [
            tuple(procedural[k] for k in group)
            for group in twin_groups([self.feats[i] for i in procedural])
            if len(group) > 1
        ]
        return singles + twins

    def _eager(self, group: tuple[int, ...]) -> Kernel:
        feats = [self.feats[i] for i in group]
        if len(feats) == 1:
            return feats[0]
        twins = type(feats[0]).draw_twins

        def draw(p: Tensor) -> Tensor:
            return twins(feats, p)

        return draw

    def _name(self, group: tuple[int, ...]) -> str:
        return "+".join(self.feats[i].name for i in group)


__all__ = ["CACHE_DIR", "FeatureKernels", "KernelsUnavailable", "compiler_missing"]
