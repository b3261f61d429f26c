"""Errors, one class per stable problem code.

Every refusal of the server is an ``application/problem+json`` body with a
stable ``code`` (docs/api.md §6). The SDK raises the subclass of
:class:`LongrunError` named after that code, so callers catch what they mean::

    try:
        client.cancel(op_id)
    except longrun.errors.OperationNotCancellable:
        ...

Decide on the class (or ``err.code``), never on the English ``detail``. A
code this version of the SDK does not know yet is raised as
:class:`LongrunError` itself, with its ``code`` intact.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional


class LongrunError(Exception):
    """Base of every error the SDK raises.

    ``code`` is the server's stable problem code (or an SDK-side code such as
    ``transport`` for :class:`TransportError`); ``status`` the HTTP status
    (0 when there was no answer); ``retry_after`` the seconds the server
    asked to wait, when it said.
    """

    code: str = "unknown"

    def __init__(
        self,
        detail: str = "",
        *,
        code: Optional[str] = None,
        status: int = 0,
        title: str = "",
        request_id: str = "",
        operation_id: Optional[str] = None,
        retryable: bool = False,
        retry_after: Optional[float] = None,
        problem: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(detail or title or (code or type(self).code))
        if code is not None:
            self.code = code
        self.detail = detail
        self.status = status
        self.title = title
        self.request_id = request_id
        self.operation_id = operation_id
        self.retryable = retryable
        self.retry_after = retry_after
        self.problem: Mapping[str, Any] = problem or {}

    def __str__(self) -> str:
        where = f" ({self.status})" if self.status else ""
        return f"{self.code}{where}: {self.detail or self.title}"


class TransportError(LongrunError):
    """No usable answer arrived (connection refused, reset or timed out) after
    the retries the call was allowed."""

    code = "transport"


class UnexpectedResponse(LongrunError):
    """An answer the SDK cannot read: not the promised shape."""

    code = "unexpected_response"


class IntegrityError(LongrunError):
    """Downloaded bytes do not match the published SHA-256."""

    code = "integrity"


class WaitTimeout(LongrunError):
    """``wait`` ran out of its ``timeout`` before the operation ended."""

    code = "wait_timeout"


class InvalidRequest(LongrunError):
    code = "invalid_request"


class IdempotencyKeyRequired(LongrunError):
    code = "idempotency_key_required"


class Unauthenticated(LongrunError):
    code = "unauthenticated"


class Forbidden(LongrunError):
    code = "forbidden"


class NotFound(LongrunError):
    code = "not_found"


class MethodNotAllowed(LongrunError):
    code = "method_not_allowed"


class IdempotencyKeyReused(LongrunError):
    code = "idempotency_key_reused"


class OperationNotCancellable(LongrunError):
    code = "operation_not_cancellable"


class LeaseLost(LongrunError):
    """The task's lease moved on: this worker's outcome for it is refused."""

    code = "lease_lost"


class Gone(LongrunError):
    code = "gone"


class ResultExpired(LongrunError):
    code = "result_expired"


class PreconditionFailed(LongrunError):
    code = "precondition_failed"


class PreconditionRequired(LongrunError):
    code = "precondition_required"


class PayloadTooLarge(LongrunError):
    code = "payload_too_large"


class UnsupportedMediaType(LongrunError):
    code = "unsupported_media_type"


class InvalidInput(LongrunError):
    code = "invalid_input"


class UnsupportedKind(LongrunError):
    code = "unsupported_kind"


class InvalidCallbackUrl(LongrunError):
    code = "invalid_callback_url"


class QuotaExceeded(LongrunError):
    """The tenant's quota is full; ``retry_after`` says when to try again."""

    code = "quota_exceeded"


class RateLimited(LongrunError):
    code = "rate_limited"


class Internal(LongrunError):
    code = "internal"


class TemporarilyUnavailable(LongrunError):
    code = "temporarily_unavailable"


class DigestMismatch(LongrunError):
    code = "digest_mismatch"


class UploadOffsetMismatch(LongrunError):
    code = "upload_offset_mismatch"


class InputNotKept(LongrunError):
    code = "input_not_kept"


class IntentConflict(LongrunError):
    code = "intent_conflict"


class NotPausable(LongrunError):
    code = "not_pausable"


#: Every server problem code and its class (the server's ``ProblemCode``
#: schema in ``/openapi.json``; a test keeps the two equal).
BY_CODE: dict[str, type[LongrunError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        IdempotencyKeyRequired,
        Unauthenticated,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        IdempotencyKeyReused,
        OperationNotCancellable,
        LeaseLost,
        Gone,
        ResultExpired,
        PreconditionFailed,
        PreconditionRequired,
        PayloadTooLarge,
        UnsupportedMediaType,
        InvalidInput,
        UnsupportedKind,
        InvalidCallbackUrl,
        QuotaExceeded,
        RateLimited,
        Internal,
        TemporarilyUnavailable,
        DigestMismatch,
        UploadOffsetMismatch,
        InputNotKept,
        IntentConflict,
        NotPausable,
    )
}


def from_problem(status: int, body: Any, retry_after: Optional[float] = None) -> LongrunError:
    """The error for a refusal: ``body`` is the decoded problem+json (or
    anything else, for an answer that is not one)."""
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        return UnexpectedResponse(f"{status} without a problem body", status=status, retry_after=retry_after)
    code: str = body["code"]
    cls = BY_CODE.get(code, LongrunError)
    return cls(
        str(body.get("detail", "")),
        code=code,
        status=status,
        title=str(body.get("title", "")),
        request_id=str(body.get("request_id", "")),
        operation_id=body.get("operation_id"),
        retryable=bool(body.get("retryable", False)),
        retry_after=retry_after,
        problem=body,
    )
