"""Python workers against a real server: outcomes, progress and
checkpoints, cancel and pause, commit points, lost leases, a server that is
killed and restarted, and SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import longrun
from conftest import LossyProxy, Server, eventually
from longrun import errors

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Running:
    """A worker on a thread of the test, stopped (and joined) at the end."""

    def __init__(self, worker: longrun.Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the worker did not stop"


@pytest.fixture
def client(server: Server) -> Iterator[longrun.Client]:
    with longrun.Client(server.url, server.client_key) as c:
        yield c


def worker(server: Server, url: str | None = None, **options: Any) -> longrun.Worker:
    options.setdefault("claim_wait_seconds", 1)
    options.setdefault("lease_seconds", 6)
    options.setdefault("shutdown_grace", 5)
    return longrun.Worker(url or server.url, server.worker_key, **options)


def test_handlers_results_failures_progress_and_checkpoints(server: Server, client: longrun.Client) -> None:
    def agent(ctx: longrun.TaskContext) -> Any:
        if ctx.input.get("fail") == "typed":
            raise longrun.TaskFailed("model_refused", "the model said no")
        if ctx.input.get("fail") == "bug":
            raise ZeroDivisionError("oops")
        for step in range(3):
            ctx.report_progress({"completed_units": step + 1, "total_units": 3, "unit": "steps"})
            ctx.save_checkpoint({"step": step + 1})
            ctx.add_cost(0.5)
        return {"answer": ctx.input["q"] * 2, "attempt": ctx.attempt}

    async def noop(ctx: longrun.TaskContext) -> None:
        return None

    running = Running(worker(server, kinds={"py.agent": agent, "py.noop": noop}, concurrency=4))
    try:
        ok = client.submit("py.agent", {"q": 21})
        typed = client.submit("py.agent", {"fail": "typed"})
        bug = client.submit("py.agent", {"fail": "bug"})
        nothing = client.submit("py.noop")
        done = client.wait(ok.id, timeout=30)
        assert done.state == "succeeded" and done.value == {"answer": 42, "attempt": 1}
        assert done.progress is not None and done.progress.completed_units == 3
        assert done.cost.units == pytest.approx(1.5)
        failed = client.wait(typed.id, timeout=30)
        assert failed.state == "failed" and failed.error is not None
        assert (failed.error.code, failed.error.message) == ("model_refused", "the model said no")
        crashed = client.wait(bug.id, timeout=30)
        assert crashed.error is not None and crashed.error.code == "worker_error"
        assert "ZeroDivisionError" in crashed.error.message
        assert client.wait(nothing.id, timeout=30).state == "succeeded"
    finally:
        running.stop()
    assert running.worker.counts.get("complete", 0) >= 2


def test_cancel_and_pause_reach_the_handler(server: Server, client: longrun.Client) -> None:
    started = threading.Event()

    def agent(ctx: longrun.TaskContext) -> Any:
        step = (ctx.checkpoint or {}).get("step", 0)
        started.set()
        while step < 10_000:
            ctx.check()
            time.sleep(0.01)
            step += 1
            ctx.save_checkpoint({"step": step})
            if ctx.input.get("finish_after") and step >= ctx.input["finish_after"] + (ctx.checkpoint or {}).get(
                "base", 0
            ):
                return {"resumed_from_step": ctx.input.get("seen")}
        return {"step": step}

    async def resumable(ctx: longrun.TaskContext) -> Any:
        if ctx.checkpoint:
            return {"resumed_at": ctx.checkpoint}
        ctx.save_checkpoint({"step": 7})
        await ctx.stopping()
        ctx.check()
        return None

    running = Running(worker(server, kinds={"py.slow": agent, "py.agent": resumable}, concurrency=2))
    try:
        op = client.submit("py.slow", {})
        assert started.wait(30)
        eventually(lambda: client.get(op.id).state == "running")
        asked = client.cancel(op.id)
        assert asked.cancel_requested
        assert client.wait(op.id, timeout=30).state == "cancelled"

        op = client.submit("py.agent", {})
        eventually(lambda: client.get(op.id).state == "running")
        client.pause(op.id)
        paused = eventually(lambda: (o := client.get(op.id)).state == "paused" and o)
        assert paused.desired_state == "paused"
        client.resume(op.id)
        resumed = client.wait(op.id, timeout=30)
        assert resumed.state == "succeeded" and resumed.value == {"resumed_at": {"step": 7}}
    finally:
        running.stop()


def test_a_commit_point_makes_cancel_refused(server: Server, client: longrun.Client) -> None:
    release = threading.Event()
    committed = threading.Event()

    def committing(ctx: longrun.TaskContext) -> Any:
        ctx.commit_point()  # returns once the server has it
        committed.set()
        release.wait(30)
        return {"charged": True}

    running = Running(worker(server, kinds={"py.commit": committing}))
    try:
        op = client.submit("py.commit", {})
        # A cancel sent before the commit point reaches the server is a
        # cancel request like any other (and its repeats answer it): ask
        # only after the worker's commit point has been acknowledged.
        assert committed.wait(30), "the handler never passed its commit point"
        assert _cancel_refused(client, op.id)
        release.set()
        assert client.wait(op.id, timeout=30).value == {"charged": True}
    finally:
        release.set()
        running.stop()


def _cancel_refused(client: longrun.Client, op_id: str) -> bool:
    try:
        client.cancel(op_id)
    except errors.OperationNotCancellable:
        return True
    return False


def test_a_lost_lease_reports_nothing_more(own_server: Server) -> None:
    """The worker's heartbeats stop reaching the server (a proxy that drops
    everything) until the lease expires and the task is re-queued; when the
    network heals, the first attempt's handler learns it lost the lease, and
    what it returns is never reported: the result is the second attempt's."""
    proxy = LossyProxy(own_server.port)
    first_started = threading.Event()
    first_saw: dict[str, bool] = {}

    def slow(ctx: longrun.TaskContext) -> Any:
        if ctx.attempt == 1:
            first_started.set()
            while not ctx.lease_lost:
                time.sleep(0.02)
            first_saw["lease_lost"] = True
            return {"attempt": 1}
        return {"attempt": ctx.attempt}

    client = longrun.Client(own_server.url, own_server.client_key)
    running = Running(worker(own_server, url=proxy.url, kinds={"py.slow": slow}, lease_seconds=5))
    try:
        op = client.submit("py.slow", {})
        assert first_started.wait(30)
        proxy.blackhole = True
        eventually(lambda: client.get(op.id).attempt >= 2, timeout=60)
        proxy.blackhole = False
        done = client.wait(op.id, timeout=60)
        assert done.state == "succeeded" and done.value == {"attempt": 2}
        eventually(lambda: first_saw.get("lease_lost"), timeout=30)
        assert client.get(op.id).value == {"attempt": 2}, "the first attempt's return was dropped"
    finally:
        proxy.blackhole = False
        running.stop()
        proxy.close()
        client.close()


