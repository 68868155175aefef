"""Typed errors of the whole system.

Every error carries a stable machine-readable ``code`` and the HTTP status the
admin gateway answers with, so Python callers, REST clients and the CLI see the
same classification. Errors cross Ray actor boundaries, so every class keeps
its constructor arguments in ``args`` and pickles cleanly.
"""

from __future__ import annotations


class ScalableTopicsError(Exception):
    """Base of every error this system raises on purpose."""

    code = "error"
    http_status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (_rebuild, (type(self), self.__dict__.copy()))

    def to_dict(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}


def _rebuild(cls: type[ScalableTopicsError], state: dict) -> ScalableTopicsError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message", ""))
    err.__dict__.update(state)
    return err


# --- 400: the request itself is malformed -----------------------------------


class InvalidRequestError(ScalableTopicsError):
    code = "invalid_request"
    http_status = 400


class InvalidNameError(InvalidRequestError):
    code = "invalid_name"


class InvalidArgumentError(InvalidRequestError):
    code = "invalid_argument"


def is_integer(value: object, minimum: int, maximum: int | None = None) -> bool:
    """Whether ``value`` is an ``int`` from ``minimum`` to ``maximum``, the check before
    an ``InvalidArgumentError``. Never a bool, though Python counts one as an int:
    ``True`` given as a count, a port or an id is a caller's mistake, not a 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return minimum <= value and (maximum is None or value <= maximum)


class InvalidLayoutError(InvalidRequestError):
    """A segment DAG that breaks an invariant (gap, overlap, dangling link)."""

    code = "invalid_layout"


class LimitExceededError(InvalidRequestError):
    """Beyond a limit in force in the namespace. Raised where input is checked, hence an
    ``InvalidRequestError``, but answered 409 over REST: the same request succeeds once
    the namespace's limit is raised, so it conflicts with state, not with the schema."""

    code = "limit_exceeded"
    http_status = 409


# --- 404: the thing asked about does not exist -------------------------------


class NotFoundError(ScalableTopicsError):
    code = "not_found"
    http_status = 404


class TopicNotFoundError(NotFoundError):
    code = "topic_not_found"


class SegmentNotFoundError(NotFoundError):
    code = "segment_not_found"


class SubscriptionNotFoundError(NotFoundError):
    code = "subscription_not_found"


class ConsumerNotRegisteredError(NotFoundError):
    """The consumer's session is gone (expired or closed): it must register again."""

    code = "consumer_not_registered"


class TransactionNotFoundError(NotFoundError):
    """No transaction has this id (never begun, or finished and forgotten)."""

    code = "transaction_not_found"


class KeyNotFoundError(NotFoundError):
    code = "key_not_found"


class StorageNotFoundError(NotFoundError):
    """No stored incarnation of a topic (or not the one asked for) under the storage root."""

    code = "storage_not_found"


# --- 409: the request conflicts with the current state -----------------------


class ConflictError(ScalableTopicsError):
    code = "conflict"
    http_status = 409


class AlreadyExistsError(ConflictError):
    code = "already_exists"


class TopicAlreadyExistsError(AlreadyExistsError):
    code = "topic_exists"


class SubscriptionAlreadyExistsError(AlreadyExistsError):
    code = "subscription_exists"


class SegmentNotActiveError(ConflictError):
    """The segment exists but is SEALED, so it cannot be split or merged."""

    code = "segment_not_active"


class SegmentsNotAdjacentError(ConflictError):
    code = "segments_not_adjacent"


class SegmentTooNarrowError(ConflictError):
    """A one-wide hash range has no midpoint to split at."""

    code = "segment_too_narrow"


class BadVersion(ConflictError):
    """A compare-and-swap lost its race: the stored version moved on."""

    code = "bad_version"


class StaleEpochError(ConflictError):
    """A fenced request carried a controller epoch older than one already seen."""

    code = "stale_epoch"


class SegmentTerminated(ConflictError):
    """The segment is sealed: appends are refused forever, re-route to children."""

    code = "segment_terminated"

    def __init__(self, message: str, segment_id: int | None = None) -> None:
        super().__init__(message)
        self.segment_id = segment_id


class OutOfOrderSequenceError(ConflictError):
    """A producer's batch arrived, and stayed, ahead of a predecessor that never came."""

    code = "out_of_order_sequence"


class TransactionNotOpenError(ConflictError):
    """A transaction asked to take a message or an acknowledgement, or to commit, after
    it was decided: committed or aborted, timed out, or fenced by a newer transaction of
    its owner. The message says which."""

    code = "transaction_not_open"


class TransactionConflictError(ConflictError):
    """A message acknowledged in a transaction is acknowledged in another one that is
    not decided yet (Pulsar's pending-ack conflict): only one of them may take it."""

    code = "transaction_conflict"


class OperationInProgressError(ConflictError):
    code = "operation_in_progress"


class AmbiguousStorageError(ConflictError):
    """Storage of several incarnations of one topic name exists: the caller must pick one."""

    code = "ambiguous_storage"

    def __init__(self, message: str, incarnations: list[str] | None = None) -> None:
        super().__init__(message)
        self.incarnations = list(incarnations or [])


