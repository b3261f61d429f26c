"""The calls of the client API, written once for the sync and async clients.

Each call is a *flow*: a generator that yields the next step — a
:class:`Request` to send or a :class:`Sleep` — and receives the
:class:`Answer` (or ``None`` after a sleep), until it returns the call's
value. :class:`longrun.Client` drives flows with blocking I/O,
:class:`longrun.AsyncClient` with ``await``; the rules (which answers are
retried, with which key, what a 304 or a 412 means) live only here.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
from dataclasses import dataclass, field
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Generator,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    TypeVar,
    Union,
)
from urllib.parse import quote

from . import errors
from .models import (
    Artifact,
    Downloaded,
    HistoryEvent,
    Operation,
    Page,
    ResultResource,
    Schedule,
    ScheduleFire,
    Submitted,
    Upload,
)

T = TypeVar("T")

#: Longest a single long-poll asks the server to hold (the server's bound).
LONG_POLL_SECONDS = 60


@dataclass
class Request:
    method: str
    path: str
    headers: Dict[str, str] = field(default_factory=dict)
    json: Any = None
    params: Optional[Dict[str, str]] = None
    #: Seconds the whole request may take (long-polls need more than the default).
    timeout: Optional[float] = None


@dataclass
class Sleep:
    seconds: float


@dataclass
class Answer:
    """An answer, or (``status == 0``) the transport error instead of one."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    error: Optional[BaseException] = None

    def header(self, name: str) -> Optional[str]:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise errors.UnexpectedResponse(
                f"{self.status} with a body that is not JSON: {e}", status=self.status
            ) from e

    def retry_after(self) -> Optional[float]:
        value = self.header("retry-after")
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None

    def problem(self) -> errors.LongrunError:
        try:
            body = json.loads(self.body)
        except ValueError:
            body = None
        return errors.from_problem(self.status, body, self.retry_after())


Step = Union[Request, Sleep]
Flow = Generator[Step, Optional[Answer], T]


@dataclass(frozen=True)
class RetryPolicy:
    """How calls are retried: up to ``max_attempts`` in all, waiting the
    server's ``Retry-After`` when it gives one, else a random delay between
    zero and ``base_delay`` doubled per attempt (capped at ``max_delay``)."""

    max_attempts: int = 8
    base_delay: float = 0.1
    max_delay: float = 20.0

    def delay(self, attempt: int) -> float:
        cap = min(self.max_delay, self.base_delay * (2 ** min(attempt, 20)))
        return random.uniform(0, cap)


def new_idempotency_key() -> str:
    """A fresh key: 128 random bits (one per *logical* request)."""
    return "lrp-" + secrets.token_hex(16)


def _retryable(answer: Answer) -> bool:
    return answer.status == 0 or answer.status == 429 or answer.status >= 500


def send(request: Request, retry: RetryPolicy) -> Flow[Answer]:
    """Sends ``request`` until a 2xx/3xx answer, a refusal not worth
    retrying, or the attempts run out; then returns the answer or raises.

    Only for requests that are safe to repeat: reads, idempotent commands,
    and writes whose idempotency key or ``If-Match`` settles a repeat. An
    attempt with no answer may or may not have been applied; the repeat
    carries the same key, so it is applied once either way.
    """
    attempt = 0
    while True:
        answer = yield request
        assert answer is not None
        if answer.status and answer.status < 400:
            return answer
        if not _retryable(answer) or attempt + 1 >= retry.max_attempts:
            if answer.status == 0:
                raise errors.TransportError(
                    f"{request.method} {request.path}: {answer.error!r} (after {attempt + 1} attempts)"
                ) from answer.error
            raise answer.problem()
        hint = answer.retry_after() if answer.status else None
        yield Sleep(hint if hint is not None else retry.delay(attempt))
        attempt += 1


def _op_path(operation_id: str, tail: str = "") -> str:
    return f"/v1/operations/{quote(operation_id, safe='')}{tail}"


def submission_body(kind: str, input: Any, fields: Mapping[str, Any]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"kind": kind}
    if input is not None:
        body["input"] = input
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


def _submitted(answer: Answer, key: str) -> Submitted:
    return Submitted(
        operation=Operation.from_json(answer.json()),
        replayed=answer.header("idempotent-replayed") == "true",
        idempotency_key=key,
    )


