"""One stream's video cost (render, convert, encode) and the 'auto' output profile chosen from it."""

from __future__ import annotations

import pytest

from engine.avatar import delivery
from engine.avatar.backends import select_backend
from engine.avatar.delivery import DeliveryCost, choose_auto_profile, measure_delivery, resolve_profile


def _cost(ms_per_frame: float) -> DeliveryCost:
    return DeliveryCost(
        render_ms=ms_per_frame / 2, convert_ms=0.0, encode_ms=ms_per_frame / 2, wall_ms=0.0, frames=1
    )


def test_measured_delivery_counts_every_stage() -> None:
    cost = measure_delivery(select_backend("torch", "360p"), frames=8, warmup=2)
    assert cost.frames == 8
    assert cost.render_ms > 0 and cost.convert_ms > 0 and cost.encode_ms > 0
    assert cost.cpu_ms_per_s == pytest.approx(30 * (cost.render_ms + cost.convert_ms + cost.encode_ms))


def test_auto_profile_takes_720p_without_measuring_on_a_gpu_or_many_cores() -> None:
    def never() -> DeliveryCost:
        raise AssertionError("measured")

    assert choose_auto_profile(2, True, never)[0] == "720p"
    assert choose_auto_profile(16, False, never)[0] == "720p"
    assert choose_auto_profile(1, False, never)[0] == "360p"


def test_auto_profile_on_a_small_cpu_machine_follows_the_measured_cost() -> None:
    # 2 cores: 720p while one stream costs at most a quarter of them (500 CPU ms a second)
    profile, why = choose_auto_profile(2, False, lambda: _cost(12.0))  # 360 ms/s: this machine's figure
    assert profile == "720p" and "360 CPU ms" in why
    profile, why = choose_auto_profile(2, False, lambda: _cost(25.0))  # 750 ms/s: a slower machine
    assert profile == "360p" and "750 CPU ms" in why and "500" in why
    assert choose_auto_profile(4, False, lambda: _cost(25.0))[0] == "720p"  # 750 of 1,000


def test_resolve_profile_measures_once_and_keeps_named_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_choose(cores: int, gpu: bool, measure: object) -> tuple[str, str]:
        calls.append("chose")
        return "360p", "test"

    monkeypatch.setattr(delivery, "_auto", {})
    monkeypatch.setattr(delivery, "choose_auto_profile", fake_choose)
    assert resolve_profile("1080p") == "1080p"
    assert resolve_profile("auto", "builtin:default") == "360p"
    assert resolve_profile("auto", "builtin:default") == "360p"
    assert calls == ["chose"]
