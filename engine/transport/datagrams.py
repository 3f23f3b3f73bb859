"""Read every datagram waiting on a WebRTC socket when it is ready, not one per loop iteration.

asyncio's selector transport for UDP (``_SelectorDatagramTransport._read_ready``) reads **one**
datagram each time its socket is ready, i.e. one per socket per turn of the event loop. A session's
socket carries the host's audio (50 packets a second), RTCP and ICE; once a turn of the loop takes
longer than ~20 ms (16 sessions on the H200 box: the loop woke ~100 ms late at P90, sharing the GIL
with the encoders' and models' threads), the socket is read more slowly than it fills. The backlog
then grows to the kernel's receive buffer (~5 s of audio at 212,992 bytes), every packet is read
seconds late, and the ICE consent answers with them: the engine answered its clients' consent checks
3.6–6.7 s late, the clients' own checks (500 ms each) all failed, and every session closed 30 s in
("Consent to send expired"; docs/PERFORMANCE.md, "H200: many sessions", fourth run).

:func:`drain_when_ready` re-registers such a transport's reader with one that reads until the socket
is empty (at most :data:`MAX_PER_WAKE` datagrams, so one flooded socket cannot hold the loop), with
the same error handling as asyncio's own. Other transports (uvloop's, which already reads up to 32 a
wake, or any non-selector loop) are left as they are.
"""

from __future__ import annotations

import asyncio
from asyncio import selector_events
from typing import Any

MAX_PER_WAKE = 64  # datagrams read per readiness event at most (libuv reads 32)


def drain_when_ready(transport: asyncio.BaseTransport) -> bool:
    """Have ``transport`` read all its waiting datagrams per wake; False when it is not asyncio's own.

    Call it once the endpoint exists (``loop.create_datagram_endpoint`` returned): its reader is
    registered by then, and is replaced here.
    """
    if not isinstance(transport, selector_events._SelectorDatagramTransport):  # type: ignore[attr-defined]
        return False
    loop: Any = transport._loop  # type: ignore[attr-defined]
    sock = transport._sock  # type: ignore[attr-defined]
    fd = transport._sock_fd  # type: ignore[attr-defined]
    protocol = transport._protocol  # type: ignore[attr-defined]
    if transport.is_closing() or fd < 0:
        return False

    def read_ready() -> None:
        for _ in range(MAX_PER_WAKE):
            if transport._conn_lost:  # type: ignore[attr-defined]
                return
            try:
                data, addr = sock.recvfrom(transport.max_size)  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                protocol.error_received(exc)
                return
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                transport._fatal_error(exc, "Fatal read error on datagram transport")  # type: ignore[attr-defined]
                return
            protocol.datagram_received(data, addr)

    loop._remove_reader(fd)
    loop._add_reader(fd, read_ready)
    return True
