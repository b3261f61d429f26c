"""A webhook receiver on the standard library: verifies each delivery with
the tenant's secret, drops redeliveries, and reads the operation (a
delivery is a hint, the operation is the truth).

    LONGRUN_WEBHOOK_SECRET=whsec_… LONGRUN_TOKEN=lr_… python examples/webhook_receiver.py
    # serve with --webhook-allow-http --webhook-allow-private for a local receiver,
    # then submit with callback={"url": "http://127.0.0.1:9000/hooks"}
"""

from __future__ import annotations

import http.server
import os

import longrun
from longrun.webhooks import Deduper, InvalidSignature, verify

SECRET = os.environ["LONGRUN_WEBHOOK_SECRET"]
CLIENT = longrun.Client(os.environ.get("LONGRUN_SERVER", "http://127.0.0.1:8080"), os.environ["LONGRUN_TOKEN"])
SEEN = Deduper()


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            event = verify(dict(self.headers.items()), body, SECRET)
        except InvalidSignature:
            self.send_response(401)
            self.end_headers()
            return
        # Acknowledge first; a slow receiver gets retried.
        self.send_response(204)
        self.end_headers()
        if SEEN.first_time(self.headers["webhook-id"]):
            op = CLIENT.get(event["data"]["operation_id"])
            print(event["type"], op.id, op.state)


if __name__ == "__main__":
    http.server.ThreadingHTTPServer(("127.0.0.1", 9000), Receiver).serve_forever()
