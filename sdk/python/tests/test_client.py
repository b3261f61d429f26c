"""The blocking client against a real server: every call, and its refusals."""

from __future__ import annotations

import hashlib
import io
import time
import uuid

import pytest

import longrun
from conftest import Server
from longrun import errors


@pytest.fixture
def client(server: Server):  # type: ignore[no-untyped-def]
    with longrun.Client(server.url, server.client_key) as c:
        yield c


def tag() -> dict[str, str]:
    return {"t": uuid.uuid4().hex[:12]}


def test_submit_and_wait_sees_progress(client: longrun.Client) -> None:
    op = client.submit("sleep", {"duration_ms": 300, "steps": 3})
    assert op.state in ("queued", "running") and op.id.startswith("op_")
    seen: list[longrun.Operation] = []
    done = client.wait(op.id, on_progress=seen.append)
    assert done.state == "succeeded" and done.terminal
    assert done.value == {"slept_ms": 300}
    assert seen[-1] == done
    versions = [o.version for o in seen]
    assert versions == sorted(set(versions)), "each callback is a new version"


def test_submit_with_wait_answers_in_one_round_trip(client: longrun.Client) -> None:
    sent = client.requests_sent
    op = client.submit("sleep", {"duration_ms": 10}, wait=30)
    assert op.state == "succeeded"
    assert client.requests_sent == sent + 1


def test_same_key_replays_and_a_changed_request_is_refused(client: longrun.Client) -> None:
    key = uuid.uuid4().hex
    first = client.submit_detailed("py.idle", {"n": 1}, idempotency_key=key)
    again = client.submit_detailed("py.idle", {"n": 1}, idempotency_key=key)
    assert not first.replayed and again.replayed
    assert again.operation.id == first.operation.id and again.idempotency_key == key
    with pytest.raises(errors.IdempotencyKeyReused) as refused:
        client.submit("py.idle", {"n": 2}, idempotency_key=key)
    assert refused.value.status == 409 and refused.value.request_id


def test_refusals_raise_the_class_of_their_code(client: longrun.Client, server: Server) -> None:
    with pytest.raises(errors.NotFound):
        client.get("op_" + "a" * 29)
    with pytest.raises(errors.UnsupportedKind):
        client.submit("no.such.kind", {})
    with pytest.raises(errors.InvalidRequest):
        client.list_page(page_size=1000)
    with pytest.raises(errors.PayloadTooLarge):
        client.submit("py.idle", {"blob": "x" * (2 << 20)})
    with longrun.Client(server.url, "lr_not_a_key") as stranger, pytest.raises(errors.Unauthenticated):
        stranger.get("op_" + "a" * 29)
    with pytest.raises(errors.LongrunError) as base:
        client.get("op_" + "a" * 29)
    assert base.value.code == "not_found" and "not_found" in str(base.value)


def test_another_tenants_operation_is_not_found(client: longrun.Client, server: Server) -> None:
    other_key = server.cli("keys", "create", "--tenant", "other", "--role", "client")
    op = client.submit("py.idle", {})
    with longrun.Client(server.url, other_key) as other, pytest.raises(errors.NotFound):
        other.get(op.id)


def test_batch_answers_item_by_item(client: longrun.Client) -> None:
    answers = client.submit_batch(
        [
            {"kind": "py.idle", "input": {"i": 1}},
            {"kind": "no.such.kind", "input": {}},
            {"kind": "py.idle", "input": {"i": 2}, "idempotency_key": "batch-" + uuid.uuid4().hex},
        ]
    )
    assert isinstance(answers[0], longrun.Submitted) and answers[0].operation.kind == "py.idle"
    assert isinstance(answers[1], errors.UnsupportedKind)
    assert isinstance(answers[2], longrun.Submitted) and answers[2].idempotency_key.startswith("batch-")


def test_cancel_pause_resume_and_update(client: longrun.Client) -> None:
    op = client.submit("py.idle", {})
    paused = client.pause(op.id)
    assert paused.state == "paused" and paused.desired_state == "paused"
    assert client.pause(op.id).state == "paused", "pausing twice is no error"
    resumed = client.resume(op.id)
    assert resumed.state == "queued"
    with pytest.raises(errors.PreconditionFailed):
        client.update(op.id, {"labels": {"a": "b"}}, if_match=str(op.version))
    labelled = client.update(op.id, {"labels": {"a": "b"}})
    assert labelled.labels == {"a": "b"}
    cancelled = client.cancel(op.id, reason="not needed")
    assert cancelled.state == "cancelled"
    assert client.cancel(op.id).state == "cancelled", "cancel is idempotent"
    with pytest.raises(errors.IntentConflict):
        client.resume(op.id)
    kinds = [e.type for e in client.history(op.id)]
    assert kinds[0] == "created" and "cancelled" in kinds, kinds


def test_wait_times_out(client: longrun.Client) -> None:
    op = client.submit("py.idle", {})
    with pytest.raises(errors.WaitTimeout):
        client.wait(op.id, timeout=1)


def test_list_pages_through_everything_it_matches(client: longrun.Client) -> None:
    labels = tag()
    ids = {client.submit("py.idle", {"i": i}, labels=labels).id for i in range(5)}
    listed = [o.id for o in client.list(labels=labels, page_size=2)]
    assert set(listed) == ids and len(listed) == 5
    first = client.list_page(labels=labels, page_size=2)
    assert len(first.operations) == 2 and first.next_page_token