class InconsistentRequestError(ConflictError):
    """Valid field by field, yet its fields, or the state they would produce, contradict
    each other (a batch limit below the message limit, minSegments above maxSegments,
    a policy nobody could administer): what no request schema can state."""

    code = "inconsistent"


class InsufficientCapacityError(ConflictError):
    """The segment actors an operation would start do not fit in the cluster."""

    code = "insufficient_capacity"


class NotEnoughNodesError(InsufficientCapacityError):
    """A replication factor above the nodes that may hold the topic's segments, one
    replica each (or a cluster without a storage root per node, where replicas would
    share one disk): the message says how many nodes there are."""

    code = "not_enough_nodes"


class TierRefusedError(ConflictError):
    """A policy's tier this cluster does not allow (``RAYTOPICS_TIER_URIS``) or cannot use
    (unreachable, not writable, credentials refused): the request is well formed, the
    cluster's configuration or its object store says no."""

    code = "tier_refused"


class UnrecoverableStorageError(ConflictError):
    """What a topic's storage holds does not make a layout metadata could be rebuilt from."""

    code = "unrecoverable_storage"


# --- 503: something that must be served is not -------------------------------


class UnavailableError(ScalableTopicsError):
    code = "unavailable"
    http_status = 503


class UnavailableSegmentsError(UnavailableError):
    """A read could not reach segments that the metadata DAG says must be served."""

    code = "unavailable_segments"

    def __init__(self, message: str, segment_ids: list[int] | None = None) -> None:
        super().__init__(message)
        self.segment_ids = sorted(segment_ids or [])


class TopicNotReadyError(UnavailableError):
    """Some of a topic's segments have no running actor yet (``wait_until_ready`` gave
    up waiting); ``readiness`` is the state it last saw."""

    code = "not_ready"

    def __init__(self, message: str, readiness: dict | None = None) -> None:
        super().__init__(message)
        self.readiness = readiness or {}


class RayUnreachableError(UnavailableError):
    """No Ray cluster answers where a client was told to look (``address=`` or
    ``RAY_ADDRESS``); the message says which and where."""

    code = "ray_unreachable"


class RequestTimeoutError(UnavailableError):
    """The REST gateway gave up on a request after its time-out; a change it asked for
    may still complete (read the resource to see)."""

    code = "timeout"
    http_status = 504


class SendTimeoutError(UnavailableError):
    """A message could not be stored within the producer's send timeout."""

    code = "send_timeout"


class TlsError(UnavailableError):
    """A segment's data plane could not be reached securely: one side speaks TLS and the
    other does not, or the server's certificate is not trusted (or not for its address)."""

    code = "tls_error"


class UnseenSendFailuresError(UnavailableError):
    """A producer closed while sends had failed that no caller looked at (their futures'
    ``result()``, ``exception()`` or a done-callback): raised by ``close()`` so that
    lost messages never pass unnoticed."""

    code = "send_failed"

    def __init__(self, message: str, failed: int = 0) -> None:
        super().__init__(message)
        self.failed = failed


class NotEnoughReplicasError(UnavailableError):
    """Fewer replicas of a segment answer than a decision needs: an append not held by
    the ack quorum in time (not acknowledged; a retry is stored once), or an election
    that could not fence enough replicas."""

    code = "not_enough_replicas"


class NotLeaderError(UnavailableError):
    """A producer or reader reached a replica of a segment that does not lead it now;
    clients look the segment up again and reach its leader."""

    code = "not_leader"


class ClientClosedError(ScalableTopicsError):
    code = "closed"
    http_status = 409


class ProducerQueueFullError(ScalableTopicsError):
    """The producer's in-flight byte budget is used up and it was told not to block."""

    code = "producer_queue_full"
    http_status = 429


# --- 401/403: authentication and authorization --------------------------------


class UnauthenticatedError(ScalableTopicsError):
    code = "unauthenticated"
    http_status = 401


class UnauthorizedError(ScalableTopicsError):
    code = "forbidden"
    http_status = 403


def _error_classes() -> tuple[dict[str, type[ScalableTopicsError]], dict[int, type]]:
    """Every error class by its ``code``, and the broad class of each HTTP status."""
    by_code: dict[str, type[ScalableTopicsError]] = {ScalableTopicsError.code: ScalableTopicsError}
    pending = [ScalableTopicsError]
    while pending:
        for sub in pending.pop().__subclasses__():
            by_code.setdefault(sub.code, sub)
            pending.append(sub)
    by_status: dict[int, type] = {}
    for cls in ScalableTopicsError.__subclasses__():  # the first declared is the broad one
        by_status.setdefault(cls.http_status, cls)
    return by_code, by_status


def error_from_code(code: str | None, message: str, http_status: int = 500) -> ScalableTopicsError:
    """Rebuild the typed error a remote peer (REST, the data plane) reported by code.

    An unknown code (a newer peer) falls back to the broad class of the status,
    so callers catching ``NotFoundError`` or ``ConflictError`` keep working.
    """
    by_code, by_status = _error_classes()
    cls = by_code.get(code or "") or by_status.get(http_status, ScalableTopicsError)
    return cls(message)
