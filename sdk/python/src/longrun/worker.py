"""Remote workers: :class:`Worker` runs your handlers for the kinds it
serves over the HTTP worker protocol (docs/api.md §4, §9).

It long-polls for tasks (as many as it has free slots, up to 100 a claim),
runs each handler — ``def`` handlers in a thread pool, ``async def``
handlers on the worker's event loop — renews every lease with batched
heartbeats that carry progress, cost and checkpoints and bring back cancel
and pause requests, and sends outcomes in batches (whatever ends within a
couple of milliseconds shares one ``POST /v1/worker/outcomes``), each fenced
by its task's lease token. A task whose lease is lost (the server gave it to
another worker) reports nothing more: its handler is told
(``ctx.lease_lost``), an ``async`` handler is cancelled, and whatever it
returns is dropped. On SIGTERM or :meth:`Worker.stop` the worker stops
claiming, lets running tasks finish within ``shutdown_grace``, then gives
the rest back as retryable failures, so they run again elsewhere.

The same semantics as the Rust ``RemoteWorker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import threading
import time
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Tuple, Union

import httpx

from . import errors
from ._protocol import RetryPolicy
from .models import Task

log = logging.getLogger("longrun.worker")

#: A handler: ``def handler(ctx) -> result`` or ``async def handler(ctx) -> result``.
#: The result (any JSON value, or ``None``) becomes the operation's result.
Handler = Callable[["TaskContext"], Union[Any, Awaitable[Any]]]

#: The most tasks one claim asks for (the protocol's bound).
MAX_CLAIM = 100
#: The most outcomes one ``POST /v1/worker/outcomes`` carries.
OUTCOME_BATCH = 100
#: How long an outcome waits for others to share its request.
OUTCOME_LINGER = 0.002


class TaskFailed(Exception):
    """Raise in a handler to fail the task with a stable ``code``.

    ``retryable=True`` says running the task again is safe and may succeed:
    the server re-queues it while attempts are left."""

    def __init__(self, code: str, message: str = "", *, retryable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable


class Cancelled(Exception):
    """Raised by :meth:`TaskContext.check` when cancellation was requested;
    a handler that lets it propagate acknowledges the cancellation."""


class PauseRequested(Exception):
    """Raised by :meth:`TaskContext.check` when a pause was requested; a
    handler that lets it propagate pauses with its last saved checkpoint."""


class LeaseLost(Exception):
    """Raised by :meth:`TaskContext.check` once the task's lease is lost:
    nothing the handler does for this attempt is reported any more."""


class TaskContext:
    """What a handler gets: its task, and the ways to report on it.

    Reports are cheap and never block on the network: progress, cost and
    checkpoints are kept and sent with the next heartbeat (progress at most
    once per ``progress_interval``), and the last ones go with the outcome.
    """

    def __init__(self, task: Task, worker: Worker, loop: asyncio.AbstractEventLoop) -> None:
        self.operation_id = task.operation_id
        self.kind = task.kind
        self.input: Any = task.input
        self.attempt = task.attempt
        self.deadline_at = task.deadline_at
        self.budget = task.budget
        #: The last checkpoint saved, by this attempt or an earlier one.
        self.checkpoint: Any = task.checkpoint
        self._task = task
        self._worker = worker
        self._loop = loop
        self._lock = threading.Lock()
        self._progress: Optional[Dict[str, Any]] = None
        self._progress_dirty = False
        self._cost = 0.0
        self._cost_dirty = False
        self._checkpoint_dirty = False
        self._cancellable: Optional[bool] = None
        self._cancel = threading.Event()
        self._pause = threading.Event()
        self._lost = threading.Event()
        self.cancel_reason: Optional[str] = None
        self._last_beat = time.monotonic()
        self._last_progress = 0.0
        self._stopping: Optional[asyncio.Event] = None

    # -- what the server asked ---------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Cancellation was requested (or the lease is lost): stop soon."""
        return self._cancel.is_set() or self._lost.is_set()

    @property
    def pause_requested(self) -> bool:
        """A pause was requested: save a checkpoint and stop soon."""
        return self._pause.is_set()

    @property
    def lease_lost(self) -> bool:
        """The server gave this task to another worker; nothing more this
        attempt does is reported."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raises :class:`LeaseLost`, :class:`Cancelled` or
        :class:`PauseRequested` if the handler should stop now; call it
        between steps."""
        if self._lost.is_set():
            raise LeaseLost(self.operation_id)
        if self._cancel.is_set():
            raise Cancelled(self.cancel_reason or "cancel requested")
        if self._pause.is_set():
            raise PauseRequested(self.operation_id)

    async def stopping(self) -> None:
        """Returns once cancellation or a pause is requested or the lease is
        lost (for ``async`` handlers that wait on other things)."""
        if self._stopping is None:
            self._stopping = asyncio.Event()
            if self.cancelled or self.pause_requested:
                self._stopping.set()
        await self._stopping.wait()

    def _signal(self) -> None:
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

    # -- reports -------------------------------------------------------------

    def report_progress(self, progress: Mapping[str, Any]) -> None:
        """Reports how far the work is: ``completed_units``, ``total_units``,
        ``unit``, ``phase`` (a stable code), ``details`` (small JSON)."""
        with self._lock:
            self._progress = dict(progress)
            self._progress_dirty = True

    def add_cost(self, units: float) -> None:
        """Adds to the operation's cost (the budget is enforced by the server)."""
        with self._lock:
            self._cost += units
            self._cost_dirty = True

    def save_checkpoint(self, value: Any) -> None:
        """Keeps ``value`` (JSON, ≤ 64 KiB) as where to resume: sent with the
        next heartbeat, handed to the next attempt as ``ctx.checkpoint``, and
        to the pause outcome."""
        with self._lock:
            self.checkpoint = value
            self._checkpoint_dirty = True

    def commit_point(self) -> None:
        """Declares that the work passed its point of no return: from now on
        a cancel request is refused (``operation_not_cancellable``). Blocks
        until the server has it; for ``def`` handlers (``async def``
        handlers ``await ctx.acommit_point()``)."""
        future = asyncio.run_coroutine_threadsafe(self.acommit_point(), self._loop)
        future.result()

    async def acommit_point(self) -> None:
        """:meth:`commit_point`, for ``async def`` handlers."""
        with self._lock:
            self._cancellable = False
        await self._worker._heartbeat([self], force=True)
        if self._lost.is_set():
            raise LeaseLost(self.operation_id)

    # -- the worker's side ------------------------------------------------------

    def _beat_item(self, now: float, force: bool) -> Optional[Dict[str, Any]]:
        """The heartbeat this task owes now, if any."""
        worker = self._worker
        with self._lock:
            due = force or now - self._last_beat >= worker.lease_seconds / 3
            progress_due = self._progress_dirty and now - self._last_progress >= worker.progress_interval
            if not (due or progress_due):
                return None
            item: Dict[str, Any] = {
                "operation_id": self.operation_id,
                "lease_token": self._task.lease_token,
                "outcome": "heartbeat",
            }
            if self._progress_dirty:
                item["progress"] = self._progress
                self._progress_dirty = False
                self._last_progress = now
            if self._cost_dirty:
                item["cost_units"] = self._cost
                self._cost_dirty = False
            if self._checkpoint_dirty:
                item["checkpoint"] = self.checkpoint
                self._checkpoint_dirty = False
            if self._cancellable is not None:
                item["cancellable"] = self._cancellable
            self._last_beat = now
            return item

    def _answered(self, result: Mapping[str, Any]) -> None:
        problem = result.get("problem") or {}
        if problem.get("code") == "lease_lost":
            self._lost.set()
            self._signal()
            return
        if result.get("cancel_requested"):
            self.cancel_reason = result.get("cancel_reason")
            self._cancel.set()
            self._signal()
        if result.get("pause_requested"):
            self._pause.set()
            self._signal()

    def _outcome(self, outcome: str, **fields: Any) -> Dict[str, Any]:
        item: Dict[str, Any] = {
            "operation_id": self.operation_id,
            "lease_token": self._task.lease_token,
            "outcome": outcome,
        }
        with self._lock:
            if self._progress is not None and self._progress_dirty:
                item["progress"] = self._progress
        item.update({k: v for k, v in fields.items() if v is not None})
        return item


