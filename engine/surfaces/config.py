"""Configuration of the streamer surfaces (the ``[surfaces]`` section; MQTT stays in ``[mqtt]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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
