"""What ends a call or refuses a message: backend errors and refused clients as gRPC statuses.

A policy table, kept out of the trio handlers: each `BackendError.reason` the backends give
(`mop.messaging`, `mop.backends.*`) answers with the status a gRPC client acts on the same way
a Pulsar client acts on the matching ServerError (retry later, give up, fix the request).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from mop.messaging import BackendError
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.security.identity import AuthenticationError, AuthFailure

_BY_REASON: Final[Mapping[str, StatusCode]] = MappingProxyType(
    {
        # The producer name is taken, or an exclusive producer holds the topic.
        "producer_busy": StatusCode.ALREADY_EXISTS,
        # An exclusive subscription has its consumer; a subscription of another type.
        "consumer_busy": StatusCode.FAILED_PRECONDITION,
        "subscription_mismatch": StatusCode.FAILED_PRECONDITION,
        # Another producer took the topic over: this one may not come back.
        "producer_fenced": StatusCode.ABORTED,
        "quota_exceeded": StatusCode.RESOURCE_EXHAUSTED,
        "backlog_quota_exceeded": StatusCode.RESOURCE_EXHAUSTED,
        "too_large": StatusCode.RESOURCE_EXHAUSTED,
        # A broker over its memory high-water mark: try again later.
        "overloaded": StatusCode.RESOURCE_EXHAUSTED,
        "incompatible_schema": StatusCode.FAILED_PRECONDITION,
        "closed": StatusCode.UNAVAILABLE,
        "unavailable": StatusCode.UNAVAILABLE,
        "storage_error": StatusCode.UNAVAILABLE,
        "not_found": StatusCode.NOT_FOUND,
        "invalid_topic": StatusCode.INVALID_ARGUMENT,
        "not_authorized": StatusCode.PERMISSION_DENIED,
        "not_supported": StatusCode.FAILED_PRECONDITION,
    }
)

# What a refused client is told (the log says why: the client must not learn which part of
# its credentials was wrong).
REFUSED: Final = "unable to authenticate"


def status_of(exc: BackendError) -> StatusCode:
    """The status that answers a failed backend call (UNKNOWN for a reason without one)."""
    return _BY_REASON.get(exc.reason, StatusCode.UNKNOWN)


def backend_status(exc: BackendError) -> GrpcError:
    return GrpcError(status_of(exc), str(exc))


def refused_status(exc: AuthenticationError) -> GrpcError:
    """UNAUTHENTICATED for a client the processor did not admit, PERMISSION_DENIED for a
    banned one (it proved who it is, or it need not; it may not come in)."""
    if exc.failure is AuthFailure.BANNED:
        return GrpcError(StatusCode.PERMISSION_DENIED, "the client is banned")
    return GrpcError(StatusCode.UNAUTHENTICATED, REFUSED)


__all__ = ["REFUSED", "backend_status", "refused_status", "status_of"]
