"""Who may do what on the embedded MQTT broker (amqtt plugins; see docs/streamer.md).

* every client needs a user name and password (no anonymous clients);
* ``host`` (the engine itself, and the streamer's own tools) may publish anything;
* ``chat`` (chat bridges) may publish viewers' chat, ``{prefix}/+/chat/in``, and nothing else: not
  ``control``, not ``host/in`` (the host's own chat). Both may subscribe to everything.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from amqtt.contexts import Action
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.plugins.topic_checking import TopicAccessControlListPlugin
from amqtt.session import Session


class PasswordAuth(BaseAuthPlugin):
    @dataclass
    class Config:
        users: dict[str, str] = field(default_factory=dict)

    async def authenticate(self, *, session: Session) -> bool | None:
        expected = self.config.users.get(session.username or "")
        given = session.password or ""
        return expected is not None and hmac.compare_digest(expected.encode(), given.encode())


class PublishRoles(BaseTopicPlugin):
    @dataclass
    class Config:
        publish: dict[str, list[str]] = field(default_factory=dict)  # user → topic filters it may publish

    async def topic_filtering(
        self, *, session: Session | None = None, topic: str | None = None, action: Action | None = None
    ) -> bool | None:
        if action != Action.PUBLISH:
            return True
        allowed = self.config.publish.get(session.username or "" if session else "", [])
        return bool(topic) and any(TopicAccessControlListPlugin.topic_ac(topic or "", a) for a in allowed)
