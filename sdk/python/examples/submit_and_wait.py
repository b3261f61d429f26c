"""Submit work and wait for it, with a progress line.

LONGRUN_TOKEN=lr_…(client key) python examples/submit_and_wait.py
"""

from __future__ import annotations

import os

import longrun


def show(op: longrun.Operation) -> None:
    fraction = op.progress.fraction if op.progress else None
    print(f"{op.id} {op.state} v{op.version}" + (f" {fraction:.0%}" if fraction is not None else ""))


def main() -> None:
    server = os.environ.get("LONGRUN_SERVER", "http://127.0.0.1:8080")
    with longrun.Client(server, os.environ["LONGRUN_TOKEN"]) as client:
        op = client.submit("sleep", {"duration_ms": 2000, "steps": 4})
        op = client.wait(op.id, on_progress=show)
        print("result:", op.result)


if __name__ == "__main__":
    main()
