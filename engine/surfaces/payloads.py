"""JSON payloads that come in from outside (MQTT, the chat endpoint), validated with pydantic.

The topic schema they travel on is in :mod:`engine.surfaces.mqtt_bus` and docs/streamer.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ChatRole = Literal["host", "member", "chat"]
PRIORITY: dict[str, int] = {"host": 0, "member": 1, "chat": 2}


class ChatIn(BaseModel):
    """One chat message: ``{"user": "mika", "text": "hi!", "role": "member"}``."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    user: str = Field(min_length=1, max_length=64, description="the viewer's display name")
    text: str = Field(min_length=1, max_length=2000)
    role: ChatRole = Field("chat", description="host > member > chat")
    id: str | None = Field(None, max_length=128, description="platform message id (de-duplication)")
    platform: str = Field("mqtt", max_length=32)

    @field_validator("user", "text")
    @classmethod
    def _printable(cls, v: str) -> str:
        cleaned = "".join(ch for ch in v if ch.isprintable())
        if not cleaned.strip():
            raise ValueError("no printable characters")
        return cleaned


class ControlIn(BaseModel):
    """A host command over MQTT: ``{"action": "expression", "name": "happy"}``."""

    model_config = ConfigDict(extra="ignore")

    action: Literal["interrupt", "expression", "gesture", "say"]
    name: str | None = Field(None, max_length=32)
    text: str | None = Field(None, max_length=2000)