def test_work_survives_a_killed_and_restarted_server(own_server: Server) -> None:
    def agent(ctx: longrun.TaskContext) -> Any:
        time.sleep(0.05)
        return {"n": ctx.input["n"]}

    client = longrun.Client(own_server.url, own_server.client_key)
    running = Running(worker(own_server, kinds={"py.agent": agent}, concurrency=4, lease_seconds=5))
    try:
        ops = [client.submit("py.agent", {"n": n}) for n in range(40)]
        eventually(lambda: client.get(ops[3].id).terminal)
        own_server.restart()  # kill -9, then start again on the same port and data
        done = [client.wait(op.id, timeout=90) for op in ops]
        assert [o.state for o in done] == ["succeeded"] * 40
        assert [o.value for o in done] == [{"n": n} for n in range(40)]
    finally:
        running.stop()
        client.close()


def test_the_example_worker_resumes_from_its_checkpoint_after_kill_9(own_server: Server) -> None:
    env = {
        **os.environ,
        "LONGRUN_SERVER": own_server.url,
        "LONGRUN_TOKEN": own_server.worker_key,
        "LONGRUN_LEASE_SECONDS": "5",
        "PYTHONUNBUFFERED": "1",
    }

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(EXAMPLES / "agent_worker.py")], env=env)

    client = longrun.Client(own_server.url, own_server.client_key)
    first = start()
    try:
        op = client.submit("py.agent", {"steps": 40, "step_seconds": 0.05})
        eventually(lambda: ((client.get(op.id).progress or longrun.Progress()).completed_units or 0) >= 5)
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = start()
        try:
            done = client.wait(op.id, timeout=90)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=60) == 0
        assert done.state == "succeeded" and done.attempt == 2
        assert done.value["steps"] == 40 and done.value["resumed_from"] >= 5
    finally:
        first.kill()
        client.close()


def test_sigterm_gives_running_work_back(own_server: Server) -> None:
    env = {
        **os.environ,
        "LONGRUN_SERVER": own_server.url,
        "LONGRUN_TOKEN": own_server.worker_key,
        "LONGRUN_SHUTDOWN_GRACE": "1",
    }
    client = longrun.Client(own_server.url, own_server.client_key)
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "agent_worker.py")], env=env)
    try:
        op = client.submit("py.agent", {"steps": 10_000, "step_seconds": 0.05, "ignore_stop": True})
        eventually(lambda: client.get(op.id).state == "running")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        back = client.get(op.id)
        assert not back.terminal and back.attempt == 2, back
        given_back = client.history(op.id)[-1]
        assert given_back.type == "retry_scheduled"
        assert given_back.raw["data"]["error"]["code"] == "worker_shutdown"
    finally:
        proc.kill()
        client.close()
