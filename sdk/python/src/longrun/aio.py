"""The asyncio client: :class:`AsyncClient`, the same calls as
:class:`longrun.Client` with ``await`` (the rules behind them are shared, in
``longrun._protocol``)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import IO, Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, TypeVar, Union

import httpx

from . import _protocol as p
from . import errors
from .client import DEFAULT_TIMEOUT, _answer
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


class AsyncClient:
    """A client of one Longrun server for asyncio code; see
    :class:`longrun.Client` for what each call does.

    >>> async with longrun.AsyncClient(url, key) as client:
    ...     op = await client.submit("export", {"rows": 1000})
    ...     op = await client.wait(op.id)
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        retry: Optional[p.RetryPolicy] = None,
        timeout: float = DEFAULT_TIMEOUT,
        http: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or p.RetryPolicy()
        self._timeout = timeout
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self.requests_sent = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def _url(self, path: str) -> str:
        return path if path.startswith("http") else self.base_url + path

    async def _send(self, request: p.Request) -> p.Answer:
        self.requests_sent += 1
        try:
            response = await self._http.request(
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

    async def _drive(self, flow: p.Flow[T]) -> T:
        step = next(flow)
        while True:
            answer: Optional[p.Answer] = None
            if isinstance(step, p.Sleep):
                await asyncio.sleep(step.seconds)
            else:
                answer = await self._send(step)
            try:
                step = flow.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    async def submit(
        self,
        kind: str,
        input: Any = None,
        *,
        idempotency_key: Optional[str] = None,
        wait: Optional[float] = None,
        **fields: Any,
    ) -> Operation:
        submitted = await self.submit_detailed(kind, input, idempotency_key=idempotency_key, wait=wait, **fields)
        return submitted.operation

    async def submit_detailed(
        self,
        kind: str,
        input: Any = None,
        *,
        idempotency_key: Optional[str] = None,
        wait: Optional[float] = None,
        **fields: Any,
    ) -> Submitted:
        return await self._drive(p.submit(kind, input, idempotency_key, fields, wait, self.retry))

    async def submit_batch(self, items: List[Dict[str, Any]]) -> List[p.BatchItem]:
        return await self._drive(p.submit_batch([dict(i) for i in items], self.retry))

    async def rerun(
        self,
        operation_id: str,
        *,
        idempotency_key: Optional[str] = None,
        from_checkpoint: Optional[bool] = None,
        **fields: Any,
    ) -> Operation:
        fields["from_checkpoint"] = from_checkpoint
        submitted = await self._drive(p.rerun(operation_id, idempotency_key, fields, self.retry))
        return submitted.operation

    async def get(self, operation_id: str) -> Operation:
        return await self._drive(p.get(operation_id, self.retry))

    async def wait(
        self,
        operation_id: str,
        *,
        timeout: Optional[float] = None,
        on_progress: Optional[Callable[[Operation], None]] = None,
    ) -> Operation:
        return await self._drive(p.wait(operation_id, timeout, on_progress, time.monotonic, self.retry))

    async def events(self, operation_id: str, *, last_event_id: Optional[str] = None) -> AsyncIterator[Operation]:
        failures = 0
        while True:
            request = p.events_request(operation_id, last_event_id)
            parser = p.SseParser()
            try:
                self.requests_sent += 1
                async with self._http.stream(
                    "GET",
                    self._url(request.path),
                    headers={**self._auth, **request.headers},
                    timeout=httpx.Timeout(self._timeout, read=None),
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        answer = _answer(response)
                        if answer.status < 500 and answer.status != 429:
                            raise answer.problem()
                        raise httpx.RemoteProtocolError(f"{answer.status}")
                    async for line in response.aiter_lines():
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
                await asyncio.sleep(self.retry.delay(failures))

    async def list(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        page_size: int = 100,
    ) -> AsyncIterator[Operation]:
        token: Optional[str] = None
        while True:
            page = await self.list_page(state=state, kind=kind, labels=labels, page_size=page_size, page_token=token)
            for operation in page.operations:
                yield operation
            if not page.next_page_token:
                return
            token = page.next_page_token

    async def list_page(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        page_size: int = 100,
        page_token: Optional[str] = None,
    ) -> Page:
        return await self._drive(p.list_page(state, kind, labels, page_size, page_token, self.retry))

    async def history(self, operation_id: str) -> List[HistoryEvent]:
        return await self._drive(p.history(operation_id, self.retry))

    async def deliveries(self, operation_id: str) -> List[Dict[str, Any]]:
        return await self._drive(p.deliveries(operation_id, self.retry))

    async def cancel(self, operation_id: str, *, reason: Optional[str] = None) -> Operation:
        return await self._drive(p.cancel(operation_id, reason, self.retry))

    async def pause(self, operation_id: str, *, if_match: Optional[str] = None) -> Operation:
        return await self.update(operation_id, {"desired_state": "paused"}, if_match=if_match)

    async def resume(self, operation_id: str, *, if_match: Optional[str] = None) -> Operation:
        return await self.update(operation_id, {"desired_state": "running"}, if_match=if_match)

    async def update(self, operation_id: str, changes: Dict[str, Any], *, if_match: Optional[str] = None) -> Operation:
        return await self._drive(p.update(operation_id, changes, if_match, self.retry))

    async def create_schedule(self, kind: str, cron: str, *, input: Any = None, **fields: Any) -> Schedule:
        body: Dict[str, Any] = {"kind": kind, "cron": cron, **fields}
        if input is not None:
            body["input"] = input
        return await self._drive(p.create_schedule(body))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._drive(p.get_schedule(schedule_id, self.retry))

    async def list_schedules(self) -> List[Schedule]:
        return await self._drive(p.list_schedules(self.retry))

    async def update_schedule(
        self, schedule_id: str, changes: Dict[str, Any], *, if_match: Optional[str] = None
    ) -> Schedule:
        return await self._drive(p.update_schedule(schedule_id, changes, if_match, self.retry))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return await self.update_schedule(schedule_id, {"paused": True})

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return await self.update_schedule(schedule_id, {"paused": False})

    async def delete_schedule(self, schedule_id: str) -> None:
        await self._drive(p.delete_schedule(schedule_id, self.retry))

    async def trigger_schedule(self, schedule_id: str) -> Operation:
        return await self._drive(p.trigger_schedule(schedule_id))

    async def backfill_schedule(self, schedule_id: str, start: str, end: str) -> List[ScheduleFire]:
        return await self._drive(p.backfill_schedule(schedule_id, start, end, self.retry))

    async def schedule_fires(self, schedule_id: str) -> List[ScheduleFire]:
        return await self._drive(p.schedule_fires(schedule_id, self.retry))

    async def result(self, operation_id: str) -> ResultResource:
        return await self._drive(p.result(operation_id, self.retry))

    async def download(
        self,
        operation_id: str,
        out: Union[str, os.PathLike[str], IO[bytes]],
        *,
        artifact: Optional[str] = None,
        on_bytes: Optional[Callable[[int, int], None]] = None,
    ) -> Downloaded:
        if isinstance(out, (str, os.PathLike)):
            with open(out, "wb") as f:
                return await self.download(operation_id, f, artifact=artifact, on_bytes=on_bytes)
        download = p.Download(self.retry, on_bytes)
        while True:
            # A fresh link each time: links are short-lived.
            resource = (await self.result(operation_id)).named(artifact)
            headers = download.headers_for(resource)
            if headers is None:
                break
            try:
                self.requests_sent += 1
                url = self._url(resource.download_url)
                async with self._http.stream("GET", url, headers={**self._auth, **headers}) as response:
                    if not download.accepts(response.status_code):
                        await response.aread()
                        raise _answer(response).problem()
                    async for chunk in response.aiter_bytes(p.CHUNK):
                        download.chunk(chunk, out)
            except httpx.TransportError:
                pass
            pause = download.broke()
            if pause is None:
                break
            await asyncio.sleep(pause)
        return download.result()

    async def upload(
        self,
        source: Union[str, os.PathLike[str], bytes],
        *,
        content_type: str = "application/octet-stream",
        on_bytes: Optional[Callable[[int, int], None]] = None,
    ) -> Upload:
        digest, total = p.file_digest(source)
        created = await self._drive(p.create_upload(content_type, p.sha256_digest_header(digest), self.retry))
        url = self._url(f"/v1/uploads/{created.id}")
        uploading = p.Uploading(source, total, self.retry, on_bytes)
        while True:

            async def body() -> AsyncIterator[bytes]:
                for chunk in uploading.chunks():
                    yield chunk

            try:
                self.requests_sent += 1
                response = await self._http.request(
                    "PATCH", url, headers={**self._auth, **uploading.headers()}, content=body(), timeout=None
                )
                answer = _answer(response)
            except httpx.TransportError as e:
                answer = p.Answer(0, {}, b"", e)
            pause = uploading.answered(answer)
            if pause is None:
                return Upload.from_json(answer.json())
            await asyncio.sleep(pause)
            uploading.offset, complete = await self._drive(p.upload_offset(created.id, self.retry))
            if complete:
                return await self.get_upload(created.id)

    async def get_upload(self, upload_id: str) -> Upload:
        return await self._drive(p.get_upload(upload_id, self.retry))
