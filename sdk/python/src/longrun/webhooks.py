"""Receiving Longrun's webhooks (Standard Webhooks, docs/api.md §5).

:func:`verify` checks a delivery's signature and age with the reference
``standardwebhooks`` library and returns the event; :class:`Deduper`
remembers the ``webhook-id`` values seen, because deliveries are at least
once. A delivery is a hint: fetch the operation for its state.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any, Dict, Mapping, Union

import standardwebhooks

from . import errors


class InvalidSignature(errors.LongrunError):
    """The delivery is not signed by the secret, or is too old or too new."""

    code = "invalid_signature"


def verify(headers: Mapping[str, str], body: Union[bytes, str], secret: str) -> Dict[str, Any]:
    """The event of a delivery whose signature verifies under ``secret``
    (the tenant's ``whsec_…``; during a rotation either secret verifies the
    delivery, which carries both signatures). Raises
    :class:`InvalidSignature` otherwise, including a timestamp more than
    five minutes from now (replays)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    payload = body.decode() if isinstance(body, bytes) else body
    try:
        event = standardwebhooks.Webhook(secret).verify(payload, lowered)
    except standardwebhooks.WebhookVerificationError as e:
        raise InvalidSignature(str(e)) from e
    if isinstance(event, dict):
        return event
    return dict(json.loads(payload))


class Deduper:
    """Which ``webhook-id`` values were seen (the last ``capacity`` of them).

    >>> seen = Deduper()
    >>> if seen.first_time(headers["webhook-id"]):
    ...     handle(event)

    In memory, per process; a receiver with many processes keeps the ids in
    its own database instead (a unique key on the id)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, webhook_id: str) -> bool:
        """True the first time ``webhook_id`` is seen, false after."""
        with self._lock:
            if webhook_id in self._seen:
                self._seen.move_to_end(webhook_id)
                return False
            self._seen[webhook_id] = None
            if len(self._seen) > self._capacity:
                self._seen.popitem(last=False)
            return True
