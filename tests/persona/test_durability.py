"""A process doing write-back is SIGKILLed mid-write: every committed memory survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from persona.embed import HashEmbedder
from persona.store import MemoryStore

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import sys, time
    from persona.bank import MemoryBank
    from persona.embed import HashEmbedder
    from persona.facts import Fact
    from persona.writeback import apply_facts

    bank = MemoryBank.open(sys.argv[1], HashEmbedder(), "aiko")
    i = 0
    while True:  # one write-back transaction per turn, as the provider does
        facts = [Fact("viewer_fact", f"viewer{i}", f"viewer{i} likes topic {i} number {j}", f"opinion:t{i}-{j}")
                 for j in range(5)]
        results = apply_facts(bank, facts, now=time.time())
        print(" ".join(str(r.memory_id) for r in results), flush=True)  # reported only after COMMIT
        i += 1
    """
)


def test_sigkill_mid_writeback_loses_nothing_committed(tmp_path: Path) -> None:
    db = tmp_path / "memory.sqlite3"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    committed: list[int] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while len(committed) < 5 * 40 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        committed += [int(x) for x in line.split()]
    os.kill(proc.pid, signal.SIGKILL)  # while it is in the middle of the next write-backs
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) >= 200, "the child did not get going"

    store = MemoryStore(db)
    assert store.integrity_check() == "ok"
    found = store.get(committed)
    assert set(found) == set(committed)
    for mid in committed[:50]:
        m = found[mid]
        assert m.text.startswith(m.subject + " likes topic")
    # and the store is writable again, the index rebuilds from it
    from persona.bank import MemoryBank

    store.close()
    bank = MemoryBank.open(db, HashEmbedder(), "aiko")
    assert bank.index_state == "rebuilt" and len(bank.index) == bank.store.count("aiko", active_only=True)
    bank.add("after the crash", kind="stream_event")
    bank.close()