def submit(
    kind: str,
    input: Any,
    key: Optional[str],
    fields: Mapping[str, Any],
    wait: Optional[float],
    retry: RetryPolicy,
) -> Flow[Submitted]:
    """``POST /v1/operations``: one key for every attempt of this call."""
    key = key or new_idempotency_key()
    headers = {"Idempotency-Key": key}
    timeout = None
    if wait:
        headers["Prefer"] = f"wait={int(min(wait, LONG_POLL_SECONDS))}"
        timeout = min(wait, LONG_POLL_SECONDS) + 30
    request = Request("POST", "/v1/operations", headers, submission_body(kind, input, fields), timeout=timeout)
    answer = yield from send(request, retry)
    return _submitted(answer, key)


def rerun(operation_id: str, key: Optional[str], fields: Mapping[str, Any], retry: RetryPolicy) -> Flow[Submitted]:
    key = key or new_idempotency_key()
    body = {k: v for k, v in fields.items() if v is not None}
    request = Request("POST", _op_path(operation_id, "/reruns"), {"Idempotency-Key": key}, body)
    answer = yield from send(request, retry)
    return _submitted(answer, key)


BatchItem = Union[Submitted, errors.LongrunError]


def submit_batch(items: List[Dict[str, Any]], retry: RetryPolicy) -> Flow[List[BatchItem]]:
    """``POST /v1/operations/batch``; every item gets its key before the first
    attempt, so a retried batch replays what was accepted."""
    keys = []
    for item in items:
        item.setdefault("idempotency_key", new_idempotency_key())
        keys.append(str(item["idempotency_key"]))
    answer = yield from send(Request("POST", "/v1/operations/batch", json={"operations": items}), retry)
    results = answer.json().get("results")
    if not isinstance(results, list) or len(results) != len(items):
        raise errors.UnexpectedResponse("the batch answer does not match the request")
    out: List[BatchItem] = []
    for result, key in zip(results, keys):
        status = int(result.get("status", 0))
        if status < 300 and isinstance(result.get("operation"), dict):
            out.append(
                Submitted(
                    Operation.from_json(result["operation"]),
                    bool(result.get("replayed", False)),
                    key,
                )
            )
        else:
            out.append(errors.from_problem(status, result.get("problem")))
    return out


def get(operation_id: str, retry: RetryPolicy) -> Flow[Operation]:
    answer = yield from send(Request("GET", _op_path(operation_id)), retry)
    return Operation.from_json(answer.json())


def wait(
    operation_id: str,
    timeout: Optional[float],
    on_progress: Optional[Callable[[Operation], None]],
    clock: Callable[[], float],
    retry: RetryPolicy,
) -> Flow[Operation]:
    """Until the operation is terminal: long-polls with the ETag it has
    (each 200 is a new version), or sleeps the server's ``Retry-After`` when
    the server does not hold the request. ``on_progress`` sees every new
    version."""
    give_up = None if timeout is None else clock() + timeout
    etag: Optional[str] = None
    while True:
        hold = LONG_POLL_SECONDS
        if give_up is not None:
            hold = int(max(0, min(hold, give_up - clock())))
        headers = {"Prefer": f"wait={hold}"} if hold > 0 else {}
        if etag is not None:
            headers["If-None-Match"] = etag
        answer = yield from send(Request("GET", _op_path(operation_id), headers, timeout=hold + 30), retry)
        if answer.status != 304:
            etag = answer.header("etag")
            operation = Operation.from_json(answer.json())
            if on_progress is not None:
                on_progress(operation)
            if operation.terminal:
                return operation
        if give_up is not None and clock() >= give_up:
            raise errors.WaitTimeout(f"{operation_id} did not end within {timeout} s")
        if answer.header("preference-applied") is None or hold == 0:
            pause = answer.retry_after() or 1.0
            if give_up is not None:
                pause = max(0.0, min(pause, give_up - clock()))
            yield Sleep(pause)


def cancel(operation_id: str, reason: Optional[str], retry: RetryPolicy) -> Flow[Operation]:
    body = {"reason": reason} if reason is not None else None
    answer = yield from send(Request("PUT", _op_path(operation_id, "/cancellation"), json=body), retry)
    return Operation.from_json(answer.json())


