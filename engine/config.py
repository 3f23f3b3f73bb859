"""One settings model for the whole engine.

Loaded from a TOML file (``idolcast.toml`` in the working directory, or
``--config PATH`` / ``IDOLCAST_CONFIG``), then overridden by environment
variables ``IDOLCAST_<SECTION>__<KEY>`` (for example ``IDOLCAST_LLM__BACKEND=openai``; lists and
tables as JSON), read by pydantic-settings' environment source.
A bad value is refused at start with the file, the key and what was expected.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from engine.asr.config import ASRConfig
from engine.avatar.config import AvatarConfig
from engine.errors import ConfigError
from engine.llm.config import LLMConfig
from engine.tts.config import TTSConfig
from engine.vad.config import VADConfig

ENV_PREFIX = "IDOLCAST_"
DEFAULT_CONFIG_FILE = "idolcast.toml"


class ServerConfig(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(256 * 1024, ge=1024, description="largest accepted request body")
    max_sessions: int = Field(8, ge=1, le=1024)
    ice_servers: list[str] = Field(
        default_factory=list,
        description="STUN/TURN URLs the engine uses and gives to the pages (GET /api/ice-servers)",
    )
    ice_username: str = Field("", description="username for the turn:/turns: URLs in ice_servers")
    ice_credential: str = Field("", description="credential (password) for the turn:/turns: URLs")
    ice_port_min: int = Field(
        0, ge=0, le=65535, description="lowest local UDP port for WebRTC media (0: any port, the OS picks)"
    )
    ice_port_max: int = Field(
        0, ge=0, le=65535, description="highest local UDP port for WebRTC media (0: any port)"
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description="on SIGTERM: how long running sessions may finish before they are closed",
    )
    mic_jitter_frames: int = Field(
        1,
        ge=1,
        le=15,
        description="20 ms frames the host's mic waits in the receive jitter buffer (aiortc's default: 4)",
    )
    gil_switch_ms: float = Field(
        5.0,
        ge=0.1,
        le=100.0,
        description="how long a Python thread may hold the GIL while others wait (Python's own: 5 ms); "
        "1 ms kept the event loop on time on 2 cores but made 8 sessions on the H200 host 1.8x slower",
    )
    model_nice: int = Field(
        5,
        ge=0,
        le=19,
        description="how much nicer the models' threads (ASR, LLM, Piper and their runtimes' pools) run than "
        "the event loop, the render thread and the encoders, so frames keep their deadlines on a full machine "
        "(0 = the same)",
    )
    cpus: float = Field(
        0.0,
        ge=0.0,
        le=4096.0,
        description="the cores this engine sizes its thread pools and its capacity by (0 = those it may run "
        "on: its affinity, capped by a container's CPU quota); set each engine's share where several share a "
        "box without container limits",
    )
    stall_report_ms: float = Field(
        1000.0,
        ge=0.0,
        description="a session's next video frame this long overdue (rendering, or held by the encoder and "
        "sender) is a stall: one WARNING with every busy thread's stack, at most every 30 s (0 = no watch)",
    )
    video_encoder_threads: int = Field(
        1,
        ge=0,
        le=16,
        description="the most threads one session's video encoder uses (0 = aiortc's choice by frame size, "
        "2 at 720p); a second VP8 thread saved 0.2-0.3 ms a 720p frame and cost 50 % more CPU",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    host_token: str = Field(
        "",
        description="the host credential; empty: generated on first start into secrets_dir/host_token (0600)",
    )
    secrets_dir: str = Field(
        "var/secrets", description="folder of the generated host token and viewer tokens"
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names answered besides the loopback ones and `host` (anything else: 421)",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="origins (scheme://host:port) besides the server's own that may send requests (CORS)",
    )
    console_bootstrap: bool = Field(
        True,
        description="a browser on this machine opening the console gets the host cookie (off: paste the token)",
    )
    connect_timeout_s: float = Field(
        20.0, gt=0, le=600, description="a session whose peer has not connected by then is closed"
    )


class CapacityConfig(BaseModel):
    admission: bool = Field(
        True,
        description="refuse a session the machine cannot serve well (HTTP 503 with Retry-After); "
        "false: only server.max_sessions caps the sessions",
    )
    target_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="share of each resource the admitted sessions may use"
    )
    cores: float | None = Field(
        None,
        gt=0.0,
        description="CPU cores the engine may use (default: those this process may run on, capped by "
        "server.cpus)",
    )
    idle_cpu_cores: float | None = Field(
        None,
        ge=0.0,
        description="pin the idle engine's CPU, in cores (default: measured while no session is open)",
    )
    session_cpu_cores: float | None = Field(
        None,
        gt=0.0,
        description="pin one session's CPU cost, in cores (default: measured in the running engine)",
    )
    min_samples: int = Field(
        20, ge=1, description="loaded samples after which the measured cost replaces the prior entirely"
    )
    history_s: float = Field(120.0, ge=5.0, description="seconds of samples the measured cost is taken over")
    sample_s: float = Field(1.0, gt=0.0, le=10.0, description="seconds between CPU samples")
    floor_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="the measured cost is never taken below this share of the prior (quiet sessions "
        "measured during a lull must not let in more than the machine holds once they all talk)",
    )
    count_other_processes: bool = Field(
        False,
        description="take what other processes keep busy on the machine (/proc/stat) off the cores the "
        "sessions may use (for a shared machine; always measured and reported; ignored when cores is set)",
    )
    min_sessions: int = Field(
        1,
        ge=0,
        description="sessions always admitted whatever the estimate (under server.max_sessions): an engine "
        "that refuses its first host serves nobody",
    )
    retry_after_s: int = Field(30, ge=1, le=3600, description="Retry-After of a refused session, seconds")
    late_frames_per_s: float = Field(
        0.5,
        ge=0.0,
        description="frames the open sessions may drop as late, per second over the last pace_window_s, "
        "before no further session is admitted (the service itself measured, whatever the estimate says)",
    )
    pace_window_s: float = Field(
        10.0, ge=2.0, le=120.0, description="seconds the late frames are counted over"
    )


class PersonaConfig(BaseModel):
    card: str = Field("builtin:default", description="'builtin:default' or a persona card file")
    memory_db: str = Field("var/memory.sqlite3", description="SQLite file of the memory bank")
    cards_dir: str = Field(
        "var/cards", description="folder of the cards the HTTP API may switch to by name (never a path)"
    )
    memory_backend: Literal["sqlite", "postgres"] = Field(
        "sqlite",
        description="'sqlite' (memory_db, embedded) or 'postgres' (memory_dsn, shared by every engine replica)",
    )
    memory_dsn: str = Field(
        "", description="PostgreSQL connection string (libpq DSN or URL) when memory_backend = 'postgres'"
    )
    enabled: bool = Field(True, description="use the persona memory bank (else a plain system prompt)")
    system_prompt: str = Field(
        "You are Aiko, a cheerful virtual idol co-hosting a live stream. "
        "Answer in one or two short, friendly spoken sentences.",
        description="used when the persona bank is disabled",
    )
    token_budget: int = Field(1536, ge=256, le=131072, description="largest prompt, in tokens")
    memories_per_turn: int = Field(5, ge=0, le=20, description="retrieved memories put in each prompt")
    min_similarity: float = Field(
        0.35,
        ge=0.0,
        le=1.0,
        description="a memory must be at least this similar to the turn (cosine) to be put in the prompt",
    )
    prompt_style: Literal["full", "compact"] = Field(
        "compact",
        description="'compact' persona prompt for small models (the bundled 135M one); 'full' for bigger models",
    )


# The streamer surfaces, all here: MQTT (its own [mqtt] section), chat and RTMP ([surfaces]).


class MQTTConfig(BaseModel):
    enabled: bool = True
    url: str = Field("embedded", description="'embedded' (in-process amqtt) or mqtt://host:port")
    embedded_port: int = Field(1883, ge=0, le=65535)
    embedded_host: str = Field("127.0.0.1", description="interface the embedded broker listens on")
    topic_prefix: str = Field("idol", description="topics are '{prefix}/{session}/…' (see docs/streamer.md)")
    client_id: str = Field("idolcast-engine", description="the engine's MQTT client id")
    username: str = Field("", description="external broker user (empty: anonymous)")
    password: str = Field("", description="external broker password")
    max_outgoing: int = Field(1000, ge=10, le=100_000, description="queued outgoing messages before dropping")


class ChatQueueConfig(BaseModel):
    """How chat becomes turns: prioritized (host > members > chat), rate-limited and moderated."""

    max_pending: int = Field(50, ge=1, le=10_000, description="messages waiting for a turn, all priorities")
    max_chars: int = Field(300, ge=1, le=2000, description="longer messages are refused")
    max_age_s: float = Field(60.0, gt=0, description="a chat message older than this is dropped unanswered")
    min_turn_gap_s: float = Field(1.5, ge=0, description="quiet time after a turn before a chat turn starts")
    user_cooldown_s: float = Field(20.0, ge=0, description="one accepted message per user per this")
    duplicate_window_s: float = Field(120.0, ge=0, description="the same text is refused within this")
    flood_rate_per_s: float = Field(5.0, gt=0, description="chat messages accepted per second, all users")
    flood_burst: int = Field(10, ge=1, description="burst allowance of the flood limit")
    blocklist_users: list[str] = Field(default_factory=list, description="user names never answered")
    blocklist_words: list[str] = Field(
        default_factory=list, description="messages with these words are dropped"
    )
    host_hold_s: float = Field(30.0, gt=0, description="longest a host's unfinished speech holds chat back")


class RTMPConfig(BaseModel):
    """RTMP egress (Twitch/YouTube ingest) with PyAV: libx264 + AAC in FLV."""

    url: str = Field("", description="rtmp://… ingest URL with the stream key; empty: off until started")
    allowed_hosts: list[str] = Field(
        default_factory=lambda: [
            "live.twitch.tv",
            "*.contribute.live-video.net",
            "*.rtmp.youtube.com",
            "*.facebook.com",
        ],
        description="hosts (shell patterns) a POST …/rtmp {url} may push to, besides the host of `url`",
    )
    autostart: bool = Field(False, description="push every new session to `url` as soon as it starts")
    width: int = Field(1280, ge=16, le=4096)
    height: int = Field(720, ge=16, le=4096)
    fps: int = Field(30, ge=1, le=60)
    video_bitrate_kbps: int = Field(2500, ge=100, le=50_000)
    audio_bitrate_kbps: int = Field(128, ge=32, le=512)
    keyframe_interval_s: float = Field(2.0, gt=0, le=10, description="Twitch and YouTube want 2 s")
    profile: Literal["baseline", "main", "high"] = "main"
    preset: Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium"] = "veryfast"
    background: str = Field("#101018", description="colour behind the idol (RTMP has no alpha)")
    reconnect_min_s: float = Field(0.5, gt=0, description="first reconnect delay; doubles up to the max")
    reconnect_max_s: float = Field(15.0, gt=0)


class SurfacesConfig(BaseModel):
    """The ``[surfaces]`` section; MQTT stays in ``[mqtt]``."""

    chat: ChatQueueConfig = Field(default_factory=ChatQueueConfig)  # type: ignore[arg-type]
    rtmp: RTMPConfig = Field(default_factory=RTMPConfig)  # type: ignore[arg-type]
    bearer_token: str = Field("", description="if set, WHIP/WHEP POSTs need 'Authorization: Bearer <token>'")
    max_viewers: int = Field(16, ge=0, le=1000, description="WHEP viewers per session")
    playout_delay_ms: float = Field(
        150.0,
        ge=0,
        le=5000,
        description="viewer-side delay the overlay adds to caption times (jitter buffer)",
    )


class Settings(BaseSettings):
    """Every section. Built from the TOML file and the environment by :func:`load_settings` only:
    ``Settings()`` is the defaults (it reads no environment)."""

    model_config = SettingsConfigDict(extra="forbid")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    server: ServerConfig = Field(default_factory=ServerConfig)
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    vad: VADConfig = Field(default_factory=VADConfig)
    asr: ASRConfig = Field(default_factory=ASRConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    tts: TTSConfig = Field(default_factory=TTSConfig)
    avatar: AvatarConfig = Field(default_factory=AvatarConfig)
    persona: PersonaConfig = Field(default_factory=PersonaConfig)
    mqtt: MQTTConfig = Field(default_factory=MQTTConfig)
    surfaces: SurfacesConfig = Field(default_factory=SurfacesConfig)


class _EnvironSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (not only ``os.environ``)."""

    def __init__(self, environ: dict[str, str]) -> None:
        self._environ = environ
        super().__init__(Settings, case_sensitive=False, env_prefix=ENV_PREFIX, env_nested_delimiter="__")

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # the prefix is upper-case, as it always was; the rest of the name is not case-sensitive
        return {k.lower(): v for k, v in self._environ.items() if k.startswith(ENV_PREFIX)}


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    """The ``IDOLCAST_<SECTION>__<KEY>`` variables as nested values (JSON for lists and tables)."""
    for name in environ:
        section = name[len(ENV_PREFIX) :].lower().split("__")[0]
        if name.startswith(ENV_PREFIX) and "__" in name and section not in Settings.model_fields:
            raise ConfigError(f"invalid configuration:\n  environment {name}: unknown section '{section}'")
    try:
        return _EnvironSource(environ)()
    except SettingsError as e:
        field = re.search(r'field "([^"]+)"', str(e))
        section = f"{ENV_PREFIX}{field.group(1).upper()}__" if field else ENV_PREFIX
        bad = [n for n, v in environ.items() if n.upper().startswith(section) and not _is_json(v)]
        names = ", ".join(bad) or "IDOLCAST_*"
        raise ConfigError(
            f"invalid configuration:\n  environment {names}: a list or table value must be JSON ({e})"
        ) from None


