"""A Python worker for the kind ``py.agent``: an "agent run" of N steps that
reports progress and saves a checkpoint after every step, so a run whose
worker is killed resumes where it stopped (on the next attempt, from the
last checkpoint the server has).

    longrun kinds set py.agent --rerun-safe --pausable
    LONGRUN_TOKEN=lr_…(worker key) python examples/agent_worker.py

Input: ``{"steps": 20, "step_seconds": 0.5}``. Cancel and pause work
between steps. SIGTERM stops it gracefully (running runs get
``LONGRUN_SHUTDOWN_GRACE`` seconds, then go back to the queue).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import longrun


def agent_run(ctx: longrun.TaskContext) -> Any:
    steps = int(ctx.input.get("steps", 20))
    pace = float(ctx.input.get("step_seconds", 0.5))
    resumed_from = (ctx.checkpoint or {}).get("step", 0)
    step = resumed_from
    while step < steps:
        if not ctx.input.get("ignore_stop"):
            ctx.check()  # cancelled → acknowledged; pause → paused at this checkpoint
        time.sleep(pace)  # one step of the agent's work
        step += 1
        ctx.save_checkpoint({"step": step})
        ctx.report_progress({"completed_units": step, "total_units": steps, "unit": "steps", "phase": "THINKING"})
    return {"steps": step, "resumed_from": resumed_from}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    worker = longrun.Worker(
        os.environ.get("LONGRUN_SERVER", "http://127.0.0.1:8080"),
        os.environ["LONGRUN_TOKEN"],
        kinds={"py.agent": agent_run},
        concurrency=int(os.environ.get("LONGRUN_CONCURRENCY", "4")),
        lease_seconds=int(os.environ.get("LONGRUN_LEASE_SECONDS", "30")),
        claim_wait_seconds=1,
        shutdown_grace=float(os.environ.get("LONGRUN_SHUTDOWN_GRACE", "30")),
    )
    worker.run()  # until SIGTERM / Ctrl-C


if __name__ == "__main__":
    main()
