"""A /health endpoint whose answer a test controls (a real HTTP server on a free loopback port), for the sidecar's
engine health probe."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HealthServer:
    """/health answering `status` (a real HTTP server on a free loopback port)."""

    def __init__(self) -> None:
        self.status = 200
        self.num_requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.num_requests += 1
                self.send_response(outer.status if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/health"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    """A /health URL on a loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/health"


class RawServer:
    """A TCP server on a free loopback port that answers each connection with `behave(connection)` (a peer that does
    not speak HTTP, one that sends a little at a time, one that never answers)."""

    def __init__(self, behave) -> None:  # noqa: ANN001 - Callable[[socket.socket], None]
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/health"
        self.behave = behave
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        with connection:
            try:
                self.behave(connection)
            except OSError:
                pass

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
