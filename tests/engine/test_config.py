from pathlib import Path

import pytest

from engine.config import dump_settings, load_settings
from engine.errors import ConfigError

pytestmark = pytest.mark.unit


def test_defaults_without_file(tmp_path: Path) -> None:
    s = load_settings(environ={})
    assert s.server.port == 8080
    assert s.llm.backend == "auto"  # llama.cpp for the bundled GGUF on a CPU, transformers on a GPU


def test_file_and_env_override(tmp_path: Path) -> None:
    f = tmp_path / "idolcast.toml"
    f.write_text('[llm]\nbackend = "openai"\nmodel = "qwen"\n[vad]\nend_of_turn_silence_ms = 600\n')
    s = load_settings(f, environ={"IDOLCAST_VAD__END_OF_TURN_SILENCE_MS": "300"})
    assert s.llm.backend == "openai" and s.llm.model == "qwen"
    assert s.vad.end_of_turn_silence_ms == 300


def test_bad_value_names_file_key_and_expectation(tmp_path: Path) -> None:
    f = tmp_path / "idolcast.toml"
    f.write_text('[llm]\nbackend = "gpt-magic"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(f, environ={})
    msg = str(e.value)
    assert str(f) in msg and "llm.backend" in msg and "transformers" in msg


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(environ={"IDOLCAST_SERVER__PORT": "eighty"})
    assert "IDOLCAST_SERVER__PORT" in str(e.value) and "server.port" in str(e.value)


def test_unknown_section_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[nonsense]\na = 1\n")
    with pytest.raises(ConfigError, match="nonsense"):
        load_settings(f, environ={})


def test_invalid_toml_and_missing_explicit_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[llm\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(f, environ={})
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml", environ={})


def test_dump_masks_secrets() -> None:
    s = load_settings(environ={"IDOLCAST_LLM__API_KEY": "sk-secret"})
    text = dump_settings(s)
    assert "sk-secret" not in text and "[llm]" in text


def test_env_lists_are_json_and_a_bad_one_names_the_variable() -> None:
    s = load_settings(
        environ={"IDOLCAST_SERVER__ICE_SERVERS": '["stun:a:3478"]', "IDOLCAST_SURFACES__RTMP__FPS": "25"}
    )
    assert s.server.ice_servers == ["stun:a:3478"] and s.surfaces.rtmp.fps == 25
    with pytest.raises(ConfigError, match="IDOLCAST_SERVER__ICE_SERVERS"):
        load_settings(environ={"IDOLCAST_SERVER__ICE_SERVERS": "stun:a:3478"})
    with pytest.raises(ConfigError, match="IDOLCAST_NOPE__A"):
        load_settings(environ={"IDOLCAST_NOPE__A": "1"})
