"""Socket reads bounded by one deadline for a whole message, not by a timeout per read.

Why: ``socket.settimeout`` bounds each ``recv``, so a peer that sends one byte just before every
timeout holds the reader forever (slowloris on the server side; a server that dribbles its body or
SSE keep-alives on the client side). ``DeadlineReader`` sets the socket timeout to the time left
before every ``recv`` and raises ``TimeoutError`` once the deadline has passed. The builtin server
reads each request through one, and the benchmark client reads each response through one.
"""

from __future__ import annotations

import io
import socket
import time


class DeadlineReader(io.RawIOBase):
    """A raw reader over a socket; ``deadline`` (``time.monotonic()`` seconds, or None) bounds all reads."""

    def __init__(self, sock: socket.socket, deadline: float | None = None):
        self.sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline); raises ``TimeoutError`` when none are."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    def readinto(self, buf) -> int:
        self.sock.settimeout(self.remaining())
        return self.sock.recv_into(buf)


def peer_closed(sock: socket.socket) -> bool:
    """True when the peer has closed or reset the connection (checked without blocking or consuming).

    Bytes waiting to be read (a pipelined next request) mean the peer is still there.
    """
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return data == b""
