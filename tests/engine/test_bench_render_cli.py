"""`idolcast bench --render` refuses a backend it does not know with a line, not a traceback."""

from __future__ import annotations

import pytest

from engine.cli import main

pytestmark = pytest.mark.unit


def test_an_unknown_render_backend_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match=r"--backends: unknown cpu \(known: torch,"):
        main(["bench", "--render", "--backends", "cpu,torch"])
