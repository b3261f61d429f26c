"""The SDK's wire types against the server's own ``/openapi.json``: a field
the server adds, renames or drops fails here, so the SDK cannot drift."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Dict, Set

import httpx
import pytest

import longrun
from conftest import Server
from longrun import _protocol as p
from longrun import errors, models


@pytest.fixture(scope="module")
def schemas(server: Server) -> Dict[str, Any]:
    document = httpx.get(server.url + "/openapi.json").json()
    return dict(document["components"]["schemas"])


def props(schemas: Dict[str, Any], name: str) -> Set[str]:
    return set(schemas[name]["properties"])


def fields(cls: type) -> Set[str]:
    return {f.name for f in dataclasses.fields(cls)} - {"raw"}


def test_every_problem_code_has_its_class(schemas: Dict[str, Any]) -> None:
    assert set(errors.BY_CODE) == set(schemas["ProblemCode"]["enum"])
    for code, cls in errors.BY_CODE.items():
        assert issubclass(cls, errors.LongrunError) and cls.code == code


def test_response_models_match(schemas: Dict[str, Any]) -> None:
    assert fields(models.Operation) == props(schemas, "OperationBody")
    assert fields(models.Task) == props(schemas, "TaskBody")
    assert fields(models.Progress) == props(schemas, "ProgressBody")
    assert fields(models.Cost) == props(schemas, "CostBody")
    assert fields(models.OperationError) == props(schemas, "ErrorBody")
    assert fields(models.HistoryEvent) | {"data"} == props(schemas, "EventBody")
    artifact = fields(models.Artifact) - {"download_url", "download_expires_at"} | {"download"}
    assert artifact == props(schemas, "ArtifactBody")
    assert fields(models.Upload) | {"created_at"} == props(schemas, "UploadBody")
    assert {"operations", "next_page_token"} == props(schemas, "OperationList")
    assert {"cancel_requested", "pause_requested", "cancel_reason"} <= props(schemas, "OutcomeItemResult")


def first_request(flow: p.Flow[Any]) -> p.Request:
    step = next(flow)
    assert isinstance(step, p.Request)
    return step


def test_request_bodies_match(schemas: Dict[str, Any]) -> None:
    retry = p.RetryPolicy()
    every = {
        "callback": {"url": "https://example.com/h"},
        "deadline_seconds": 60,
        "budget": {"max_cost_units": 5},
        "labels": {"a": "b"},
        "not_before": "2026-12-06T02:00:00Z",
        "start_after_seconds": 60,
        "priority": 7,
    }
    submit = first_request(p.submit("k", {"x": 1}, None, every, None, retry))
    assert set(submit.json) == props(schemas, "SubmitRequest")
    batch = first_request(p.submit_batch([{"kind": "k", "input": {}, **every}], retry))
    assert set(batch.json["operations"][0]) == props(schemas, "BatchSubmitItem")
    rerun = first_request(p.rerun("op_x", None, {**every, "from_checkpoint": True}, retry))
    assert set(rerun.json) == props(schemas, "RerunRequest")
    update = first_request(p.update("op_x", {"desired_state": "paused"}, "1", retry))
    assert set(update.json) <= props(schemas, "UpdateRequest")


def test_worker_bodies_match(schemas: Dict[str, Any]) -> None:
    worker = longrun.Worker("http://127.0.0.1:1", "lr_x", kinds={"k": lambda ctx: None})
    assert set(worker._claim_body(5)) == props(schemas, "ClaimRequest")
    task = longrun.Task("op_x", "k", {}, 1, "tok", "2026-01-01T00:00:00Z")
    ctx = longrun.TaskContext(task, worker, asyncio.new_event_loop())
    ctx.report_progress({"completed_units": 1, "total_units": 2, "unit": "u", "phase": "P", "details": {}})
    ctx.add_cost(1)
    ctx.save_checkpoint({"step": 1})
    ctx._cancellable = False
    outcome_item = props(schemas, "OutcomeItem")
    beat = ctx._beat_item(0.0, force=True)
    assert beat is not None and set(beat) == outcome_item - {"result", "error"}
    assert set(beat["progress"]) == set(schemas["ProgressRequest"]["properties"])
    kinds = set(schemas["OutcomeKind"]["enum"])
    ctx.report_progress({"completed_units": 2})
    for outcome, extra in [
        ("complete", {"result": 1}),
        ("fail", {"error": {"code": "c", "message": "m", "retryable": False}}),
        ("cancelled", {}),
        ("paused", {"checkpoint": {"step": 1}}),
    ]:
        item = ctx._outcome(outcome, **extra)
        assert item["outcome"] in kinds
        assert set(item) <= outcome_item - {"cost_units", "cancellable"}
    assert set(schemas["ErrorRequest"]["properties"]) == {"code", "message", "retryable"}
