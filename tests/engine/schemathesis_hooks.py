"""schemathesis hooks of tests/engine/test_openapi.py: WHIP/WHEP bodies are SDP text."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.serializer("application/sdp")
def sdp(ctx: Any, value: Any) -> bytes:
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else str(value).encode()
