"""The blocking client: :class:`Client`."""

from __future__ import annotations

import json
import os
import time
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    TypeVar,
    Union,
)

import httpx

from . import _protocol as p
from . import errors
from .models import (
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

#: Connect, write and pool timeouts; reads get more where a call long-polls.
DEFAULT_TIMEOUT = 30.0


def _answer(response: httpx.Response) -> p.Answer:
    return p.Answer(
        response.status_code,
        {k.lower(): v for k, v in response.headers.items()},
        response.content,
    )


class Client:
    """A client of one Longrun server, with one API key.

    Every call that changes something is safe to retry, and the client
    retries it by itself (``retry``): submissions and re-runs carry one
    idempotency key across every attempt, so a lost answer never creates a
    second operation; cancellation is idempotent; changes go under
    ``If-Match``. Refusals raise the :mod:`longrun.errors` class of their
    stable code.

    >>> with longrun.Client("http://127.0.0.1:8080", "lr_…") as client:
    ...     op = client.submit("export", {"rows": 1000})
    ...     op = client.wait(op.id)
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        retry: Optional[p.RetryPolicy] = None,
        timeout: float = DEFAULT_TIMEOUT,
        http: Optional[httpx.Client] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or p.RetryPolicy()
        self._timeout = timeout
        self._http = http or httpx.Client(timeout=timeout)
        self._auth = {"Authorization": f"Bearer {api_key}"}
        #: Requests sent (retries included), for tests and curiosity.
        self.requests_sent = 0

    # -- plumbing -------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _url(self, path: str) -> str:
        return path if path.startswith("http") else self.base_url + path

    def _send(self, request: p.Request) -> p.Answer:
        self.requests_sent += 1
        try:
            response = self._http.request(
                request.method,
                self._url(request.path),
                headers={**self._auth, **request.headers},
                json=request.json,
                params=request.params,
                timeout=request.timeout or self._timeout,
            )
        except httpx.TransportError as e:
            return p.Answer(0, {}, b"", e)
        return _answer(response)

    def _drive(self, flow: p.Flow[T]) -> T:
        step = next(flow)
        while True:
            answer: Optional[p.Answer] = None
            if isinstance(step, p.Sleep):
                time.sleep(step.seconds)
            else:
                answer = self._send(step)
            try:
                step = flow.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    # -- submitting -----------------------------------------------------

    def submit(
        self,
        kind: str,
        input: Any = None,
        *,
        idempotency_key: Optional[str] = None,
        wait: Optional[float] = None,
        **fields: Any,
    ) -> Operation:
        """Submits work of ``kind``: the accepted operation (``202``), or the
        one an earlier request with the same key created.

        ``fields`` are the submission's other fields (``callback``,
        ``deadline_seconds``, ``budget``, ``labels``, …), sent as given.
        ``idempotency_key`` names the *logical* request; without one the
        client makes one and reuses it for every retry of this call (never a
        new one per attempt). ``wait`` (seconds, ≤ 60) holds the request
        until the operation ends or the time passes.
        """
        return self.submit_detailed(kind, input, idempotency_key=idempotency_key, wait=wait, **fields).operation

    def submit_detailed(
        self,
        kind: str,
        input: Any = None,
        *,
        idempotency_key: Optional[str] = None,
        wait: Optional[float] = None,
        **fields: Any,
    ) -> Submitted:
        """As :meth:`submit`, with the key used and whether it was a replay."""
        return self._drive(p.submit(kind, input, idempotency_key, fields, wait, self.retry))

    def submit_batch(self, items: List[Dict[str, Any]]) -> List[p.BatchItem]:
        """Submits up to 1,000 submissions in one request. Each item is a
        dict of submission fields (``kind``, ``input``, …) and may name its
        ``idempotency_key``; the others get one before the first attempt.
        Answers in order: a :class:`~longrun.models.Submitted` or the
        :class:`~longrun.errors.LongrunError` that item was refused with."""
        return self._drive(p.submit_batch([dict(i) for i in items], self.retry))

    def rerun(
        self,
        operation_id: str,
        *,
        idempotency_key: Optional[str] = None,
        from_checkpoint: Optional[bool] = None,
        **fields: Any,
    ) -> Operation:
        """A new operation with the kind and input of ``operation_id``
        (``rerun_of`` links them); fields left out are the original's."""
        fields["from_checkpoint"] = from_checkpoint
        return self._drive(p.rerun(operation_id, idempotency_key, fields, self.retry)).operation

    # -- observing ------------------------------------------------------

    def get(self, operation_id: str) -> Operation:
        """The operation now."""
        return self._drive(p.get(operation_id, self.retry))

    def wait(
        self,
        operation_id: str,
        *,
        timeout: Optional[float] = None,
        on_progress: Optional[Callable[[Operation], None]] = None,
    ) -> Operation:
        """Blocks until the operation is terminal (or raises
        :class:`~longrun.errors.WaitTimeout` after ``timeout`` seconds),
        long-polling with ETags and pacing itself by ``Retry-After``.
        ``on_progress`` is called with every new version."""
        return self._drive(p.wait(operation_id, timeout, on_progress, time.monotonic, self.retry))

    def events(self, operation_id: str, *, last_event_id: Optional[str] = None) -> Iterator[Operation]:
        """The operation's server-sent events, one :class:`Operation` per
        version, until the terminal one; a broken stream is resumed from the
        last event seen (``Last-Event-ID``)."""
        failures = 0
        while True:
            request = p.events_request(operation_id, last_event_id)
            parser = p.SseParser()
            try:
                self.requests_sent += 1
                with self._http.stream(
                    "GET",
                    self._url(request.path),
                    headers={**self._auth, **request.headers},
                    timeout=httpx.Timeout(self._timeout, read=None),
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        answer = _answer(response)
                        if answer.status < 500 and answer.status != 429:
                            raise answer.problem()
                        raise httpx.RemoteProtocolError(f"{answer.status}")
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        event_id, _, data = event
                        failures = 0
                        last_event_id = event_id or last_event_id
                        operation = Operation.from_json(json.loads(data))
                        yield operation
                        if operation.terminal:
                            return
            except (httpx.TransportError, httpx.RemoteProtocolError) as e:
                failures += 1
                if failures >= self.retry.max_attempts:
                    raise errors.TransportError(f"the event stream broke: {e!r}") from e
                time.sleep(self.retry.delay(failures))
                continue
            # The stream ended without a terminal event: resume it.

    def list(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        page_size: int = 100,
    ) -> Iterator[Operation]:
        """Every operation of the tenant that matches, newest first, page by
        page (keyset pages: nothing is skipped or repeated while new work
        arrives)."""
        token: Optional[str] = None
        while True:
            page = self.list_page(state=state, kind=kind, labels=labels, page_size=page_size, page_token=token)
            yield from page.operations
            if not page.next_page_token:
                return
            token = page.next_page_token

    def list_page(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        page_size: int = 100,
        page_token: Optional[str] = None,
    ) -> Page:
        """One page of :meth:`list`."""
        return self._drive(p.list_page(state, kind, labels, page_size, page_token, self.retry))

    def history(self, operation_id: str) -> List[HistoryEvent]:
        """The operation's audit trail, oldest first."""
        return self._drive(p.history(operation_id, self.retry))

    def deliveries(self, operation_id: str) -> List[Dict[str, Any]]:
        """The operation's webhook delivery log."""
        return self._drive(p.deliveries(operation_id, self.retry))

    # -- changing -------------------------------------------------------

    def cancel(self, operation_id: str, *, reason: Optional[str] = None) -> Operation:
        """Asks for cancellation (idempotent): queued work ends at once,
        running work is asked of its worker (``cancel_requested``)."""
        return self._drive(p.cancel(operation_id, reason, self.retry))

    def pause(self, operation_id: str, *, if_match: Optional[str] = None) -> Operation:
        """Holds the operation back (``desired_state: paused``); a running
        one pauses when its worker saves a checkpoint."""
        return self.update(operation_id, {"desired_state": "paused"}, if_match=if_match)

    def resume(self, operation_id: str, *, if_match: Optional[str] = None) -> Operation:
        """Lets a paused operation run again."""
        return self.update(operation_id, {"desired_state": "running"}, if_match=if_match)

    def update(self, operation_id: str, changes: Dict[str, Any], *, if_match: Optional[str] = None) -> Operation:
        """``PATCH`` the operation (``deadline_seconds``, ``labels``,
        ``desired_state``) under ``If-Match``: ``if_match`` is the version
        (or ETag) the change is based on; without it the current one is read
        and a lost race is read and retried."""
        return self._drive(p.update(operation_id, changes, if_match, self.retry))

    # -- schedules ------------------------------------------------------

    def create_schedule(self, kind: str, cron: str, *, input: Any = None, **fields: Any) -> Schedule:
        """Creates a schedule (``time_zone``, ``overlap``, ``catchup_window``,
        ``labels``, ``callback``, ``deadline_seconds``, ``budget``,
        ``priority``, ``paused`` as keyword arguments). Sent once: a repeat
        after a lost answer would make a second schedule."""
        body: Dict[str, Any] = {"kind": kind, "cron": cron, **fields}
        if input is not None:
            body["input"] = input
        return self._drive(p.create_schedule(body))

    def get_schedule(self, schedule_id: str) -> Schedule:
        """The schedule, with its next five firing times."""
        return self._drive(p.get_schedule(schedule_id, self.retry))

    def list_schedules(self) -> List[Schedule]:
        """Every schedule of the tenant, oldest first."""
        return self._drive(p.list_schedules(self.retry))

    def update_schedule(self, schedule_id: str, changes: Dict[str, Any], *, if_match: Optional[str] = None) -> Schedule:
        """``PATCH`` the schedule under ``If-Match`` (read first when not given)."""
        return self._drive(p.update_schedule(schedule_id, changes, if_match, self.retry))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        """No firing until resumed."""
        return self.update_schedule(schedule_id, {"paused": True})

    def resume_schedule(self, schedule_id: str) -> Schedule:
        """Fires again, counting the next time from now."""
        return self.update_schedule(schedule_id, {"paused": False})

    def delete_schedule(self, schedule_id: str) -> None:
        """No further firing; its operations stay."""
        self._drive(p.delete_schedule(schedule_id, self.retry))

    def trigger_schedule(self, schedule_id: str) -> Operation:
        """Fires the schedule now; the firing's operation (sent once)."""
        return self._drive(p.trigger_schedule(schedule_id))

    def backfill_schedule(self, schedule_id: str, start: str, end: str) -> List[ScheduleFire]:
        """Fires the past times of ``[start, end]`` (RFC 3339) that have no
        operation yet; the firings it started."""
        return self._drive(p.backfill_schedule(schedule_id, start, end, self.retry))

    def schedule_fires(self, schedule_id: str) -> List[ScheduleFire]:
        """Recent firing times and what each became, newest first."""
        return self._drive(p.schedule_fires(schedule_id, self.retry))

    # -- results --------------------------------------------------------

    def result(self, operation_id: str) -> ResultResource:
        """The result's artifacts, each with a freshly signed download link."""
        return self._drive(p.result(operation_id, self.retry))

    def download(
        self,
        operation_id: str,
        out: Union[str, os.PathLike[str], IO[bytes]],
        *,
        artifact: Optional[str] = None,
        on_bytes: Optional[Callable[[int, int], None]] = None,
    ) -> Downloaded:
        """Streams the result artifact (or the named one) into ``out`` (a
        path or a binary file), resuming a broken connection with ``Range``
        and checking the bytes against the published SHA-256 (raises
        :class:`~longrun.errors.IntegrityError`)."""
        if isinstance(out, (str, os.PathLike)):
            with open(out, "wb") as f:
                return self.download(operation_id, f, artifact=artifact, on_bytes=on_bytes)
        download = p.Download(self.retry, on_bytes)
        while True:
            # A fresh link each time: links are short-lived.
            resource = self.result(operation_id).named(artifact)
            headers = download.headers_for(resource)
            if headers is None:
                break
            try:
                self.requests_sent += 1
                url = self._url(resource.download_url)
                with self._http.stream("GET", url, headers={**self._auth, **headers}) as response:
                    if not download.accepts(response.status_code):
                        response.read()
                        raise _answer(response).problem()
                    for chunk in response.iter_bytes(p.CHUNK):
                        download.chunk(chunk, out)
            except httpx.TransportError:
                pass
            pause = download.broke()
            if pause is None:
                break
            time.sleep(pause)
        return download.result()

    # -- uploads --------------------------------------------------------

    def upload(
        self,
        source: Union[str, os.PathLike[str], bytes],
        *,
        content_type: str = "application/octet-stream",
        on_bytes: Optional[Callable[[int, int], None]] = None,
    ) -> Upload:
        """Uploads a file (a path, or bytes) as an input for later
        submissions (``input.upload``), resumably: a broken connection
        resumes from the offset the server kept (``HEAD``, then ``PATCH``
        from there). The SHA-256 goes along, so the server refuses a file
        that changed while it was sent."""
        digest, total = p.file_digest(source)
        created = self._drive(p.create_upload(content_type, p.sha256_digest_header(digest), self.retry))
        url = self._url(f"/v1/uploads/{created.id}")
        uploading = p.Uploading(source, total, self.retry, on_bytes)
        while True:
            try:
                self.requests_sent += 1
                response = self._http.request(
                    "PATCH",
                    url,
                    headers={**self._auth, **uploading.headers()},
                    content=uploading.chunks(),
                    timeout=None,
                )
                answer = _answer(response)
            except httpx.TransportError as e:
                answer = p.Answer(0, {}, b"", e)
            pause = uploading.answered(answer)
            if pause is None:
                return Upload.from_json(answer.json())
            time.sleep(pause)
            uploading.offset, complete = self._drive(p.upload_offset(created.id, self.retry))
            if complete:
                return self.get_upload(created.id)

    def get_upload(self, upload_id: str) -> Upload:
        return self._drive(p.get_upload(upload_id, self.retry))
