"""The wire types, as plain dataclasses.

Each type reads the server's JSON with ``from_json`` and keeps the whole
body in ``raw``, so a field added by a newer server is never lost to an
older SDK. Field names are the server's (docs/api.md §3, §4); a test checks
them against the served ``/openapi.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

#: An operation's states; the last three are terminal.
STATES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class Progress:
    """How far the work is, as its worker last reported."""

    completed_units: Optional[float] = None
    total_units: Optional[float] = None
    unit: Optional[str] = None
    phase: Optional[str] = None
    details: Any = None
    updated_at: Optional[str] = None

    @property
    def fraction(self) -> Optional[float]:
        """``completed_units / total_units`` when both are known."""
        if self.completed_units is None or not self.total_units:
            return None
        return self.completed_units / self.total_units

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Progress:
        return cls(
            completed_units=_float(body.get("completed_units")),
            total_units=_float(body.get("total_units")),
            unit=_str(body.get("unit")),
            phase=_str(body.get("phase")),
            details=body.get("details"),
            updated_at=_str(body.get("updated_at")),
        )


@dataclass(frozen=True)
class Cost:
    units: float = 0.0
    max_units: Optional[float] = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Cost:
        return cls(
            units=_float(body.get("units")) or 0.0,
            max_units=_float(body.get("max_units")),
        )


@dataclass(frozen=True)
class OperationError:
    """Why a ``failed`` operation failed: decide on ``code``."""

    code: str
    message: str = ""
    retryable: bool = False

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> OperationError:
        return cls(
            code=str(body.get("code", "")),
            message=str(body.get("message", "")),
            retryable=bool(body.get("retryable", False)),
        )


@dataclass(frozen=True)
class Operation:
    """An operation's representation (``GET /v1/operations/{id}``)."""

    id: str
    kind: str
    state: str
    desired_state: str
    terminal: bool
    cancel_requested: bool
    version: int
    attempt: int
    created_at: str
    updated_at: str
    started_at: Optional[str] = None
    completed_at: Optional[str] = None
    deadline_at: Optional[str] = None
    expires_at: Optional[str] = None
    progress: Optional[Progress] = None
    cost: Cost = field(default_factory=Cost)
    result: Any = None
    error: Optional[OperationError] = None
    labels: Dict[str, str] = field(default_factory=dict)
    links: Dict[str, Optional[str]] = field(default_factory=dict)
    rerun_of: Optional[str] = None
    reruns: List[str] = field(default_factory=list)
    #: When it may start (RFC 3339); ``None``: as soon as a worker is free.
    not_before: Optional[str] = None
    #: 1–9, higher claimed first within its tenant.
    priority: int = 5
    #: The schedule (``sch_…``) this operation is a firing of.
    schedule_id: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def etag(self) -> str:
        """The ETag the server sends for this version (for ``If-Match``)."""
        return f'"{self.version}"'

    @property
    def value(self) -> Any:
        """The inline result value (``result.value``), if there is one."""
        if isinstance(self.result, dict):
            return self.result.get("value")
        return None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Operation:
        progress = body.get("progress")
        error = body.get("error")
        cost = body.get("cost")
        return cls(
            id=str(body["id"]),
            kind=str(body["kind"]),
            state=str(body["state"]),
            desired_state=str(body.get("desired_state", "running")),
            terminal=bool(body["terminal"]),
            cancel_requested=bool(body.get("cancel_requested", False)),
            version=int(body["version"]),
            attempt=int(body.get("attempt", 0)),
            created_at=str(body["created_at"]),
            updated_at=str(body.get("updated_at", body["created_at"])),
            started_at=_str(body.get("started_at")),
            completed_at=_str(body.get("completed_at")),
            deadline_at=_str(body.get("deadline_at")),
            expires_at=_str(body.get("expires_at")),
            progress=Progress.from_json(progress) if isinstance(progress, dict) else None,
            cost=Cost.from_json(cost) if isinstance(cost, dict) else Cost(),
            result=body.get("result"),
            error=OperationError.from_json(error) if isinstance(error, dict) else None,
            labels=dict(body.get("labels") or {}),
            links=dict(body.get("links") or {}),
            rerun_of=_str(body.get("rerun_of")),
            reruns=list(body.get("reruns") or []),
            not_before=_str(body.get("not_before")),
            priority=int(body.get("priority", 5)),
            schedule_id=_str(body.get("schedule_id")),
            raw=dict(body),
        )


