"""Browser fixtures: Debian's Chromium driven by Python Playwright, a fake mic from a WAV file."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from engine.models import EngineModels
from tests.surfaces.harness import shared_models

CHROMIUM = "/usr/bin/chromium"
HAVE_CHROMIUM = os.path.exists(CHROMIUM)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


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
