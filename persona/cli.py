"""``idolcast memory …`` and ``idolcast persona …`` (wired in by ``engine.cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from persona import api
from persona.bank import MemoryBank, MemoryNotFound
from persona.card import CardError, load_card


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="TOML config file (default: ./idolcast.toml if present)")
    p.add_argument("--db", help="memory database (default: persona.memory_db)")
    p.add_argument("--persona", help="persona card (default: persona.card); its id scopes the memories")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    mem = sub.add_parser("memory", help="the persona's memory bank: list, search, edit, forget, export")
    msub = mem.add_subparsers(dest="memory_command", required=True)

    p = msub.add_parser("list", help="list memories (newest first)")
    p.add_argument("--subject", help="only memories about this viewer/subject")
    p.add_argument("--kind", choices=["viewer_fact", "self_fact", "stream_event"])
    p.add_argument("--all", action="store_true", help="include superseded (history) memories")
    p.add_argument("--limit", type=int, default=50)
    p = msub.add_parser("search", help="retrieve memories as a turn would")
    p.add_argument("query")
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--speaker", help="the viewer asking (their memories are boosted)")
    p = msub.add_parser("add", help="add a memory")
    p.add_argument("text")
    p.add_argument("--kind", default="viewer_fact", choices=["viewer_fact", "self_fact", "stream_event"])
    p.add_argument("--subject", default="")
    p.add_argument("--importance", type=float, default=0.5)
    p = msub.add_parser("edit", help="change a memory's text or importance")
    p.add_argument("id", type=int)
    p.add_argument("--text")
    p.add_argument("--importance", type=float)
    p = msub.add_parser("forget", help="delete one memory (and its superseded history)")
    p.add_argument("id", type=int)
    p = msub.add_parser("forget-viewer", help="delete everything about a viewer (right to be forgotten)")
    p.add_argument("username")
    p = msub.add_parser("export", help="export the persona card and its memories as JSON")
    p.add_argument("-o", "--output", help="file (default: stdout)")
    p = msub.add_parser("import", help="import a JSON export")
    p.add_argument("file")
    p.add_argument("--replace", action="store_true", help="delete the persona's memories first")
    for name, parser in msub.choices.items():
        _common(parser)
        parser.set_defaults(func=_memory_command, memory_command=name)

    per = sub.add_parser("persona", help="persona cards: show, validate")
    psub = per.add_subparsers(dest="persona_command", required=True)
    p = psub.add_parser("show", help="print a card and the system prompt it makes")
    p.add_argument("card", nargs="?", help="card file or builtin:NAME (default: persona.card)")
    p.add_argument("--config", "-c")
    p.set_defaults(func=_persona_show)
    p = psub.add_parser("validate", help="check card files; errors name the file, field and problem")
    p.add_argument("cards", nargs="+")
    p.add_argument("--config", "-c")
    p.set_defaults(func=_persona_validate)


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _memory_command(args: argparse.Namespace, settings: Any) -> int:
    from persona.embed import LazyEmbedder

    try:
        card = load_card(args.persona or settings.persona.card)
    except CardError as e:
        print(f"idolcast: {e}", file=sys.stderr)
        return 2
    bank = MemoryBank.open(args.db or settings.persona.memory_db, LazyEmbedder(), card.id)
    try:
        cmd = args.memory_command
        if cmd == "list":
            _print(
                api.list_memories(
                    bank, subject=args.subject, kind=args.kind, include_superseded=args.all, limit=args.limit
                )
            )
        elif cmd == "search":
            _print(api.search_memories(bank, args.query, args.k, args.speaker))
        elif cmd == "add":
            _print(api.add_memory(bank, args.text, args.kind, args.subject, args.importance))
        elif cmd == "edit":
            _print(api.edit_memory(bank, args.id, args.text, args.importance))
        elif cmd == "forget":
            _print(api.forget_memory(bank, args.id))
        elif cmd == "forget-viewer":
            _print(api.forget_viewer(bank, args.username))
        elif cmd == "export":
            text = json.dumps(api.export_persona(bank, card), indent=2, ensure_ascii=False)
            if args.output:
                Path(args.output).write_text(text, encoding="utf-8")
            else:
                print(text)
        elif cmd == "import":
            try:
                data = json.loads(Path(args.file).read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ValueError(f"{args.file}: cannot read JSON: {e}") from None
            _print(api.import_persona(bank, data, replace=args.replace))
        return 0
    except (ValueError, MemoryNotFound, CardError) as e:
        print(f"idolcast: {e}", file=sys.stderr)
        return 2
    finally:
        bank.close()


def _persona_show(args: argparse.Namespace, settings: Any) -> int:
    try:
        _print(api.show_persona(args.card or settings.persona.card))
    except CardError as e:
        print(f"idolcast: {e}", file=sys.stderr)
        return 2
    return 0


def _persona_validate(args: argparse.Namespace, settings: Any) -> int:
    bad = 0
    for ref in args.cards:
        try:
            card = load_card(ref)
            print(f"{ref}: ok ({card.name}, id {card.id})")
        except CardError as e:
            print(str(e), file=sys.stderr)
            bad += 1
    return 1 if bad else 0
