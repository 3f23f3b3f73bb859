from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import PersonaConfig
from persona.card import CardError, load_card

pytestmark = pytest.mark.unit


def test_default_card_is_aiko_and_matches_engine_fallback() -> None:
    card = load_card("builtin:default")
    assert card.name == "Aiko"
    assert card.id == "aiko"
    assert "Aiko" in PersonaConfig().system_prompt
    assert PersonaConfig().card == "builtin:default"
    prompt = card.system_prompt()
    assert prompt.startswith("You are Aiko")
    assert card.voice.tts_voice and card.avatar.character
    assert prompt == load_card("builtin:default").system_prompt()  # deterministic: KV-cache stable


def test_yaml_error_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: mia\nname: Mia\nself_description: a singer\nvoice:\n  speed: 9\n", encoding="utf-8")
    with pytest.raises(CardError) as e:
        load_card(bad)
    msg = str(e.value)
    assert str(bad) in msg and "voice.speed" in msg and "9" in msg


def test_missing_and_unknown_fields(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: mia\nself_description: a singer\nfavourite_colour: red\n", encoding="utf-8")
    with pytest.raises(CardError) as e:
        load_card(bad)
    msg = str(e.value)
    assert "field 'name'" in msg and "Field required" in msg
    assert "field 'favourite_colour'" in msg


def test_bad_regex_and_bad_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text(
        "id: mia\nname: Mia\nself_description: x y z\ntaboos:\n  - rule: no\n    patterns: ['(']\n"
    )
    with pytest.raises(CardError, match=r"taboos\.0\.patterns"):
        load_card(bad)
    broken = tmp_path / "d.yaml"
    broken.write_text("id: [unclosed\n")
    with pytest.raises(CardError, match="not valid YAML"):
        load_card(broken)
    with pytest.raises(CardError, match="not found"):
        load_card(tmp_path / "nope.yaml")


def test_toml_card(tmp_path: Path) -> None:
    f = tmp_path / "mia.toml"
    f.write_text(
        'id = "mia"\nname = "Mia"\nself_description = "a calm virtual DJ"\ntaboos = ["talk about politics"]\n'
        '[voice]\ntts_voice = "bundled:joe"\nspeed = 0.9\n',
        encoding="utf-8",
    )
    card = load_card(f)
    assert card.name == "Mia" and card.taboos[0].rule == "talk about politics" and card.voice.speed == 0.9
