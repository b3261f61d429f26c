"""A webhook round trip: the server signs, the SDK verifies and dedupes."""

from __future__ import annotations

import http.server
import queue
import threading
from typing import Dict, Tuple

import pytest

import longrun
from conftest import Server
from longrun.webhooks import Deduper, InvalidSignature, verify


def test_webhook_round_trip(server: Server) -> None:
    received: queue.Queue[Tuple[Dict[str, str], bytes]] = queue.Queue()

    class Receiver(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.put(({k: v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    secret = server.cli("tenants", "webhook-secret", "default")
    assert secret.startswith("whsec_")
    try:
        with longrun.Client(server.url, server.client_key) as client:
            callback = {"url": f"http://127.0.0.1:{httpd.server_address[1]}/hooks"}
            op = client.submit("sleep", {"duration_ms": 1}, callback=callback)
            client.wait(op.id)
            seen = Deduper()
            types = []
            while "operation.succeeded" not in types:
                headers, body = received.get(timeout=30)
                event = verify(headers, body, secret)
                assert event["data"]["operation_id"] == op.id
                assert seen.first_time(headers["webhook-id"])
                types.append(event["type"])
            assert not seen.first_time(headers["webhook-id"]), "a redelivery is recognised"
            with pytest.raises(InvalidSignature):
                verify(headers, body.replace(b"succeeded", b"failed"), secret)
            with pytest.raises(InvalidSignature):
                verify(headers, body, "whsec_" + "A" * 32)
    finally:
        httpd.shutdown()
