"""Memory and persona operations shared by the CLI and the HTTP API (blocking: call from a
thread in async code). Every function returns JSON-ready data and raises ``ValueError`` (bad
input) or :class:`~persona.bank.MemoryNotFound` (unknown id)."""

from __future__ import annotations

from typing import Any, Protocol

from persona.bank import MemoryBank
from persona.card import PersonaCard, load_card, parse_card
from persona.retrieval import embed_text
from persona.store import KINDS, normalize_username

EXPORT_FORMAT = "idolcast-persona"
EXPORT_VERSION = 1


class LivePersona(Protocol):
    """What a running engine exposes (``PersonaPromptProvider`` is one)."""

    bank: MemoryBank
    card: PersonaCard

    async def switch_persona(self, card: PersonaCard | str) -> None: ...

    async def forget_viewer(self, username: str) -> dict[str, object]: ...


def list_memories(
    bank: MemoryBank,
    *,
    subject: str | None = None,
    kind: str | None = None,
    include_superseded: bool = False,
    limit: int = 100,
    offset: int = 0,
) -> list[dict[str, Any]]:
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not 1 <= limit <= 10_000 or offset < 0:
        raise ValueError("limit must be 1..10000 and offset ≥ 0")
    rows = bank.store.list_memories(
        bank.persona,
        subject=normalize_username(subject) if subject else None,
        kind=kind,
        include_superseded=include_superseded,
        limit=limit,
        offset=offset,
    )
    return [m.to_json() for m in rows]


def search_memories(
    bank: MemoryBank, query: str, k: int = 5, speaker: str | None = None
) -> list[dict[str, Any]]:
    if not query.strip():
        raise ValueError("query must not be empty")
    if not 1 <= k <= 100:
        raise ValueError("k must be 1..100")
    return [
        {**s.memory.to_json(), "score": round(s.score, 4), "similarity": round(s.similarity, 4)}
        for s in bank.search(query, k=k, speaker=speaker)
    ]


def add_memory(
    bank: MemoryBank, text: str, kind: str = "viewer_fact", subject: str = "", importance: float = 0.5
) -> dict[str, Any]:
    return bank.add(text, kind=kind, subject=subject, importance=importance).to_json()


def edit_memory(
    bank: MemoryBank, memory_id: int, text: str | None = None, importance: float | None = None
) -> dict[str, Any]:
    if text is None and importance is None:
        raise ValueError("give text and/or importance")
    return bank.edit(memory_id, text=text, importance=importance).to_json()


def forget_memory(bank: MemoryBank, memory_id: int) -> dict[str, Any]:
    return {"deleted": bank.forget(memory_id)}


def forget_viewer(bank: MemoryBank, username: str) -> dict[str, Any]:
    """Right to be forgotten, across every persona; the report says what was deleted."""
    if not normalize_username(username):
        raise ValueError("username must not be empty")
    report = bank.forget_viewer(username)
    report["remaining_rows"] = viewer_rows(bank, username)
    return report


def viewer_rows(bank: MemoryBank, username: str) -> int:
    """Rows still naming the viewer as subject or profile (0 after forgetting: the verification)."""
    user = normalize_username(username)
    rows = bank.store._read(
        "SELECT (SELECT COUNT(*) FROM memories WHERE subject = ?) + "
        "(SELECT COUNT(*) FROM viewer_profiles WHERE username = ?)",
        (user, user),
    )
    return int(rows[0][0])


def export_persona(bank: MemoryBank, card: PersonaCard) -> dict[str, Any]:
    """The card and every memory (history included, embeddings left out), profile and episode."""
    store, pid = bank.store, card.id
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": bank.clock(),  # calendar time, deliberately: the bank's wall clock
        "card": card.model_dump(mode="json"),
        "memories": [m.to_json() for m in store.list_memories(pid, include_superseded=True, limit=10**9)],
        "profiles": [p.to_json() for p in store.profiles(pid)],
        "episodes": [e.to_json() for e in store.episodes(pid, limit=10**9)],
    }


