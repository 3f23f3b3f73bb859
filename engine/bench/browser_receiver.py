"""How long Chromium holds the idol's audio in its receive jitter buffer (``idolcast bench --browser-jitter``).

The voice bench's client is an aiortc peer, whose receiver holds audio until ``prefetch`` later frames
have arrived (4 frames = 80 ms by default). A viewer's browser adapts its buffer (NetEq) to the network.
This measures Chromium's own figure on the same engine — ``jitterBufferDelay / jitterBufferEmittedCount``
of the inbound audio in ``getStats()`` while the idol speaks — so the bench can hold its client's buffer
to the same size (``--client-jitter-frames``) and report latency as a browser viewer would get it.
"""

from __future__ import annotations

import asyncio
import tempfile
import wave
from pathlib import Path
from typing import Any

from engine.bench.chromium import CHROMIUM, FLAGS

PROMPTS = ("Tell the viewers a short story about a cat.", "Say something nice about music.")

# The page keeps its peer connection to itself: note every one it makes.
TRACK_PEERS_JS = """(() => {
  const Native = window.RTCPeerConnection;
  window.__peers = [];
  window.RTCPeerConnection = function (...args) {
    const pc = new Native(...args);
    window.__peers.push(pc);
    return pc;
  };
  window.RTCPeerConnection.prototype = Native.prototype;
})();"""

STATS_JS = """async () => {
  const out = [];
  (await window.__peers[0].getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") out.push(s);
  });
  return out;
}"""


def _silent_wav(path: Path, seconds: float = 120.0) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x00" * int(16000 * seconds))


SAY_JS = """async ([session, text]) => {
  // from the page itself: its same-origin host cookie is the credential, as the console's is
  const r = await fetch(`/api/sessions/${session}/say`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ text }),
  });
  if (!r.ok) throw new Error(`say refused: ${r.status} ${await r.text()}`);
}"""


async def measure_browser_jitter(
    url: str, prompts: tuple[str, ...] = PROMPTS, reply_wait_s: float = 12.0
) -> dict[str, Any]:
    """Connect Chromium's talk page (silent fake mic), have the idol speak, read the audio receiver's stats."""
    from playwright.async_api import async_playwright

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "silence.wav"
        _silent_wav(wav)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM, args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"]
            )
            try:
                page = await browser.new_page()
                await page.add_init_script(TRACK_PEERS_JS)
                await page.goto(url + "/")
                async with page.expect_response("**/api/offer") as offer:
                    await page.click("#connect")
                session = (await (await offer.value).json())["session_id"]
                try:
                    await page.wait_for_function(
                        "window.__peers.length && window.__peers[0].connectionState === 'connected'",
                        timeout=30_000,
                    )
                except Exception:
                    error = await page.text_content("#error")
                    raise RuntimeError(f"the talk page did not connect: {error!r}") from None
                for text in prompts:
                    await page.evaluate(SAY_JS, [session, text])
                    await asyncio.sleep(reply_wait_s)
                stats = await page.evaluate(STATS_JS)
            finally:
                await browser.close()
    if not stats:
        raise RuntimeError("Chromium reported no inbound audio")
    s = stats[0]
    emitted = float(s.get("jitterBufferEmittedCount") or 0)
    if emitted <= 0:
        raise RuntimeError("Chromium played no audio from the engine")
    return {
        "jitter_buffer_delay_ms": round(1000.0 * float(s["jitterBufferDelay"]) / emitted, 1),
        "jitter_buffer_target_delay_ms": round(
            1000.0 * float(s.get("jitterBufferTargetDelay", 0.0)) / emitted, 1
        ),
        "jitter_buffer_minimum_delay_ms": round(
            1000.0 * float(s.get("jitterBufferMinimumDelay", 0.0)) / emitted, 1
        ),
        "samples_emitted": int(emitted),
        "packets_received": int(s.get("packetsReceived", 0)),
        "chromium": CHROMIUM,
    }
