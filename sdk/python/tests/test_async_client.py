"""The asyncio client against a real server (the calls share their rules
with the blocking client; these check the async plumbing of each)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import uuid

import pytest

import longrun
from conftest import Server
from longrun import errors


async def test_async_client_end_to_end(server: Server) -> None:
    async with longrun.AsyncClient(server.url, server.client_key) as client:
        ops = await asyncio.gather(*(client.submit("sleep", {"duration_ms": 100, "steps": 2}) for _ in range(5)))
        done = await asyncio.gather(*(client.wait(op.id) for op in ops))
        assert all(o.state == "succeeded" for o in done)

        streamed = [o async for o in client.events(ops[0].id)]
        assert streamed[-1].terminal

        labels = {"t": uuid.uuid4().hex[:12]}
        mine = {(await client.submit("py.idle", {"i": i}, labels=labels)).id for i in range(3)}
        assert {o.id async for o in client.list(labels=labels, page_size=1)} == mine

        one = next(iter(mine))
        assert (await client.pause(one)).state == "paused"
        assert (await client.resume(one)).state == "queued"
        assert (await client.cancel(one)).state == "cancelled"
        assert [e.type for e in await client.history(one)][-1] == "cancelled"

        with pytest.raises(errors.NotFound):
            await client.get("op_" + "b" * 29)
        with pytest.raises(errors.WaitTimeout):
            await client.wait(next(iter(mine - {one})), timeout=1)

        batch = await client.submit_batch([{"kind": "py.idle"}, {"kind": "nope.nope"}])
        assert isinstance(batch[0], longrun.Submitted) and isinstance(batch[1], errors.UnsupportedKind)

        export = await client.submit("export", {"rows": 500, "format": "jsonl"}, wait=30)
        assert export.state == "succeeded"
        buffer = io.BytesIO()
        got = await client.download(export.id, buffer)
        assert hashlib.sha256(buffer.getvalue()).hexdigest() == got.sha256

        upload = await client.upload(b"a,b\n1,2\n", content_type="text/csv")
        assert (await client.get_upload(upload.id)).complete

        again = await client.rerun(export.id)
        assert again.rerun_of == export.id
