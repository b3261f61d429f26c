"""Longrun's Python SDK: clients that submit and observe long-running work,
and workers that run it.

- :class:`Client` / :class:`AsyncClient`: submit (safe to retry: one
  idempotency key per logical request), wait, stream events, cancel, pause,
  re-run, list, download results, upload inputs.
- :class:`Worker`: runs handlers for kinds over the worker protocol, with
  heartbeats, fencing, cancel/pause, checkpoints and batched outcomes.
- :mod:`longrun.webhooks`: verify and dedupe webhook deliveries.
- :mod:`longrun.errors`: one exception class per stable problem code.
"""

from . import errors, webhooks
from ._protocol import RetryPolicy
from .aio import AsyncClient
from .client import Client
from .models import (
    Artifact,
    Cost,
    Downloaded,
    HistoryEvent,
    Operation,
    OperationError,
    Page,
    Progress,
    ResultResource,
    Schedule,
    ScheduleFire,
    Submitted,
    Task,
    Upload,
)
from .worker import Cancelled, LeaseLost, PauseRequested, TaskContext, TaskFailed, Worker

__version__ = "0.1.0"

__all__ = [
    "Artifact",
    "AsyncClient",
    "Cancelled",
    "Client",
    "Cost",
    "Downloaded",
    "HistoryEvent",
    "LeaseLost",
    "Operation",
    "OperationError",
    "Page",
    "PauseRequested",
    "Progress",
    "ResultResource",
    "RetryPolicy",
    "Schedule",
    "ScheduleFire",
    "Submitted",
    "Task",
    "TaskContext",
    "TaskFailed",
    "Upload",
    "Worker",
    "errors",
    "webhooks",
]