def _is_json(raw: str) -> bool:
    try:
        json.loads(raw)
    except json.JSONDecodeError:
        return False
    return True


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None
) -> Settings:
    """Load the TOML file (if any) and the environment overrides; raise ConfigError on bad values."""
    env = dict(os.environ if environ is None else environ)
    explicit = path is not None or "IDOLCAST_CONFIG" in env
    file = Path(path if path is not None else env.get("IDOLCAST_CONFIG", DEFAULT_CONFIG_FILE))
    data: dict[str, Any] = {}
    source = "defaults"
    if file.exists():
        source = str(file)
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{file}: not valid TOML: {e}") from e
    elif explicit:
        raise ConfigError(f"{file}: config file not found")
    overrides = _env_overrides(env)
    try:
        return Settings.model_validate(_merge(data, overrides))
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            env_name = ENV_PREFIX + "__".join(str(p) for p in err["loc"]).upper()
            origin = f"environment {env_name}" if env_name in env else source
            got = err.get("input")
            lines.append(f"{origin}: key '{key}': {err['msg']} (got {got!r})")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def dump_settings(settings: Settings) -> str:
    """The effective configuration as TOML-ish text (secrets masked)."""
    data = settings.model_dump(mode="json")
    if data["llm"].get("api_key"):
        data["llm"]["api_key"] = "***"
    if data["mqtt"].get("password"):
        data["mqtt"]["password"] = "***"
    if data["server"].get("host_token"):
        data["server"]["host_token"] = "***"
    surfaces = data.get("surfaces", {})
    if surfaces.get("bearer_token"):
        surfaces["bearer_token"] = "***"
    if surfaces.get("rtmp", {}).get("url"):
        surfaces["rtmp"]["url"] = "***"  # carries the stream key
    out: list[str] = []
    for section, values in data.items():
        out.append(f"[{section}]")
        for k, v in values.items():
            out.append(f"{k} = {json.dumps(v)}")
        out.append("")
    return "\n".join(out)