def update(operation_id: str, changes: Dict[str, Any], if_match: Optional[str], retry: RetryPolicy) -> Flow[Operation]:
    """``PATCH`` under ``If-Match``: ``if_match`` is the version the caller
    based the change on; without one, the current version is read first and
    a change that raced another is read and sent again (a few times)."""
    for attempt in range(retry.max_attempts):
        if if_match is not None:
            etag = if_match if if_match.startswith('"') else f'"{if_match}"'
        else:
            current = yield from get(operation_id, retry)
            if all(current.raw.get(k) == v for k, v in changes.items()):
                return current  # already so (e.g. a repeat after a lost answer)
            etag = current.etag
        request = Request("PATCH", _op_path(operation_id), {"If-Match": etag}, changes)
        try:
            answer = yield from send(request, retry)
        except errors.PreconditionFailed:
            if if_match is not None or attempt + 1 >= retry.max_attempts:
                raise
            continue
        return Operation.from_json(answer.json())
    raise AssertionError("unreachable")


def list_page(
    state: Optional[str],
    kind: Optional[str],
    labels: Optional[Mapping[str, str]],
    page_size: int,
    page_token: Optional[str],
    retry: RetryPolicy,
) -> Flow[Page]:
    params: Dict[str, str] = {"page_size": str(page_size)}
    if state:
        params["state"] = state
    if kind:
        params["kind"] = kind
    if labels:
        # One label filter per request is what the server takes.
        ((name, value),) = labels.items()
        params["label"] = f"{name}:{value}"
    if page_token:
        params["page_token"] = page_token
    answer = yield from send(Request("GET", "/v1/operations", params=params), retry)
    body = answer.json()
    return Page(
        [Operation.from_json(o) for o in body.get("operations", [])],
        body.get("next_page_token"),
    )


# -- schedules ----------------------------------------------------------

#: A creation or trigger is sent once: a repeat after a lost answer would
#: make a second schedule (or firing). Reads and ``If-Match`` changes retry.
ONCE = RetryPolicy(max_attempts=1)


def _schedule_path(schedule_id: str, tail: str = "") -> str:
    return f"/v1/schedules/{quote(schedule_id, safe='')}{tail}"


def create_schedule(body: Dict[str, Any]) -> Flow[Schedule]:
    answer = yield from send(Request("POST", "/v1/schedules", json=body), ONCE)
    return Schedule.from_json(answer.json())


def get_schedule(schedule_id: str, retry: RetryPolicy) -> Flow[Schedule]:
    answer = yield from send(Request("GET", _schedule_path(schedule_id)), retry)
    return Schedule.from_json(answer.json())


def list_schedules(retry: RetryPolicy) -> Flow[List[Schedule]]:
    """Every schedule of the tenant, oldest first, page by page."""
    schedules: List[Schedule] = []
    token: Optional[str] = None
    while True:
        path = "/v1/schedules" + (f"?page_token={quote(token, safe='')}" if token else "")
        answer = yield from send(Request("GET", path), retry)
        body = answer.json()
        schedules.extend(Schedule.from_json(s) for s in body.get("schedules", []))
        token = body.get("next_page_token")
        if not token:
            return schedules


def update_schedule(
    schedule_id: str, changes: Dict[str, Any], if_match: Optional[str], retry: RetryPolicy
) -> Flow[Schedule]:
    """``PATCH`` under ``If-Match``, as :func:`update` does for operations
    (a firing moves the version too, so a lost race is read and retried)."""
    for attempt in range(retry.max_attempts):
        if if_match is not None:
            etag = if_match if if_match.startswith('"') else f'"{if_match}"'
        else:
            current = yield from get_schedule(schedule_id, retry)
            etag = current.etag
        request = Request("PATCH", _schedule_path(schedule_id), {"If-Match": etag}, changes)
        try:
            answer = yield from send(request, retry)
        except errors.PreconditionFailed:
            if if_match is not None or attempt + 1 >= retry.max_attempts:
                raise
            continue
        return Schedule.from_json(answer.json())
    raise AssertionError("unreachable")