def test_events_stream_every_version_and_resume(client: longrun.Client) -> None:
    op = client.submit("sleep", {"duration_ms": 200, "steps": 4})
    seen = list(client.events(op.id))
    assert seen[-1].terminal and seen[-1].state == "succeeded"
    assert [o.version for o in seen] == sorted({o.version for o in seen})
    resumed = list(client.events(op.id, last_event_id=str(seen[-2].version)))
    assert [o.version for o in resumed] == [seen[-1].version]


def test_rerun_links_a_new_operation(client: longrun.Client) -> None:
    op = client.submit("sleep", {"duration_ms": 1}, wait=30)
    again = client.rerun(op.id)
    assert again.rerun_of == op.id and again.id != op.id
    assert client.wait(again.id).state == "succeeded"
    assert again.id in client.get(op.id).reruns


def test_download_streams_the_artifact_and_checks_it(client: longrun.Client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    op = client.submit("export", {"rows": 2000, "format": "csv"})
    assert client.wait(op.id).state == "succeeded"
    resource = client.result(op.id)
    assert resource.artifact is not None and resource.artifact.download_url
    seen: list[int] = []
    done = client.download(op.id, tmp_path / "out.csv", on_bytes=lambda n, total: seen.append(n))
    data = (tmp_path / "out.csv").read_bytes()
    assert done.bytes == len(data) == resource.artifact.size_bytes
    assert hashlib.sha256(data).hexdigest() == done.sha256 == resource.artifact.sha256
    assert seen[-1] == len(data) and data.startswith(b"id,")
    buffer = io.BytesIO()
    client.download(op.id, buffer)
    assert buffer.getvalue() == data


def test_upload_bytes_and_a_file(client: longrun.Client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    content = b"name,age\nada,36\n" * 1000
    upload = client.upload(content, content_type="text/csv")
    assert upload.complete and upload.size_bytes == len(content)
    assert upload.sha256 == hashlib.sha256(content).hexdigest()
    assert client.get_upload(upload.id).id == upload.id
    path = tmp_path / "in.csv"
    path.write_bytes(content)
    progress: list[int] = []
    again = client.upload(path, content_type="text/csv", on_bytes=lambda n, t: progress.append(n))
    assert again.sha256 == upload.sha256 and progress[-1] == len(content)
    imported = client.submit(
        "import",
        {"upload": again.id, "format": "csv", "schema": {"fields": {"name": {"type": "string"}}}},
    )
    assert client.wait(imported.id).state == "succeeded"


def test_work_that_starts_later_and_priority(client: longrun.Client) -> None:
    op = client.submit("py.idle", {}, start_after_seconds=3600, priority=8)
    assert op.priority == 8 and op.not_before is not None and op.state == "queued"
    later = client.update(op.id, {"not_before": None})
    assert later.not_before is None
    with pytest.raises(errors.InvalidRequest):
        client.submit("py.idle", {}, priority=12)


def test_schedules_are_created_fired_changed_and_deleted(client: longrun.Client) -> None:
    labels = tag()
    schedule = client.create_schedule(
        "sleep", "@every 1s", input={"duration_ms": 1}, overlap="allow", labels=labels, time_zone="Europe/Berlin"
    )
    assert schedule.id.startswith("sch_") and schedule.version == 1 and not schedule.paused
    assert len(schedule.next_fire_times) == 5 and schedule.time_zone == "Europe/Berlin"
    assert schedule.id in [s.id for s in client.list_schedules()]
    # The server fires it on the wall clock: its first firing's operation runs.
    deadline = time.monotonic() + 30
    while not any(f.operation_id for f in client.schedule_fires(schedule.id)):
        assert time.monotonic() < deadline, "no firing"
        time.sleep(0.05)
    fire = next(f for f in client.schedule_fires(schedule.id) if f.operation_id)
    assert fire.decision == "started"
    assert fire.operation_id is not None
    done = client.wait(fire.operation_id, timeout=30)
    assert done.state == "succeeded" and done.schedule_id == schedule.id and done.labels == labels

    paused = client.pause_schedule(schedule.id)
    assert paused.paused and paused.next_fire_times == []
    triggered = client.trigger_schedule(schedule.id)
    assert triggered.schedule_id == schedule.id
    assert client.get_schedule(schedule.id).last_operation_id == triggered.id
    # A backfill of the seconds already fired starts nothing new.
    first_time = client.schedule_fires(schedule.id)[-1].fire_time
    assert client.backfill_schedule(schedule.id, first_time, first_time) == []
    changed = client.update_schedule(schedule.id, {"paused": False, "cron": "0 2 * * *"})
    assert not changed.paused and changed.cron == "0 2 * * *"
    with pytest.raises(errors.PreconditionFailed):
        client.update_schedule(schedule.id, {"paused": True}, if_match=schedule.etag)
    with pytest.raises(errors.InvalidInput):
        client.create_schedule("sleep", "61 * * * *")
    client.delete_schedule(schedule.id)
    with pytest.raises(errors.NotFound):
        client.get_schedule(schedule.id)
