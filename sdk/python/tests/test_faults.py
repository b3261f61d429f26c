"""Retries under lost answers: the lab's "5 % of answers lost" case with the
Python SDK. Every answer the proxy loses was applied by the server; the
SDK retries with the same idempotency key, so each logical submission makes
exactly one operation."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import longrun
from conftest import LossyProxy, Server

RUNS = 300


def test_five_percent_of_answers_lost_makes_no_duplicate(server: Server) -> None:
    proxy = LossyProxy(server.port, lose=0.05, seed=3)
    labels = {"lab": uuid.uuid4().hex[:12]}
    retry = longrun.RetryPolicy(max_attempts=12, base_delay=0.01, max_delay=0.2)
    try:
        with longrun.Client(proxy.url, server.client_key, retry=retry) as lossy:

            def one(i: int) -> str:
                return lossy.submit("py.idle", {"run": i}, labels=labels).id

            with ThreadPoolExecutor(8) as pool:
                ids = list(pool.map(one, range(RUNS)))
            assert proxy.lost > 0, "the proxy lost no answer: the test tested nothing"
            assert lossy.requests_sent == RUNS + proxy.lost

            # Batches too: every item keeps its key across the retries.
            batch = lossy.submit_batch([{"kind": "py.idle", "input": {"b": i}, "labels": labels} for i in range(50)])
            assert all(isinstance(b, longrun.Submitted) for b in batch)
    finally:
        proxy.close()
    with longrun.Client(server.url, server.client_key) as direct:
        stored = list(direct.list(labels=labels))
    assert len(stored) == RUNS + 50, f"{len(stored) - RUNS - 50} duplicates"
    assert len(set(ids)) == RUNS


def test_a_new_key_per_attempt_is_what_duplicates(server: Server) -> None:
    """The control: the same loss without a stable key duplicates work."""
    proxy = LossyProxy(server.port, lose=0.05, seed=3)
    labels = {"lab": uuid.uuid4().hex[:12]}
    sent = 0
    try:
        one_try = longrun.RetryPolicy(max_attempts=1)
        with longrun.Client(proxy.url, server.client_key, retry=one_try) as lossy:
            for i in range(100):
                while True:
                    sent += 1
                    try:
                        lossy.submit("py.idle", {"run": i}, labels=labels)  # a fresh key each call
                        break
                    except longrun.errors.TransportError:
                        continue
    finally:
        proxy.close()
    with longrun.Client(server.url, server.client_key) as direct:
        stored = len(list(direct.list(labels=labels)))
    assert stored == sent > 100, (stored, sent)
