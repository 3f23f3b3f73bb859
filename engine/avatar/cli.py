"""``idolcast build-trt``: export the character to ONNX and build TensorRT plans for this GPU."""

from __future__ import annotations

import argparse
import sys
from typing import Protocol

from engine.avatar.config import AvatarConfig
from engine.avatar.delivery import resolve_profile


class _HasAvatar(Protocol):
    """What the command reads of the settings (engine.config.Settings has it)."""

    avatar: AvatarConfig


def cmd_build_trt(args: argparse.Namespace, settings: _HasAvatar) -> int:
    from engine.avatar.backends.base import BackendUnavailable
    from engine.avatar.backends.tensorrt import build_trt_plans

    profiles = (
        args.profiles.split(",")
        if args.profiles
        else [resolve_profile(settings.avatar.profile, settings.avatar.character)]
    )
    batches = [int(b) for b in args.batches.split(",")]
    print(f"building TensorRT plans for {profiles} × batch {batches} ({args.precision}) into {args.out}/ ...")
    try:
        entries = build_trt_plans(profiles, batches, args.precision, args.out, settings.avatar.character)
    except BackendUnavailable as e:
        print(f"idolcast build-trt: {e}", file=sys.stderr)
        return 1
    for entry in entries:
        print(
            f"  {entry['file']}: {entry['width']}x{entry['height']} batch {entry['batch']} ({entry['build_s']} s)"
        )
    print("done: the engine loads a matching plan at start when avatar.backend is 'auto' or 'tensorrt'")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("build-trt", help="export ONNX and build TensorRT plans for the avatar (NVIDIA GPU)")
    p.add_argument("--config", "-c", help="TOML config file")
    p.add_argument("--profiles", help="comma-separated output profiles (default: avatar.profile)")
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--precision", choices=("fp16", "fp32"), default="fp16")
    p.add_argument("--out", default="trt_plans", help="plan folder (default trt_plans/)")
    p.set_defaults(func=cmd_build_trt)