@dataclass(frozen=True)
class Schedule:
    """A schedule (``GET /v1/schedules/{id}``): work submitted on a cadence."""

    id: str
    version: int
    paused: bool
    kind: str
    cron: str
    time_zone: str
    overlap: str
    catchup_window: int
    priority: int
    #: The next five firing times (RFC 3339); empty while paused.
    next_fire_times: List[str] = field(default_factory=list)
    input: Any = None
    labels: Dict[str, str] = field(default_factory=dict)
    last_operation_id: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def etag(self) -> str:
        """The ETag of this version (for ``If-Match``)."""
        return f'"{self.version}"'

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Schedule:
        return cls(
            id=str(body["id"]),
            version=int(body["version"]),
            paused=bool(body["paused"]),
            kind=str(body["kind"]),
            cron=str(body["cron"]),
            time_zone=str(body.get("time_zone", "UTC")),
            overlap=str(body.get("overlap", "skip")),
            catchup_window=int(body.get("catchup_window", 3600)),
            priority=int(body.get("priority", 5)),
            next_fire_times=list(body.get("next_fire_times") or []),
            input=body.get("input"),
            labels=dict(body.get("labels") or {}),
            last_operation_id=_str(body.get("last_operation_id")),
            raw=dict(body),
        )


@dataclass(frozen=True)
class ScheduleFire:
    """What one firing time became: ``started``, ``triggered``,
    ``backfilled``, ``buffered``, ``skipped``, ``missed`` or ``refused``."""

    fire_time: str
    decision: str
    operation_id: Optional[str] = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ScheduleFire:
        return cls(
            fire_time=str(body["fire_time"]),
            decision=str(body["decision"]),
            operation_id=_str(body.get("operation_id")),
        )


@dataclass(frozen=True)
class Submitted:
    """What a submission came back with."""

    operation: Operation
    #: The server answered with the operation an earlier attempt created.
    replayed: bool
    #: The key every attempt of this submission carried.
    idempotency_key: str


@dataclass(frozen=True)
class Page:
    """One page of ``GET /v1/operations``."""

    operations: List[Operation]
    next_page_token: Optional[str]


@dataclass(frozen=True)
class HistoryEvent:
    """One entry of an operation's audit trail."""

    version: int
    state: str
    type: str
    at: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> HistoryEvent:
        return cls(
            version=int(body["version"]),
            state=str(body["state"]),
            type=str(body["type"]),
            at=str(body["at"]),
            raw=dict(body),
        )


@dataclass(frozen=True)
class Artifact:
    """A stored result artifact with a freshly minted download link."""

    id: str
    content_type: str
    size_bytes: int
    sha256: str
    created_at: str
    expires_at: Optional[str]
    download_url: str
    download_expires_at: str

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Artifact:
        download = body.get("download") or {}
        return cls(
            id=str(body["id"]),
            content_type=str(body["content_type"]),
            size_bytes=int(body["size_bytes"]),
            sha256=str(body["sha256"]),
            created_at=str(body.get("created_at", "")),
            expires_at=_str(body.get("expires_at")),
            download_url=str(download.get("url", "")),
            download_expires_at=str(download.get("expires_at", "")),
        )


@dataclass(frozen=True)
class ResultResource:
    """``GET /v1/operations/{id}/result``: the default artifact and the named ones."""

    operation_id: str
    artifact: Optional[Artifact]
    artifacts: Dict[str, Artifact]

    def named(self, name: Optional[str]) -> Artifact:
        """The artifact called ``name`` (``None``: the default one)."""
        if name is None:
            if self.artifact is None:
                raise KeyError("the result has no default artifact")
            return self.artifact
        return self.artifacts[name]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ResultResource:
        named = body.get("artifacts") or {}
        return cls(
            operation_id=str(body["operation_id"]),
            artifact=Artifact.from_json(body) if "id" in body else None,
            artifacts={k: Artifact.from_json(v) for k, v in named.items()},
        )


@dataclass(frozen=True)
class Upload:
    """An uploaded input (``POST /v1/uploads``)."""

    id: str
    size_bytes: int
    complete: bool
    sha256: Optional[str]
    content_type: Optional[str]
    expires_at: Optional[str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Upload:
        return cls(
            id=str(body["id"]),
            size_bytes=int(body.get("size_bytes", 0)),
            complete=bool(body.get("complete", False)),
            sha256=_str(body.get("sha256")),
            content_type=_str(body.get("content_type")),
            expires_at=_str(body.get("expires_at")),
            raw=dict(body),
        )


@dataclass(frozen=True)
class Downloaded:
    """What a download wrote."""

    bytes: int
    sha256: str
    #: How often a broken connection was resumed with ``Range``.
    resumed: int


@dataclass(frozen=True)
class Task:
    """A leased task (``POST /v1/worker/claims``)."""

    operation_id: str
    kind: str
    input: Any
    attempt: int
    lease_token: str
    lease_expires_at: str
    deadline_at: Optional[str] = None
    budget: Optional[Dict[str, Any]] = None
    checkpoint: Any = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Task:
        return cls(
            operation_id=str(body["operation_id"]),
            kind=str(body["kind"]),
            input=body.get("input"),
            attempt=int(body["attempt"]),
            lease_token=str(body["lease_token"]),
            lease_expires_at=str(body["lease_expires_at"]),
            deadline_at=_str(body.get("deadline_at")),
            budget=body.get("budget"),
            checkpoint=body.get("checkpoint"),
        )
