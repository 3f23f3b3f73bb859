"""The import layering of engine/ and persona/, read from the source (no imports run).

Every ``import`` and ``from … import`` counts: module level, inside functions, relative ones, and
those under ``if TYPE_CHECKING:`` (a type-only import still couples the two modules: mypy follows
it and a reader must know the other side). Two rules:

1. No import cycle between modules (a strongly connected component larger than one module).
2. A module imports only its own package or a package of a *lower* layer (LAYERS, bottom to top;
   packages of one layer do not import each other). docs/architecture.md mirrors this table.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Bottom → top. A "unit" is a dotted module prefix; a module belongs to the longest unit it starts
# with. The single place the layers are written down (docs/architecture.md shows it as a table).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "engine.clock",
            "engine.events",
            "engine.tasks",
            "engine.progress",
            "engine.native",
            "engine.errors",
            "engine",
        ),
    ),
    ("stages", ("engine.vad", "engine.llm", "engine.tts", "engine.transport")),
    ("stages that use stages", ("engine.asr", "engine.text", "engine.lipsync", "persona")),
    ("avatar", ("engine.avatar",)),
    ("config", ("engine.config",)),
    ("models", ("engine.models",)),
    ("session", ("engine.session",)),
    ("server", ("engine.server",)),
    ("surfaces", ("engine.surfaces",)),
    ("application", ("engine.app", "engine.doctor", "engine.bench")),
    ("command line", ("engine.cli",)),
]

# persona sits beside the stages: it implements engine.llm's PromptProvider seam and uses only these.
PERSONA_MAY_IMPORT = ("engine.llm", "engine.events", "engine.tasks", "engine.progress", "engine.clock")

# Known violations still being removed, as (importing module, imported module), each with a comment
# naming the stream that owns the fix. It only shrinks (test_allow_list_only_shrinks); nothing may be
# added. Empty since the server <-> surfaces loop (Stream B) and the stage climbs (Stream C) went.
ALLOWED: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for top in ("engine", "persona"):
        for path in sorted((ROOT / top).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` (a module or module.attribute) refers to, if any."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import sub` may name a submodule: prefer it when it exists
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                dst = _resolve(t, modules)
                if dst is not None and dst != mod:
                    graph[mod].add(dst)
    return graph


def _unit(mod: str) -> tuple[int, str]:
    best: tuple[int, str] | None = None
    for level, (_, units) in enumerate(LAYERS):
        for unit in units:
            if (mod == unit or mod.startswith(unit + ".")) and (best is None or len(unit) > len(best[1])):
                best = (level, unit)
    assert best is not None, f"{mod} is in no layer: add it to LAYERS"
    return best


def layer_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    bad = set()
    for src, dsts in graph.items():
        src_level, src_unit = _unit(src)
        for dst in dsts:
            dst_level, dst_unit = _unit(dst)
            if dst_unit == src_unit or dst_unit in ("engine",):
                continue
            if dst_level >= src_level:
                bad.add((src, dst))
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_every_module_has_a_layer() -> None:
    for mod in import_graph():
        _unit(mod)


def test_no_import_cycles() -> None:
    graph = import_graph()
    # an allowed (known) edge does not count towards a cycle until it is removed
    pruned = {src: {d for d in dsts if (src, d) not in ALLOWED} for src, dsts in graph.items()}
    found = cycles(pruned)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_climbs_a_layer() -> None:
    bad = layer_violations(import_graph()) - ALLOWED
    assert not bad, "imports running up the layers (see LAYERS):\n" + "\n".join(
        f"{src} -> {dst}" for src, dst in sorted(bad)
    )


def test_persona_uses_only_the_llm_seam() -> None:
    graph = import_graph()
    bad = sorted(
        (src, dst)
        for src, dsts in graph.items()
        if src.startswith("persona")
        for dst in dsts
        if dst.startswith("engine") and _unit(dst)[1] not in PERSONA_MAY_IMPORT and dst != "engine"
    )
    assert not bad, "persona imports beyond PERSONA_MAY_IMPORT:\n" + "\n".join(f"{s} -> {d}" for s, d in bad)


def test_allow_list_only_shrinks() -> None:
    """An allowed entry that no longer occurs must be deleted from ALLOWED."""
    graph = import_graph()
    edges = {(s, d) for s, dsts in graph.items() for d in dsts}
    stale = ALLOWED - edges
    assert not stale, "fixed, remove from ALLOWED: " + ", ".join(f"{s} -> {d}" for s, d in sorted(stale))