class Worker:
    """Serves ``kinds`` (``{kind name: handler}``) from the server at
    ``base_url`` with a key of role ``worker``.

    >>> def agent_run(ctx):
    ...     for step in range(ctx.checkpoint or 0, 10):
    ...         ctx.check()
    ...         ...  # one step of work
    ...         ctx.save_checkpoint(step + 1)
    ...         ctx.report_progress({"completed_units": step + 1, "total_units": 10})
    ...     return {"answer": 42}
    >>> longrun.Worker(url, key, kinds={"agent.run": agent_run}, concurrency=8).run()

    Declare each kind on the server first (``longrun kinds set``).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        kinds: Mapping[str, Handler],
        concurrency: int = 4,
        worker_id: Optional[str] = None,
        lease_seconds: int = 30,
        claim_wait_seconds: int = 20,
        shutdown_grace: float = 30.0,
        progress_interval: float = 1.0,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        if not kinds:
            raise ValueError("a worker needs at least one kind")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.kinds = dict(kinds)
        self.concurrency = concurrency
        self.worker_id = worker_id or f"py-{os.uname().nodename}-{os.getpid()}"
        self.lease_seconds = lease_seconds
        self.claim_wait_seconds = claim_wait_seconds
        self.shutdown_grace = shutdown_grace
        self.progress_interval = progress_interval
        self.retry = retry or RetryPolicy()
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._stop_requested = threading.Event()
        self._http: Optional[httpx.AsyncClient] = None
        #: Running tasks by lease token (one operation may have a lost lease and a new one at once).
        self._running: Dict[str, Tuple[TaskContext, asyncio.Task[None]]] = {}
        self._free = concurrency
        self._slot_freed: Optional[asyncio.Event] = None
        self._outcomes: Optional[asyncio.Queue[Tuple[Dict[str, Any], asyncio.Future[Dict[str, Any]]]]] = None
        #: Tasks that ended and were reported, by outcome (for tests and logs).
        self.counts: Dict[str, int] = {}

    # -- life cycle -------------------------------------------------------------

    def run(self) -> None:
        """Runs until :meth:`stop` (or SIGTERM/SIGINT, when called from the
        main thread), then drains as described in the module docs."""
        asyncio.run(self.run_async(install_signals=threading.current_thread() is threading.main_thread()))

    def stop(self) -> None:
        """Asks the worker to stop (from any thread)."""
        self._stop_requested.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)

    async def run_async(self, *, install_signals: bool = False) -> None:
        """:meth:`run` for code that already has an event loop."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        if self._stop_requested.is_set():
            self._stop.set()
        self._slot_freed = asyncio.Event()
        self._outcomes = asyncio.Queue()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop.set)
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
        self._http = httpx.AsyncClient(limits=limits, timeout=self.claim_wait_seconds + 30)
        sender = asyncio.ensure_future(self._send_outcomes())
        beater = asyncio.ensure_future(self._heartbeats())
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            beater.cancel()
            await self._outcomes.join()
            sender.cancel()
            await self._http.aclose()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _claim_loop(self) -> None:
        assert self._stop is not None and self._slot_freed is not None and self._http is not None
        failures = 0
        while not self._stop.is_set():
            if self._free == 0:
                self._slot_freed.clear()
                stop = asyncio.ensure_future(self._stop.wait())
                freed = asyncio.ensure_future(self._slot_freed.wait())
                await asyncio.wait({stop, freed}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                freed.cancel()
                continue
            # The claim itself is never cut short by a stop: tasks the server
            # leased to us are run or given back, never dropped.
            try:
                tasks = await self._claim(min(self._free, MAX_CLAIM))
                failures = 0
            except (httpx.HTTPError, errors.LongrunError) as e:
                failures += 1
                log.warning("claim failed (%s); retrying", e)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=min(5.0, 0.5 * failures))
                continue
            for task in tasks:
                if self._stop.is_set():
                    await self._give_back(task, "the worker is shutting down")
                    continue
                self._start(task)

    async def _claim(self, max_tasks: int) -> List[Task]:
        assert self._http is not None
        body = self._claim_body(max_tasks)
        response = await self._http.post(f"{self.base_url}/v1/worker/claims", json=body, headers=self._auth)
        if response.status_code != 200:
            raise errors.from_problem(response.status_code, _json_or_none(response))
        return [Task.from_json(t) for t in response.json().get("tasks", [])]

    def _claim_body(self, max_tasks: int) -> Dict[str, Any]:
        return {
            "kinds": sorted(self.kinds),
            "max_tasks": max_tasks,
            "lease_seconds": self.lease_seconds,
            "wait_seconds": self.claim_wait_seconds,
            "worker_id": self.worker_id,
        }

    def _start(self, task: Task) -> None:
        assert self._loop is not None
        handler = self.kinds.get(task.kind)
        ctx = TaskContext(task, self, self._loop)
        self._free -= 1
        if handler is None:
            run = self._finish(
                ctx, ctx._outcome("fail", error=_error("unsupported_kind", f"no handler for {task.kind}"))
            )
            self._running[task.lease_token] = (ctx, asyncio.ensure_future(run))
            return
        self._running[task.lease_token] = (ctx, asyncio.ensure_future(self._run_task(ctx, handler)))

    def _release(self, ctx: TaskContext) -> None:
        if self._running.pop(ctx._task.lease_token, None) is not None:
            self._free += 1
            assert self._slot_freed is not None
            self._slot_freed.set()

    async def _run_task(self, ctx: TaskContext, handler: Handler) -> None:
        assert self._loop is not None
        try:
            if inspect.iscoroutinefunction(handler):
                value = await handler(ctx)
            else:
                value = await self._in_thread(handler, ctx)
                if inspect.isawaitable(value):
                    value = await value
            item = ctx._outcome("complete", result=value)
        except asyncio.CancelledError:
            # Cancelled by the worker: a lost lease or the end of the grace.
            self._release(ctx)
            return
        except LeaseLost:
            item = None
        except Cancelled:
            item = ctx._outcome("cancelled")
        except PauseRequested:
            item = ctx._outcome("paused", checkpoint=ctx.checkpoint)
        except TaskFailed as e:
            item = ctx._outcome("fail", error=_error(e.code, e.message, e.retryable))
        except Exception as e:  # a handler's bug fails its task, not the worker
            log.exception("handler for %s failed on %s", ctx.kind, ctx.operation_id)
            item = ctx._outcome("fail", error=_error("worker_error", f"{type(e).__name__}: {e}"))
        if item is not None and ctx._cost_dirty:
            # Cost travels only on heartbeats: the last of it goes first.
            await self._heartbeat([ctx], force=True)
        if item is None or ctx.lease_lost:
            self._release(ctx)
            return
        await self._finish(ctx, item)

    def _in_thread(self, handler: Handler, ctx: TaskContext) -> asyncio.Future[Any]:
        """Runs a ``def`` handler on a daemon thread of its own: a handler
        that never returns cannot keep a stopped worker's process alive (its
        task was given back; nothing it does is reported)."""
        assert self._loop is not None
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, error: Optional[BaseException]) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def run() -> None:
            try:
                value = handler(ctx)
            except BaseException as e:
                loop.call_soon_threadsafe(settle, None, e)
            else:
                loop.call_soon_threadsafe(settle, value, None)

        threading.Thread(target=run, name=f"longrun-{ctx.operation_id}", daemon=True).start()
        return future

    async def _finish(self, ctx: TaskContext, item: Dict[str, Any]) -> None:
        # The slot takes the next task while the outcome is sent.
        self._release(ctx)
        assert self._loop is not None and self._outcomes is not None
        reply: asyncio.Future[Dict[str, Any]] = self._loop.create_future()
        await self._outcomes.put((item, reply))
        result = await reply
        status = int(result.get("status", 0))
        outcome = str(item["outcome"]) if status == 200 else (result.get("problem") or {}).get("code", "unsent")
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if status != 200:
            log.warning("outcome %s of %s answered %s", item["outcome"], ctx.operation_id, result)

    async def _give_back(self, task: Task, why: str) -> None:
        assert self._loop is not None
        ctx = TaskContext(task, self, self._loop)
        self._free -= 1
        self._running[task.lease_token] = (ctx, asyncio.current_task())  # type: ignore[assignment]
        await self._finish(ctx, ctx._outcome("fail", error=_error("worker_shutdown", why, True)))

    async def _drain(self) -> None:
        pending = {t for _, t in self._running.values()}
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.shutdown_grace)
            if late:
                log.warning("shutdown grace ended; giving back %d running tasks", len(late))
                for ctx, task in list(self._running.values()):
                    task.cancel()
                    ctx._lost.set()  # whatever its handler does now is not reported
                    ctx._signal()
                    await self._finish(
                        ctx,
                        ctx._outcome("fail", error=_error("worker_shutdown", "the worker shut down first", True)),
                    )

    # -- heartbeats and outcomes ----------------------------------------------

    async def _heartbeats(self) -> None:
        tick = min(1.0, self.progress_interval, self.lease_seconds / 6)
        while True:
            await asyncio.sleep(tick)
            try:
                await self._heartbeat([ctx for ctx, _ in self._running.values()], force=False)
            except Exception:  # keep beating whatever one round met
                log.exception("heartbeat round failed")

    async def _heartbeat(self, contexts: List[TaskContext], *, force: bool) -> None:
        """One request renewing every lease in ``contexts`` that is due."""
        now = time.monotonic()
        due = [(ctx, item) for ctx in contexts if (item := ctx._beat_item(now, force)) is not None]
        if not due:
            return
        for start in range(0, len(due), OUTCOME_BATCH):
            part = due[start : start + OUTCOME_BATCH]
            results = await self._post_outcomes([item for _, item in part])
            for (ctx, _), result in zip(part, results):
                ctx._answered(result)
                if ctx.lease_lost:
                    self._abandon(ctx)

    def _abandon(self, ctx: TaskContext) -> None:
        """A lost lease: cancel an ``async`` handler; a thread can only be told."""
        entry = self._running.get(ctx._task.lease_token)
        if entry is not None and entry[0] is ctx:
            log.warning("lease lost on %s; its outcome will not be reported", ctx.operation_id)
            handler = self.kinds.get(ctx.kind)
            if handler is not None and inspect.iscoroutinefunction(handler):
                entry[1].cancel()

    async def _send_outcomes(self) -> None:
        assert self._outcomes is not None
        queue = self._outcomes
        while True:
            first = await queue.get()
            batch = [first]
            deadline = time.monotonic() + OUTCOME_LINGER
            while len(batch) < OUTCOME_BATCH:
                try:
                    batch.append(queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), timeout=left))
                except asyncio.TimeoutError:
                    break
            results = await self._post_outcomes([item for item, _ in batch])
            for (_, reply), result in zip(batch, results):
                if not reply.done():
                    reply.set_result(result)
                queue.task_done()

    async def _post_outcomes(self, items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """``POST /v1/worker/outcomes``, retried on a lost answer (each item is
        fenced by its lease token, so a repeat cannot apply twice: an outcome
        that was applied answers ``lease_lost`` the second time)."""
        assert self._http is not None
        attempt = 0
        while True:
            why: str
            try:
                response = await self._http.post(
                    f"{self.base_url}/v1/worker/outcomes", json={"outcomes": items}, headers=self._auth, timeout=30
                )
                if response.status_code == 200:
                    results = response.json().get("results", [])
                    if len(results) == len(items):
                        # After a lost answer, an outcome that was applied
                        # answers `lease_lost` to its repeat: it is fenced.
                        return list(results)
                    why = "the outcomes answer does not match the request"
                elif response.status_code in (429, 502, 503, 504) or response.status_code >= 500:
                    why = f"outcomes answered {response.status_code}"
                else:
                    problem = _json_or_none(response)
                    return [{"status": response.status_code, "problem": problem} for _ in items]
            except httpx.HTTPError as e:
                why = repr(e)
            attempt += 1
            if attempt >= self.retry.max_attempts:
                log.warning("giving up on %d outcomes: %s", len(items), why)
                return [{"status": 0, "problem": {"code": "unsent", "detail": why}} for _ in items]
            await asyncio.sleep(self.retry.delay(attempt))


def _error(code: str, message: str, retryable: bool = False) -> Dict[str, Any]:
    return {"code": code, "message": message[:4096], "retryable": retryable}


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


__all__ = [
    "Cancelled",
    "Handler",
    "LeaseLost",
    "PauseRequested",
    "TaskContext",
    "TaskFailed",
    "Worker",
]
