"""Twitch chat → idolcast: read a channel's chat over Twitch IRC and publish it on the MQTT bus.

    python examples/twitch_bridge.py --channel mychannel [--session all] [--mqtt mqtt://127.0.0.1:1883]
        [--mqtt-user chat] (the password from $IDOLCAST_MQTT_PASSWORD: the embedded broker's "chat" user in
        var/secrets/mqtt_users.json)

Anonymous read-only login (``justinfan…``) needs no token. Subscribers, VIPs and moderators are sent as
``role: "member"`` (the broadcaster too: a viewers' chat topic never carries the host role), everyone else
as ``chat``; the engine's chat queue
does the rest (priority, rate limits, de-duplication, moderation). Messages go to
``{prefix}/{session}/chat/in`` (``all`` = every open session), as documented in docs/streamer.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
from urllib.parse import urlparse

import aiomqtt

log = logging.getLogger("twitch_bridge")

IRC_HOST, IRC_PORT = "irc.chat.twitch.tv", 6667


def parse_privmsg(line: str) -> dict[str, str] | None:
    """``@tags :user!user@host PRIVMSG #chan :text`` → {"user", "text", "role", "id"}; None for other lines."""
    tags: dict[str, str] = {}
    if line.startswith("@"):
        raw, _, line = line[1:].partition(" ")
        tags = dict(kv.partition("=")[::2] for kv in raw.split(";"))
    prefix, _, rest = line.partition(" ")
    if not rest.startswith("PRIVMSG "):
        return None
    _, _, text = rest.partition(" :")
    user = tags.get("display-name") or prefix.lstrip(":").split("!", 1)[0]
    badges = tags.get("badges", "")
    if (
        "broadcaster/" in badges
        or any(b in badges for b in ("subscriber/", "vip/", "moderator/"))
        or tags.get("mod") == "1"
    ):
        role = "member"
    else:
        role = "chat"
    if not user or not text.strip():
        return None
    return {
        "user": user[:64],
        "text": text.strip()[:2000],
        "role": role,
        "id": tags.get("id", ""),
        "platform": "twitch",
    }


async def bridge(channel: str, mqtt_url: str, topic: str, user: str = "chat") -> None:
    u = urlparse(mqtt_url)
    password = os.environ.get("IDOLCAST_MQTT_PASSWORD") or None
    async with aiomqtt.Client(
        u.hostname or "127.0.0.1", u.port or 1883, username=user if password else None, password=password
    ) as mqtt:
        delay = 1.0
        while True:
            try:
                reader, writer = await asyncio.open_connection(IRC_HOST, IRC_PORT)
                nick = f"justinfan{random.randint(10000, 99999)}"
                writer.write(
                    f"CAP REQ :twitch.tv/tags\r\nNICK {nick}\r\nJOIN #{channel.lower()}\r\n".encode()
                )
                await writer.drain()
                log.info("joined #%s; publishing to %s", channel, topic)
                delay = 1.0
                while line := (await reader.readline()).decode("utf-8", "replace").rstrip("\r\n"):
                    if line.startswith("PING"):
                        writer.write(line.replace("PING", "PONG", 1).encode() + b"\r\n")
                        await writer.drain()
                    elif (msg := parse_privmsg(line)) is not None:
                        await mqtt.publish(topic, json.dumps(msg))
                writer.close()
            except OSError as e:
                log.warning("Twitch IRC: %s; reconnecting in %.0fs", e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--channel", required=True)
    p.add_argument("--session", default="all", help="session id, or 'all'")
    p.add_argument("--mqtt", default="mqtt://127.0.0.1:1883")
    p.add_argument("--prefix", default="idol")
    p.add_argument("--mqtt-user", default="chat", help="broker user (password: $IDOLCAST_MQTT_PASSWORD)")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(bridge(a.channel, a.mqtt, f"{a.prefix}/{a.session}/chat/in", a.mqtt_user))


if __name__ == "__main__":
    main()