def delete_schedule(schedule_id: str, retry: RetryPolicy) -> Flow[None]:
    yield from send(Request("DELETE", _schedule_path(schedule_id)), retry)
    return None


def trigger_schedule(schedule_id: str) -> Flow[Operation]:
    answer = yield from send(Request("POST", _schedule_path(schedule_id, "/trigger")), ONCE)
    return Operation.from_json(answer.json())


def backfill_schedule(schedule_id: str, start: str, end: str, retry: RetryPolicy) -> Flow[List[ScheduleFire]]:
    """Safe to repeat: each time's firing key finds the operation it made."""
    body = {"start": start, "end": end}
    answer = yield from send(Request("POST", _schedule_path(schedule_id, "/backfill"), json=body), retry)
    return [ScheduleFire.from_json(f) for f in answer.json().get("fires", [])]


def schedule_fires(schedule_id: str, retry: RetryPolicy) -> Flow[List[ScheduleFire]]:
    answer = yield from send(Request("GET", _schedule_path(schedule_id, "/fires")), retry)
    return [ScheduleFire.from_json(f) for f in answer.json().get("fires", [])]


def history(operation_id: str, retry: RetryPolicy) -> Flow[List[HistoryEvent]]:
    answer = yield from send(Request("GET", _op_path(operation_id, "/history")), retry)
    return [HistoryEvent.from_json(e) for e in answer.json().get("events", [])]


def deliveries(operation_id: str, retry: RetryPolicy) -> Flow[List[Dict[str, Any]]]:
    answer = yield from send(Request("GET", _op_path(operation_id, "/deliveries")), retry)
    return list(answer.json().get("deliveries", []))


def result(operation_id: str, retry: RetryPolicy) -> Flow[ResultResource]:
    answer = yield from send(Request("GET", _op_path(operation_id, "/result")), retry)
    return ResultResource.from_json(answer.json())


def get_upload(upload_id: str, retry: RetryPolicy) -> Flow[Upload]:
    answer = yield from send(Request("GET", f"/v1/uploads/{quote(upload_id, safe='')}"), retry)
    return Upload.from_json(answer.json())


def create_upload(content_type: str, repr_digest: str, retry: RetryPolicy) -> Flow[Upload]:
    """An empty, incomplete upload: its URL is known before a byte is sent,
    so a cut connection resumes. (Retrying the creation may leave an unused
    empty upload behind; it expires with ``--upload-retention``.)"""
    headers = {
        "Upload-Complete": "?0",
        "Content-Type": content_type,
        "Repr-Digest": repr_digest,
    }
    answer = yield from send(Request("POST", "/v1/uploads", headers), retry)
    return Upload.from_json(answer.json())


def upload_offset(upload_id: str, retry: RetryPolicy) -> Flow[Tuple[int, bool]]:
    """Where the server's copy of an upload ends, and whether it is complete."""
    answer = yield from send(Request("HEAD", f"/v1/uploads/{quote(upload_id, safe='')}"), retry)
    offset = answer.header("upload-offset")
    if offset is None:
        raise errors.UnexpectedResponse("HEAD of the upload has no Upload-Offset")
    return int(offset), answer.header("upload-complete") == "?1"


class SseParser:
    """Server-sent events, line by line (the parts Longrun's stream uses)."""

    def __init__(self) -> None:
        self._id: Optional[str] = None
        self._event = "message"
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Tuple[Optional[str], str, str]]:
        """One line without its newline; an event ``(id, type, data)`` when
        the line ends one."""
        if line == "":
            if not self._data:
                self._event = "message"
                return None
            event = (self._id, self._event, "\n".join(self._data))
            self._event, self._data = "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def events_request(operation_id: str, last_event_id: Optional[str]) -> Request:
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return Request("GET", _op_path(operation_id, "/events"), headers)


def sha256_digest_header(digest: bytes) -> str:
    import base64

    return f"sha-256=:{base64.b64encode(digest).decode()}:"


