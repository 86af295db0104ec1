"""A real TCP server on 127.0.0.1 that answers every request with raw bytes: broken, endless or
anything a test chooses (``Raw``), for the client tests and the fuzz of server answers."""

from __future__ import annotations

import socketserver
import threading


class Raw:
    """Answers every request with ``head`` and then ``chunk`` repeated ``times`` times (None: until the
    client hangs up); ``sent`` counts the bytes of the repeated part that went out."""

    def __init__(self, head: bytes, chunk: bytes = b"", times: int | None = 0):
        self.head, self.chunk, self.times, self.sent = head, chunk, times, 0
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = self.request.recv(65536)
                        if not chunk:
                            return
                        data += chunk
                    self.request.sendall(outer.head)
                    i = 0
                    while outer.times is None or i < outer.times:
                        self.request.sendall(outer.chunk)
                        outer.sent += len(outer.chunk)
                        i += 1
                except OSError:
                    pass

        self.tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.tcp.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.tcp.server_address[1]}"

    def __enter__(self) -> "Raw":
        threading.Thread(target=self.tcp.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.tcp.shutdown()
        self.tcp.server_close()
