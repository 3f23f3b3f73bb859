"""The ``idolcast`` command: serve, bench, doctor, config show (and the subcommands plugged in by packages)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from engine.config import Settings, dump_settings, load_settings
from engine.errors import ConfigError
from engine.native import preload_native_modules

Command = Callable[[argparse.Namespace, Settings], int]


def _add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="TOML config file (default: ./idolcast.toml if present)")


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from engine.app import serve

    if args.host:
        settings.server.host = args.host
    if args.port is not None:
        settings.server.port = args.port
    return serve(settings)


def cmd_config_show(args: argparse.Namespace, settings: Settings) -> int:
    print(dump_settings(settings))
    return 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from engine.doctor import run_doctor

    return run_doctor(settings, load=not args.no_load)


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from engine.bench.cli import run_bench

    return run_bench(args, settings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idolcast", description="Real-time AI virtual-idol engine")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="debug logging of idolcast's own modules; -vv also of the libraries (aiortc logs every packet)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="start the engine (http://127.0.0.1:8080 by default)")
    _add_config_arg(p)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "doctor", help="which models, backends and devices will be used, and whether each loads"
    )
    _add_config_arg(p)
    p.add_argument("--no-load", action="store_true", help="only resolve, do not load the models")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("config", help="configuration")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the effective configuration")
    _add_config_arg(show)
    show.set_defaults(func=cmd_config_show)

    p = sub.add_parser("bench", help="measure the engine as a viewer experiences it")
    _add_config_arg(p)
    from engine.bench.cli import add_bench_args

    add_bench_args(p)
    p.set_defaults(func=cmd_bench)

    for register in _plugins():
        register(sub)
    return parser


def _plugins() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    """Subcommands contributed by other packages (persona memory, TensorRT plans)."""
    out: list[Callable[[argparse._SubParsersAction], None]] = []  # type: ignore[type-arg]
    try:
        from persona.cli import register as persona_register

        out.append(persona_register)
    except ImportError:
        pass
    try:
        from engine.avatar.cli import register as avatar_register

        out.append(avatar_register)
    except ImportError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    preload_native_modules()  # before any plugin imports usearch: the other order crashes onnxruntime
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose >= 2 else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    if args.verbose:
        for name in ("engine", "persona"):
            logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        settings = load_settings(getattr(args, "config", None))
    except ConfigError as e:
        print(f"idolcast: {e}", file=sys.stderr)
        return 2
    result: int = args.func(args, settings)
    return result


if __name__ == "__main__":
    sys.exit(main())