class Download:
    """A resumable, SHA-256-checked download's bookkeeping, shared by both
    clients (which only move the bytes): what to ask next, what a chunk
    adds, whether a broken stream may be resumed, and the verdict."""

    def __init__(self, retry: RetryPolicy, on_bytes: Optional[Callable[[int, int], None]]) -> None:
        self._retry = retry
        self._on_bytes = on_bytes
        self._hasher = hashlib.sha256()
        self._expected: Optional[str] = None
        self._total = 0
        self.written = 0
        self.resumed = 0

    def headers_for(self, artifact: Artifact) -> Optional[Dict[str, str]]:
        """The headers of the next request for ``artifact`` (freshly read,
        with a fresh link), or ``None`` when every byte has arrived."""
        if self._expected is not None and self._expected != artifact.sha256:
            raise errors.UnexpectedResponse("the result changed during the download")
        self._expected, self._total = artifact.sha256, artifact.size_bytes
        if self.written >= self._total:
            return None
        return {"Range": f"bytes={self.written}-"} if self.written else {}

    def accepts(self, status: int) -> bool:
        """Whether an answer of ``status`` carries the bytes asked for."""
        return (status == 200 and self.written == 0) or status == 206

    def chunk(self, data: bytes, out: IO[bytes]) -> None:
        self._hasher.update(data)
        out.write(data)
        self.written += len(data)
        if self._on_bytes is not None:
            self._on_bytes(self.written, self._total)

    def broke(self) -> Optional[float]:
        """After an attempt: ``None`` if it is complete, else how long to
        wait before resuming (raises once the attempts run out)."""
        if self.written >= self._total:
            return None
        self.resumed += 1
        if self.resumed >= self._retry.max_attempts:
            raise errors.TransportError(f"the download broke {self.resumed} times")
        return self._retry.delay(self.resumed)

    def result(self) -> Downloaded:
        actual = self._hasher.hexdigest()
        if actual != self._expected:
            raise errors.IntegrityError(f"the download's SHA-256 is {actual}, the result's {self._expected}")
        return Downloaded(self.written, actual, self.resumed)


Source = Union[str, "os.PathLike[str]", bytes]

#: Bytes read or sent at a time by downloads and uploads.
CHUNK = 256 * 1024


def file_digest(source: Source) -> Tuple[bytes, int]:
    """The SHA-256 and size of a path's or of bytes' contents."""
    if isinstance(source, bytes):
        return hashlib.sha256(source).digest(), len(source)
    hasher = hashlib.sha256()
    size = 0
    with open(source, "rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.digest(), size


class Uploading:
    """A resumable upload's bookkeeping, shared by both clients: the
    headers and bytes of each `PATCH` from the offset the server kept, and
    what an answer means (done, refused, or resume)."""

    def __init__(
        self,
        source: Source,
        total: int,
        retry: RetryPolicy,
        on_bytes: Optional[Callable[[int, int], None]],
    ) -> None:
        self._source = source
        self._total = total
        self._retry = retry
        self._on_bytes = on_bytes
        self.offset = 0
        self.resumed = 0

    def headers(self) -> Dict[str, str]:
        return {
            "Upload-Offset": str(self.offset),
            "Upload-Complete": "?1",
            "Content-Type": "application/partial-upload",
            "Content-Length": str(self._total - self.offset),
        }

    def chunks(self) -> Iterator[bytes]:
        """The bytes from the current offset on, reporting progress."""
        sent = start = self.offset
        if isinstance(self._source, bytes):
            source = self._source
            pieces: Iterator[bytes] = (source[i : i + CHUNK] for i in range(start, self._total, CHUNK))
        else:
            pieces = _read_from(self._source, start)
        for piece in pieces:
            sent += len(piece)
            if self._on_bytes is not None:
                self._on_bytes(sent, self._total)
            yield piece

    def answered(self, answer: Answer) -> Optional[float]:
        """``None`` when ``answer`` completed the upload; else how long to
        wait before asking the server where its copy ends (a refusal that a
        resume cannot mend raises)."""
        if 200 <= answer.status < 300:
            return None
        if answer.status and answer.status not in (409, 429) and answer.status < 500:
            raise answer.problem()
        self.resumed += 1
        if self.resumed >= self._retry.max_attempts:
            raise errors.TransportError(f"the upload broke {self.resumed} times")
        return self._retry.delay(self.resumed)


def _read_from(path: Union[str, os.PathLike[str]], start: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        f.seek(start)
        while chunk := f.read(CHUNK):
            yield chunk
