"""A real ``longrun serve`` per test session (and per test where a test
restarts it), on a free port with its own data directory, and an HTTP proxy
that loses answers on purpose.

The server binary is ``$LONGRUN_BIN``, else the workspace's
``target/debug/longrun`` (built with cargo when missing).
"""

from __future__ import annotations

import http.client
import http.server
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[3]

#: Kinds the tests serve from Python workers (declared rerun-safe, pausable).
KINDS = ["py.noop", "py.agent", "py.slow", "py.idle", "py.commit"]


def binary() -> str:
    path = os.environ.get("LONGRUN_BIN") or str(ROOT / "target" / "debug" / "longrun")
    if not os.path.exists(path):
        subprocess.run(["cargo", "build", "--locked", "-p", "longrun-cli", "--bin", "longrun"], cwd=ROOT, check=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``longrun serve`` on SQLite in a fresh data directory."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        self.bin = binary()
        self.data = tempfile.mkdtemp(prefix="longrun-py-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = extra or []
        self.proc: Optional[subprocess.Popen[str]] = None
        self.client_key = ""
        self.admin_key = ""
        self.start()
        self.worker_key = self.cli("keys", "create", "--tenant", "default", "--role", "worker")
        for kind in KINDS:
            self.cli("kinds", "set", kind, "--rerun-safe", "--pausable", "--max-attempts", "5")

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [self.bin, *args, "--data-dir", self.data],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "LONGRUN_LOG": "error"},
        )
        return out.stdout.strip()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.bin,
                "serve",
                "--data-dir",
                self.data,
                "--listen",
                f"127.0.0.1:{self.port}",
                "--webhook-allow-http",
                "--webhook-allow-private",
                "--keep-inputs",
                *self.extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "LONGRUN_LOG": "error"},
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if m := re.search(r"admin key:\s*(\S+)", line):
                self.admin_key = m.group(1)
            if m := re.search(r"client key:\s*(\S+)", line):
                self.client_key = m.group(1)
            if line.startswith("longrun listening"):
                break
        else:
            raise RuntimeError("longrun serve exited before it listened")
        threading.Thread(target=self._drain_stdout, daemon=True).start()

    def _drain_stdout(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        for _ in proc.stdout:
            pass

    def kill(self) -> None:
        """kill -9, as a crash would."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.data, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A server of the test's own (for tests that kill or restart it)."""
    s = Server()
    yield s
    s.close()


class LossyProxy:
    """An HTTP/1.1 proxy in front of a server that forwards every request,
    then loses the answer of a share of them (closes the connection without
    a byte: the request *was* applied, the client cannot know). With
    ``blackhole`` set it answers nothing and forwards nothing."""

    def __init__(self, upstream_port: int, lose: float = 0.0, seed: int = 7) -> None:
        self.upstream_port = upstream_port
        self.lose = lose
        self.blackhole = False
        self.lost = 0
        self.forwarded = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.blackhole:
                    self.close_connection = True
                    self.connection.close()
                    return
                headers: Dict[str, str] = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                upstream.close()
                with proxy._lock:
                    proxy.forwarded += 1
                    lose = proxy._random.random() < proxy.lose
                    proxy.lost += lose
                if lose:
                    self.close_connection = True
                    self.connection.close()
                    return
                self.send_response_only(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _relay

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def eventually(check, timeout: float = 30.0, every: float = 0.05):  # type: ignore[no-untyped-def]
    """Polls ``check()`` until it returns something truthy (an observation
    of the server's state, not a stand-in for synchronisation)."""
    give_up = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"not within {timeout} s: {check}")
        time.sleep(every)
