"""Browser fixtures: Debian's Chromium driven by Python Playwright, a fake mic from a WAV file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from engine.bench.chromium import CHROMIUM, FLAGS, HAVE_CHROMIUM
from engine.models import EngineModels
from tests.surfaces.harness import shared_models


@pytest.fixture(scope="session")
def surface_models() -> EngineModels:
    return shared_models()


@pytest.fixture
async def launch() -> AsyncIterator[Callable[..., Any]]:
    """``await launch(wav=PATH)``: a Chromium browser whose fake mic plays the WAV once."""
    if not HAVE_CHROMIUM:
        pytest.skip(f"Chromium is not installed at {CHROMIUM}")
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browsers: list[Any] = []

        async def start(wav: Path | None = None) -> Any:
            args = list(FLAGS)
            if wav is not None:
                args.append(f"--use-file-for-fake-audio-capture={wav}%noloop")
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=args)
            browsers.append(browser)
            return browser

        yield start
        for b in browsers:
            await b.close()