def import_persona(bank: MemoryBank, data: Any, replace: bool = False) -> dict[str, Any]:
    """Load an export: the card is validated, memories re-embedded (the text is the truth),
    contradiction history re-linked. ``replace`` first deletes what the persona had."""
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ValueError(f"not an {EXPORT_FORMAT} export (missing 'format': '{EXPORT_FORMAT}')")
    if data.get("version") != EXPORT_VERSION:
        raise ValueError(f"unsupported export version {data.get('version')!r} (expected {EXPORT_VERSION})")
    card = parse_card(data.get("card"), "import: card")
    memories = data.get("memories") or []
    for i, m in enumerate(memories):
        if not isinstance(m, dict) or not str(m.get("text", "")).strip() or m.get("kind") not in KINDS:
            raise ValueError(
                f"import: memories[{i}]: needs a non-empty 'text' and a 'kind' in {', '.join(KINDS)}"
            )
    try:
        return _import(bank, card, data, memories, replace)
    except (KeyError, TypeError) as e:
        raise ValueError(f"import: malformed record: missing or wrong field {e}") from None


def _import(
    bank: MemoryBank, card: PersonaCard, data: dict[str, Any], memories: list[Any], replace: bool
) -> dict[str, Any]:
    vecs: Any = (
        bank.embedder.embed(
            [
                embed_text(m["kind"], normalize_username(str(m.get("subject") or "")), str(m["text"]))
                for m in memories
            ]
        )
        if memories
        else []
    )
    store, pid = bank.store, card.id
    with bank.write() as conn:
        if replace:
            for table in ("memories", "viewer_profiles", "episodes"):
                conn.execute(f"DELETE FROM {table} WHERE persona = ?", (pid,))
        id_map: dict[int, int] = {}
        for m, vec in zip(memories, vecs, strict=True):
            now = float(m.get("updated_at") or bank.clock())
            new = store.insert_memory(
                conn,
                persona=pid,
                kind=m["kind"],
                subject=str(m.get("subject") or ""),
                text=str(m["text"]),
                embedding=vec,
                importance=float(m.get("importance", 0.5)),
                slot=m.get("slot"),
                source="import",
                now=now,
                created_at=m.get("created_at"),
            )
            conn.execute("UPDATE memories SET mentions = ? WHERE id = ?", (int(m.get("mentions") or 1), new))
            id_map[int(m.get("id", -1))] = new
        for m in memories:
            old_sup = m.get("superseded_by")
            if old_sup is not None and int(old_sup) in id_map:
                conn.execute(
                    "UPDATE memories SET superseded_by = ? WHERE id = ?",
                    (id_map[int(old_sup)], id_map[int(m.get("id", -1))]),
                )
        for p in data.get("profiles") or []:
            conn.execute(
                "INSERT OR REPLACE INTO viewer_profiles (persona, username, display_name, first_seen, last_seen, "
                "turns) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    pid,
                    normalize_username(p["username"]),
                    p.get("display_name"),
                    p["first_seen"],
                    p["last_seen"],
                    int(p.get("turns", 0)),
                ),
            )
        for e in data.get("episodes") or []:
            store.add_episode(
                conn,
                pid,
                e["started_at"],
                e["ended_at"],
                int(e["turns"]),
                e["summary"],
                e.get("speakers", ""),
            )
    if pid == bank.persona:
        bank.index.rebuild(store, pid)
    return {
        "persona": pid,
        "memories": len(memories),
        "profiles": len(data.get("profiles") or []),
        "episodes": len(data.get("episodes") or []),
    }


def show_persona(ref: str) -> dict[str, Any]:
    card = load_card(ref)
    return {"card": card.model_dump(mode="json"), "system_prompt": card.system_prompt()}


async def switch_persona(live: LivePersona, ref: str) -> dict[str, Any]:
    card = load_card(ref)
    await live.switch_persona(card)
    return {"persona": card.id, "name": card.name}
