"""A webhook receiver on loopback for Alertmanager's notifications: every POSTed JSON body kept with
its arrival time (bodies over 1 MiB refused with 413, nothing else read)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20


class Webhook:
    def __init__(self) -> None:
        self.received: list[tuple[float, dict]] = []   # (unix arrival time, Alertmanager's payload)
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):   # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_BODY:
                    self.send_response(413)
                    self.end_headers()
                    return
                body = json.loads(self.rfile.read(length))
                with owner._lock:
                    owner.received.append((time.time(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):   # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/alerts"

    def alerts(self) -> list[tuple[float, dict]]:
        """(arrival time, alert) for every alert of every notification so far."""
        with self._lock:
            return [(t, a) for t, body in self.received for a in body.get("alerts", [])]

    def __enter__(self) -> "Webhook":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
