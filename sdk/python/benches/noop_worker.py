"""A Python worker that drains the ``noop`` kind as fast as it can: the
Python half of the peers bench's "python remote" rows (the Rust half is two
``RemoteWorker``s with the same slots, in the same run).

    python benches/noop_worker.py URL WORKER_KEY [CONCURRENCY]

Prints ``ready`` once imported and set up, then starts on a line on stdin,
so the bench's clock leaves out the interpreter's start. Stops on SIGTERM.
"""

from __future__ import annotations

import sys

import longrun


async def noop(ctx: longrun.TaskContext) -> None:
    return None


def main() -> None:
    url, key = sys.argv[1], sys.argv[2]
    concurrency = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    worker = longrun.Worker(url, key, kinds={"noop": noop}, concurrency=concurrency, claim_wait_seconds=1)
    print("ready", flush=True)
    sys.stdin.readline()
    worker.run()


if __name__ == "__main__":
    main()
