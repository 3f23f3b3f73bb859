"""The engine's credentials: the host token (generated on first start) and revocable viewer tokens.

Two scopes (see ``docs/api.md``):

* ``host``: everything — steering the idol, sessions, memory, persona, RTMP, tokens;
* ``viewer``: read-only — the OBS and overlay pages (streams, clock, events) and WHEP.

The host token lives in ``<server.secrets_dir>/host_token`` (mode 0600), unless ``server.host_token``
sets one. Viewer tokens are kept as SHA-256 digests in ``viewer_tokens.json`` beside it; the secret
itself is shown once, when it is made. Files are small and read/written at start and on token
changes only (never per request).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

Scope = Literal["host", "viewer"]
HOST_TOKEN_FILE = "host_token"
MQTT_USERS_FILE = "mqtt_users.json"
MQTT_USERS = ("host", "chat")
VIEWER_TOKENS_FILE = "viewer_tokens.json"
MAX_VIEWER_TOKENS = 256


class CredentialError(RuntimeError):
    """The host credential could not be read or created (the message says where and why)."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _write_private(path: Path, text: str, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if exclusive:  # first start: never overwrite a token another process just made
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def load_or_create_host_token(secrets_dir: Path) -> tuple[str, bool]:
    """The host token stored under ``secrets_dir`` (made on first use); and whether it was just made."""
    path = secrets_dir / HOST_TOKEN_FILE
    try:
        token = path.read_text().strip()
        if token:
            return token, False
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CredentialError(f"cannot read the host token {path}: {e}") from None
    token = secrets.token_urlsafe(32)
    try:
        _write_private(path, token + "\n", exclusive=True)
    except FileExistsError:  # made by a concurrent start: use that one
        return path.read_text().strip(), False
    except OSError as e:
        raise CredentialError(f"cannot create the host token {path}: {e}") from None
    return token, True


def load_or_create_mqtt_users(secrets_dir: Path) -> dict[str, str]:
    """The embedded MQTT broker's users (``host``, ``chat``) and their passwords, made on first use
    (``mqtt_users.json``, 0600). Blocking: call in a thread."""
    path = secrets_dir / MQTT_USERS_FILE
    try:
        users = json.loads(path.read_text())
        if isinstance(users, dict) and all(isinstance(users.get(u), str) and users[u] for u in MQTT_USERS):
            return {u: users[u] for u in MQTT_USERS}
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        raise CredentialError(f"cannot read the MQTT users {path}: {type(e).__name__}") from None
    users = {u: secrets.token_urlsafe(24) for u in MQTT_USERS}
    try:
        _write_private(path, json.dumps(users, indent=1))
    except OSError as e:
        raise CredentialError(f"cannot create the MQTT users {path}: {e}") from None
    return users


def read_host_token(secrets_dir: Path | str = "var/secrets") -> str | None:
    """The host token of a local engine (for the CLI and the bench), or None if there is none yet."""
    env = os.environ.get("IDOLCAST_TOKEN", "").strip()
    if env:
        return env
    try:
        return (Path(secrets_dir) / HOST_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


@dataclass
class ViewerToken:
    id: str
    label: str
    created_at: float
    digest: str

    def public(self) -> dict[str, object]:
        return {"id": self.id, "label": self.label, "created_at": self.created_at, "scope": "viewer"}


class Credentials:
    """Who may do what. ``check`` maps a presented token to its scope (or None)."""

    def __init__(self, host_token: str, secrets_dir: Path | None) -> None:
        if len(host_token) < 16:
            raise CredentialError("the host token must be at least 16 characters")
        self.host_token = host_token
        self.secrets_dir = secrets_dir
        # Handed to the OBS/overlay pages a loopback browser opens (never stored; new each start).
        self.local_viewer_token = secrets.token_urlsafe(32)
        self.viewers: dict[str, ViewerToken] = {}
        self._load_viewers()

    @classmethod
    def from_settings(cls, host_token: str, secrets_dir: str) -> tuple[Credentials, bool]:
        """The configured token, else the stored one (made on first start); and whether it is new."""
        folder = Path(secrets_dir)
        if host_token:
            return cls(host_token, folder), False
        token, created = load_or_create_host_token(folder)
        return cls(token, folder), created

    # ---- checking --------------------------------------------------------------------------------

    def check(self, token: str) -> Scope | None:
        if not token:
            return None
        if hmac.compare_digest(token, self.host_token):
            return "host"
        if hmac.compare_digest(token, self.local_viewer_token):
            return "viewer"
        digest = _digest(token)
        for viewer in self.viewers.values():
            if hmac.compare_digest(digest, viewer.digest):
                return "viewer"
        return None

    # ---- viewer tokens ---------------------------------------------------------------------------

    def _file(self) -> Path | None:
        return None if self.secrets_dir is None else self.secrets_dir / VIEWER_TOKENS_FILE

    def _load_viewers(self) -> None:
        path = self._file()
        if path is None or not path.exists():
            return
        try:
            rows = json.loads(path.read_text())
            self.viewers = {r["id"]: ViewerToken(**r) for r in rows}
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("ignoring unreadable viewer tokens %s (%s)", path, type(e).__name__)

    def _save_viewers(self) -> None:
        path = self._file()
        if path is not None:
            _write_private(path, json.dumps([asdict(v) for v in self.viewers.values()], indent=1))

    def create_viewer(self, label: str) -> tuple[ViewerToken, str]:
        """A new viewer token (blocking: writes the file); the secret is returned once."""
        if len(self.viewers) >= MAX_VIEWER_TOKENS:
            raise ValueError(f"too many viewer tokens (max {MAX_VIEWER_TOKENS}); revoke some first")
        secret = secrets.token_urlsafe(24)
        # wall time, deliberately: when the token was made, a calendar date for the host to read
        viewer = ViewerToken(uuid.uuid4().hex[:12], label, time.time(), _digest(secret))
        self.viewers[viewer.id] = viewer
        self._save_viewers()
        return viewer, secret

    def revoke_viewer(self, token_id: str) -> bool:
        if self.viewers.pop(token_id, None) is None:
            return False
        self._save_viewers()
        return True
