"""The Admin API, declared once: every operation the cluster's admin service carries out,
the permission it needs and on what, whether it takes a request id, and every REST
endpoint that reaches it.

Every side that serves or calls an operation reads its facts from here:

- the admin service (``actors.admin.service``) checks ``permission`` on ``scope``
  before it reads or changes anything (``Operation.scope`` says which argument names
  the namespace);
- the gateway (``actors.gateway.routes``) builds one route per ``Endpoint``, checks
  the same permission before it reads a body, calls the endpoint's ``operation``
  and hands it the request's ``Idempotency-Key`` when the operation takes a request id;
- the Admin Client API (``clients.admin_calls``, both clients) calls each operation with
  its arguments by parameter name: ``ScalableTopicsAdmin`` (``clients.admin``) with a request
  id when the operation takes one, ``AdminHttpClient`` (``clients.http``) as a request to its
  endpoint built from the endpoint's declared fields (and a fresh ``Idempotency-Key`` exactly
  when the operation takes one), which the gateway turns back into the same arguments.

An operation that waits on segment processes or walks storage declares a time-out of its
own (``Operation.timeout_s``): the gateway waits that long for it (or for its own
time-out, if that is longer) before answering 504, and ``AdminHttpClient`` waits a
little longer still, so that answer, not a dropped connection, is what a caller sees.

An operation's typed parameters are its handler's signature: the admin service checks
every argument against the parameter's annotation, strictly, before the handler runs
(``actors.admin.permits``); the constrained types the handlers share are below.

Adding an operation is one ``Operation`` here (and an ``Endpoint`` when REST reaches it),
its handler on the admin service, and its method on ``clients.admin_calls.AdminCalls``;
``tests/test_admin_api.py`` checks that every side agrees with this table.
This module is pure: both the gateway and the clients import it, and neither may
import the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import Field

from runtime.auth import Permission
from runtime.errors import (
    InvalidArgumentError,
    NotFoundError,
    SegmentNotFoundError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from runtime.layout import MAX_SPLIT_CHILDREN
from runtime.names import MAX_HASH
from runtime.rest import (
    ABORT_PATH,
    ASSIGNMENT_PATH,
    AUTH_PATH,
    CHECKPOINT_GROUP_PATH,
    CHECKPOINT_GROUP_RESET_PATH,
    CLEAR_BACKLOG_PATH,
    COMMIT_PATH,
    CONSUMER_PATH,
    CURSOR_PATH,
    FINISHED_PATH,
    LAYOUT_PATH,
    LIMITS_PATH,
    MERGE_PATH,
    NAMESPACE_PATH,
    NAMESPACE_POLICY_PATH,
    ORPHANED_STORAGE_PATH,
    POLICY_PATH,
    RECOVER_PATH,
    RELEASE_PATH,
    RESET_PATH,
    SEGMENT_PATH,
    SPLIT_PATH,
    STATS_PATH,
    STATUS_PATH,
    STORAGE_PATH,
    STREAM_ENDPOINT_PATH,
    STREAM_INITIAL_PATH,
    STREAM_LATEST_PATH,
    STREAM_RANGES_PATH,
    STREAM_SINK_FINISH_PATH,
    STREAM_SINK_OPEN_PATH,
    STREAM_SINK_REROUTE_PATH,
    STREAM_WRITE_PATH,
    SUBSCRIPTION_PATH,
    SUBSCRIPTIONS_PATH,
    TERMINATE_PATH,
    TOPIC_PATH,
    TRANSACTION_PATH,
    TRANSACTIONS_PATH,
    TXN_ACK_PATH,
)

# Constrained parameter types of the operations' handlers (``Annotated`` for pydantic).
SegmentId = Annotated[int, Field(ge=0)]
HashKey = Annotated[int, Field(ge=0, le=MAX_HASH)]  # a key's hash (``runtime.hashing``)
SplitParts = Annotated[int, Field(ge=2, le=MAX_SPLIT_CHILDREN)]  # a split into equal parts
Ordinal = Annotated[int, Field(ge=0)]  # a batch, partition or chunk number
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Scope(StrEnum):
    """What an operation's permission is checked on: the namespace named by its first
    argument (a ``tenant/namespace``, a ``topic://`` name or a segment's name), or every
    namespace (``*``) for an operation on the whole cluster."""

    NAMESPACE = "namespace"
    TOPIC = "topic"
    SEGMENT = "segment"
    CLUSTER = "cluster"
    CALLER = "caller"  # about the caller only: authenticated, no grant needed


@dataclass(frozen=True)
class Operation:
    """One operation of the admin service (its method of the same ``name``)."""

    name: str
    permission: Permission | None  # None: any authenticated caller (``Scope.CALLER``)
    scope: Scope
    # Takes a request id: the same id sent again (a retry) is applied once and answered
    # with the completed operation.
    request_id: bool = False
    # A delete: sent again after its answer was lost (an actor restarted), one of these
    # errors means the first attempt deleted the thing, and the retry is answered as done.
    gone: tuple[type[NotFoundError], ...] = ()
    # The longest the gateway waits for it before answering 504; ``None``: the gateway's
    # own time-out (``RAYTOPICS_REST_TIMEOUT_S``), as for every read.
    timeout_s: float | None = None

    def rest_timeout_s(self, gateway_s: float) -> float:
        """How long the gateway waits for it: its own time-out or the gateway's
        ``gateway_s``, whichever is longer (an operator may raise every time-out)."""
        return gateway_s if self.timeout_s is None else max(self.timeout_s, gateway_s)


@dataclass(frozen=True, eq=False)
class Endpoint:
    """One REST endpoint: what it is called, where it listens, which operation it runs
    (``None``: a meta endpoint of the gateway itself, open to all), and where each of
    the operation's arguments travels: the parameters its path names
    (``path_parameters``), JSON body fields (``body``: field -> parameter, or the whole
    body as one parameter, ``body_is``), query parameters (``query``), and arguments the
    endpoint itself fixes (``fixes``: it is its operation's endpoint for those values,
    as ``deleteOrphanedStorage`` is ``check_storage`` with ``delete`` true). The gateway
    turns a request into the call, and ``AdminHttpClient`` a call into the request, from
    these same declarations."""

    operation_id: str
    method: str
    path: str
    summary: str
    operation: str | None
    status: int = 200
    body: Mapping[str, str] = field(default_factory=dict)
    body_is: str | None = None
    query: Mapping[str, str] = field(default_factory=dict)
    fixes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def path_parameters(self) -> tuple[str, ...]:
        return path_parameters(self.path)

    def carries(self) -> frozenset[str]:
        """The operation's parameters a request to this endpoint gives a value."""
        sent = {*self.path_parameters, *self.body.values(), *self.query.values(), *self.fixes}
        return frozenset(sent | ({self.body_is} if self.body_is else set()))


# The operation parameters a REST path carries, and the path fields each one fills; a
# path names the most specific (a segment's fields include its topic's, and a topic's
# its namespace's).
PATH_PARAMETERS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "segment": ("tenant", "namespace", "topic", "descriptor"),
    "name": ("tenant", "namespace", "topic"),
    "namespace": ("tenant", "namespace"),
    "subscription": ("subscription",),
    "consumer": ("consumer",),
    "segment_id": ("segmentId",),
    "segment_id1": ("segmentId1",),
    "segment_id2": ("segmentId2",),
    "txn_id": ("txnId",),
})  # fmt: skip


def path_parameters(path: str) -> tuple[str, ...]:
    """The operation parameters whose values ``path``'s fields hold, most specific first."""
    fields = set(re.findall(r"{(\w+)}", path))
    found = []
    for parameter, filled in PATH_PARAMETERS.items():
        if fields.issuperset(filled):
            found.append(parameter)
            fields.difference_update(filled)
    return tuple(found)


_A, _L, _C, _P = Permission.ADMIN, Permission.LOOKUP, Permission.CONSUME, Permission.PRODUCE
_NS, _T, _S, _ALL = Scope.NAMESPACE, Scope.TOPIC, Scope.SEGMENT, Scope.CLUSTER
# Operations that start, stop or wake segment processes (or ask an object store whether
# a tier is usable) may take seconds each on a busy cluster; those that walk or rebuild
# a topic's whole storage, minutes.
_WAITS_S = 120.0
_WALKS_S = 600.0

# fmt: off
_OPERATIONS = (
    Operation("whoami", None, Scope.CALLER),
    # reads
    Operation("list_scalable_topics", _L, _NS),
    Operation("get_metadata", _L, _T),
    Operation("list_subscriptions", _L, _T),
    Operation("get_stats", _L, _T),
    Operation("topic_status", _L, _T),
    Operation("watch_layout", _L, _T),
    Operation("get_policy", _L, _T),
    Operation("get_namespace_policy", _L, _NS),
    Operation("get_namespace_limits", _L, _NS),
    # topic lifecycle and layout
    Operation("create_scalable_topic", _A, _T, request_id=True, timeout_s=_WAITS_S),
    Operation("delete_scalable_topic", _A, _T, gone=(TopicNotFoundError,), timeout_s=_WAITS_S),
    Operation("split_segment", _A, _T, request_id=True, timeout_s=_WAITS_S),
    Operation("merge_segments", _A, _T, request_id=True, timeout_s=_WAITS_S),
    Operation("recover_topic", _A, _T, request_id=True, timeout_s=_WALKS_S),
    # subscriptions (delete: admin, or consume for the caller's own subscription)
    Operation("create_subscription", _C, _T, request_id=True, timeout_s=_WAITS_S),
    Operation("delete_subscription", _C, _T, gone=(SubscriptionNotFoundError, TopicNotFoundError),
              timeout_s=_WAITS_S),
    Operation("reset_subscription", _C, _T, timeout_s=_WAITS_S),
    # a stream consumer outside Ray (actors.admin.consumer_service): membership and cursors;
    # a coordinator's host or a hibernated segment may have to start first
    Operation("register_consumer", _C, _T, timeout_s=_WAITS_S),
    Operation("poll_assignment", _C, _T),
    Operation("hand_back_segment", _C, _T, timeout_s=_WAITS_S),
    Operation("unregister_consumer", _C, _T, timeout_s=_WAITS_S),
    Operation("get_cursor", _C, _T, timeout_s=_WAITS_S),
    Operation("acknowledge_cumulative", _C, _T, timeout_s=_WAITS_S),
    Operation("ensure_checkpoint_group", _C, _T, timeout_s=_WAITS_S),
    Operation("reset_checkpoint_group", _C, _T, timeout_s=_WAITS_S),
    Operation("checkpoint_group", _C, _T, timeout_s=_WAITS_S),
    # policy and limits
    Operation("set_policy", _A, _T, timeout_s=_WAITS_S),
    Operation("set_namespace_policy", _A, _NS, timeout_s=_WAITS_S),
    Operation("set_namespace_limits", _A, _NS),
    # segments (low level)
    Operation("create_segment", _A, _S, timeout_s=_WAITS_S),
    Operation("terminate_segment", _A, _S, timeout_s=_WAITS_S),
    Operation("delete_segment", _A, _S, gone=(SegmentNotFoundError, TopicNotFoundError),
              timeout_s=_WAITS_S),
    # the cluster
    Operation("check_storage", _A, _ALL, timeout_s=_WALKS_S),
    Operation("auth_status", _A, _ALL),
    Operation("load_auth", _A, _ALL),
    Operation("disable_auth", _A, _ALL),
    # Spark and Ray Data: reads planned (streaming, snapshot), streaming writes, the records
    # of idempotent writes (runtime.sink_writes)
    Operation("stream_initial", _C, _T),
    Operation("stream_latest", _C, _T),
    Operation("stream_ranges", _C, _T),
    Operation("stream_endpoint", _L, _T),  # the data plane checks produce or consume
    Operation("plan_snapshot", _C, _T),
    Operation("stream_write", _P, _T),
    Operation("sink_open", _P, _T),
    Operation("sink_reroute", _P, _T),
    Operation("sink_finish", _P, _T),
    Operation("forget_write", _P, _T),
    # transactions (actors.admin.txn_service): a transaction's id is what its holder knows
    Operation("new_transaction", None, Scope.CALLER),
    Operation("get_transaction", None, Scope.CALLER),
    Operation("transaction_acknowledge", _C, _S),
    Operation("commit_transaction", None, Scope.CALLER, timeout_s=_WAITS_S),
    Operation("abort_transaction", None, Scope.CALLER, timeout_s=_WAITS_S),
    Operation("list_transactions", _A, _ALL),
    Operation("sweep_transactions", _A, _ALL),
)

_ENDPOINTS = (
    Endpoint("listScalableTopics", "GET", NAMESPACE_PATH,
             "List the scalable topics of a namespace", "list_scalable_topics"),
    Endpoint("createScalableTopic", "PUT", TOPIC_PATH, "Create a scalable topic",
             "create_scalable_topic", status=201,
             body={"numSegments": "num_segments", "properties": "properties"}),
    Endpoint("getMetadata", "GET", TOPIC_PATH, "Get the topic's segment DAG metadata",
             "get_metadata"),
    Endpoint("deleteScalableTopic", "DELETE", TOPIC_PATH, "Delete a topic and all its segments",
             "delete_scalable_topic", status=204),
    Endpoint("getStats", "GET", STATS_PATH,
             "Aggregated stats: segment counts, per-segment size, per-subscription backlog",
             "get_stats"),
    Endpoint("getStatus", "GET", STATUS_PATH,
             "Whether every segment of the topic has a running actor (a new topic's segments "
             "start in the background); waits up to waitS seconds for it", "topic_status",
             query={"waitS": "wait_s"}),
    Endpoint("watchLayout", "GET", LAYOUT_PATH,
             "The topic's segment layout once its epoch differs from knownEpoch (at once "
             "without one), waiting up to waitS seconds for a split, merge or delete: "
             "{\"layout\": null} when none came", "watch_layout",
             query={"knownEpoch": "known_epoch", "waitS": "wait_s"}),
    Endpoint("planStreamStart", "POST", STREAM_INITIAL_PATH,
             "A streaming query's first position (Spark's readStream; see docs/spark.md)",
             "stream_initial",
             body={"startingOffsets": "starting", "startingTimestampMs": "starting_time_ms"}),
    Endpoint("planStreamBatch", "POST", STREAM_LATEST_PATH,
             "The end position of the micro-batch starting at a position (a segment is read "
             "only after its parents were read to their end), the records it reads, those it "
             "would read uncapped, and the records each segment holds past it", "stream_latest"),
    Endpoint("getStreamRanges", "POST", STREAM_RANGES_PATH,
             "The offset ranges between two positions, with each segment's data plane address",
             "stream_ranges"),
    Endpoint("writeStreamChunk", "POST", STREAM_WRITE_PATH,
             "Store one chunk of a streaming sink's micro-batch partition, once however often "
             "it is replayed (idempotent per queryId, batchId, partitionId, chunk)",
             "stream_write"),
    Endpoint("openStreamSinkChunk", "POST", STREAM_SINK_OPEN_PATH,
             "Start storing one chunk of a streaming sink's micro-batch partition over the "
             "segments' data planes: where each of its records goes (parts by hash range, each "
             "one append under the chunk's producer id and a sequence), or null when the chunk "
             "was stored before (a replay)", "sink_open",
             body={"queryId": "query", "batchId": "batch", "partitionId": "partition",
                   "chunk": "chunk", "hashes": "hashes"}),
    Endpoint("rerouteStreamSinkPart", "POST", STREAM_SINK_REROUTE_PATH,
             "Give a part that its sealed segment refused to the segments owning its range now",
             "sink_reroute",
             body={"queryId": "query", "partitionId": "partition", "chunk": "chunk",
                   "recorded": "recorded", "part": "part", "hashes": "hashes"}),
    Endpoint("finishStreamSinkChunk", "POST", STREAM_SINK_FINISH_PATH,
             "Mark a chunk stored whole: a replay of it stores nothing", "sink_finish",
             body={"queryId": "query", "partitionId": "partition", "chunk": "chunk",
                   "recorded": "recorded"}),
    Endpoint("getSegmentEndpoint", "GET", STREAM_ENDPOINT_PATH,
             "Where a segment's data plane listens now (a client connecting or reconnecting)",
             "stream_endpoint"),
    Endpoint("listSubscriptions", "GET", SUBSCRIPTIONS_PATH, "List the topic's subscriptions",
             "list_subscriptions"),
    Endpoint("createSubscription", "PUT", SUBSCRIPTION_PATH,
             "Create a subscription on every segment of the topic", "create_subscription",
             status=204, body={"position": "position", "sessionGraceS": "session_grace_s"}),
    Endpoint("deleteSubscription", "DELETE", SUBSCRIPTION_PATH,
             "Delete a subscription from every segment of the topic (admin, or consume for "
             "one the caller's principal created)", "delete_subscription", status=204),
    Endpoint("resetSubscription", "POST", RESET_PATH,
             "Move a subscription to earliest, latest or a publish time on every segment "
             "(409 while stream consumers are registered)", "reset_subscription",
             body={"to": "to"}),
    Endpoint("clearBacklog", "POST", CLEAR_BACKLOG_PATH,
             "Acknowledge everything a subscription has not yet (a reset to latest)",
             "reset_subscription", fixes={"to": "latest"}),
    Endpoint("registerConsumer", "PUT", CONSUMER_PATH,
             "Join the subscription as this stream consumer (again within its grace period: "
             "with the same segments); answers the consumer's assignment", "register_consumer"),
    Endpoint("pollAssignment", "GET", ASSIGNMENT_PATH,
             "The consumer's assignment once its version differs from knownVersion, waiting "
             "up to waitS seconds ({\"assignment\": null} when none came); each poll is also "
             "the consumer's heartbeat", "poll_assignment",
             query={"knownVersion": "known_version", "waitS": "wait_s"}),
    Endpoint("releaseSegment", "POST", RELEASE_PATH,
             "Give a segment up (a rebalance took it), after acknowledging what was delivered "
             "from it", "hand_back_segment", status=204, body={"position": "position"},
             fixes={"finished": False}),
    Endpoint("finishSegment", "POST", FINISHED_PATH,
             "The consumer read and acknowledged a sealed segment to its end: its children "
             "may be handed out", "hand_back_segment", status=204, body={"position": "position"},
             fixes={"finished": True}),
    Endpoint("unregisterConsumer", "DELETE", CONSUMER_PATH,
             "Leave the subscription now: the other consumers rebalance at once",
             "unregister_consumer", status=204),
    Endpoint("getCursor", "GET", CURSOR_PATH,
             "The subscription's position in a segment: the first offset not acknowledged",
             "get_cursor"),
    Endpoint("acknowledgeCumulative", "POST", CURSOR_PATH,
             "Acknowledge a segment's messages up to offset, inclusive (a position already "
             "past it stays)", "acknowledge_cumulative", status=204, body={"offset": "offset"}),
    Endpoint("ensureCheckpointGroup", "PUT", CHECKPOINT_GROUP_PATH,
             "Make the checkpoint group on its first use (its consumers keep their positions "
             "themselves); 409 when the name is a subscription's", "ensure_checkpoint_group",
             status=204, body={"sessionGraceS": "session_grace_s"}),
    Endpoint("getCheckpointGroup", "GET", CHECKPOINT_GROUP_PATH,
             "The group's progress: the segments read to their end (finished) and which "
             "consumer holds which", "checkpoint_group"),
    Endpoint("resetCheckpointGroup", "POST", CHECKPOINT_GROUP_RESET_PATH,
             "The group's finished segments and positions become a checkpoint's (a consumer "
             "starting from it)", "reset_checkpoint_group", status=204,
             body={"finished": "finished", "positions": "positions"}),
    Endpoint("splitSegment", "POST", SPLIT_PATH,
             "Split an ACTIVE segment at its hash midpoint, or where a body's at says",
             "split_segment", body={"at": "at", "parts": "parts"}),
    Endpoint("mergeSegments", "POST", MERGE_PATH, "Merge two adjacent ACTIVE segments",
             "merge_segments", body={"moreSegmentIds": "more_segment_ids"}),
    Endpoint("getPolicy", "GET", POLICY_PATH, "Get the topic's autoscale and retention policy",
             "get_policy"),
    Endpoint("setPolicy", "PUT", POLICY_PATH,
             "Replace the topic's autoscale and retention policy", "set_policy", body_is="policy"),
    Endpoint("createSegment", "PUT", SEGMENT_PATH, "Create a segment topic (low level)",
             "create_segment", status=204, body={"subscriptions": "subscriptions"}),
    Endpoint("terminateSegment", "POST", TERMINATE_PATH,
             "Terminate (seal) a segment topic (low level)", "terminate_segment",
             query={"force": "force"}),
    Endpoint("deleteSegment", "DELETE", SEGMENT_PATH, "Delete a segment topic (low level)",
             "delete_segment", status=204, query={"force": "force"}),
    Endpoint("getNamespacePolicy", "GET", NAMESPACE_POLICY_PATH,
             "The policy a namespace's topics follow where their own policy sets nothing",
             "get_namespace_policy"),
    Endpoint("setNamespacePolicy", "PUT", NAMESPACE_POLICY_PATH,
             "Replace a namespace's default policy (each part applies where a topic sets none)",
             "set_namespace_policy", body_is="policy"),
    Endpoint("getNamespaceLimits", "GET", LIMITS_PATH,
             "The limits in force in a namespace (defaults plus its overrides)",
             "get_namespace_limits"),
    Endpoint("setNamespaceLimits", "PUT", LIMITS_PATH,
             "Override limits for a namespace (validated as a whole); returns those in force",
             "set_namespace_limits", body_is="limits"),
    Endpoint("recoverTopic", "POST", RECOVER_PATH,
             "Rebuild a topic whose metadata was lost from its storage (DAG, subscriptions, "
             "cursors)", "recover_topic", body={"incarnation": "incarnation"}),
    Endpoint("checkStorage", "GET", STORAGE_PATH,
             "Storage under the storage root that no live metadata names (needs admin on '*')",
             "check_storage", fixes={"delete": False}),
    Endpoint("deleteOrphanedStorage", "DELETE", ORPHANED_STORAGE_PATH,
             "Delete the storage no live metadata names; returns the report with what was "
             "deleted", "check_storage", fixes={"delete": True}),
    Endpoint("getAuthStatus", "GET", AUTH_PATH,
             "The cluster's authentication policy: principals, grants, 8 hex digits of each "
             "token's SHA-256, never a token (needs admin on '*')", "auth_status"),
    Endpoint("loadAuth", "PUT", AUTH_PATH,
             "Replace the authentication policy, validated whole (needs admin on '*'); returns "
             "it as getAuthStatus does. While no policy is stored this is refused (403): the "
             "first policy is the operator's, loaded from inside the cluster (raytopics auth "
             "load)", "load_auth", body_is="document"),
    Endpoint("newTransaction", "POST", TRANSACTIONS_PATH,
             "Begin a transaction (owner: fences that owner's transaction before it)",
             "new_transaction", status=201, body={"timeoutS": "timeout_s", "owner": "owner"}),
    Endpoint("listTransactions", "GET", TRANSACTIONS_PATH,
             "Every transaction not yet forgotten (needs admin on '*')", "list_transactions"),
    Endpoint("getTransaction", "GET", TRANSACTION_PATH, "A transaction's state",
             "get_transaction"),
    Endpoint("commitTransaction", "POST", COMMIT_PATH,
             "Commit: every message of the transaction becomes readable, its acknowledgements "
             "apply", "commit_transaction"),
    Endpoint("abortTransaction", "POST", ABORT_PATH,
             "Abort: none of the transaction's messages is ever read", "abort_transaction"),
    Endpoint("transactionAcknowledge", "POST", TXN_ACK_PATH,
             "An acknowledgement that applies when the transaction commits",
             "transaction_acknowledge",
             body={"subscription": "subscription", "offset": "offset",
                   "cumulative": "cumulative"}),
    Endpoint("disableAuth", "DELETE", AUTH_PATH,
             "Turn authentication off: anyone who reaches the API may do anything (needs admin "
             "on '*')", "disable_auth"),
    Endpoint("getOpenApi", "GET", "/openapi.json", "This API as an OpenAPI 3.1 document", None),
    Endpoint("health", "GET", "/healthz", "Liveness probe", None),
)
# fmt: on

OPERATIONS: Mapping[str, Operation] = MappingProxyType({op.name: op for op in _OPERATIONS})
ENDPOINTS: Mapping[str, Endpoint] = MappingProxyType({e.operation_id: e for e in _ENDPOINTS})


def operation(name: str) -> Operation:
    """The declared operation ``name``; an undeclared one is a programming error here."""
    try:
        return OPERATIONS[name]
    except KeyError:
        raise LookupError(f"{name!r} is not an Admin API operation (runtime.admin_api)") from None


def endpoint(operation_id: str) -> Endpoint:
    return ENDPOINTS[operation_id]


def endpoint_operation(point: Endpoint) -> Operation | None:
    """The operation an endpoint runs (``None`` for the gateway's meta endpoints)."""
    return None if point.operation is None else OPERATIONS[point.operation]


def split_hashes(at: int | Sequence[int] | None) -> int | list[int] | None:
    """A split's ``at`` as the clients send it: one hash, or a list (any sequence given)."""
    return at if at is None or isinstance(at, int) else list(at)


def merged_ids(first: int | Sequence[int], second: int | None, more: Sequence[int]) -> list[int]:
    """The segments of a merge as the clients take them, ``(4, 5, 6)`` or ``([4, 5, 6])``:
    at least two, else ``InvalidArgumentError``."""
    ids = [*first] if not isinstance(first, int) else [first]
    ids += [second] if second is not None else []
    ids += list(more)
    if len(ids) < 2 or (not isinstance(first, int) and (second is not None or more)):
        raise InvalidArgumentError(
            "merge_segments takes two or more segment ids, or one list of them, "
            f"got {first!r}, {second!r}, {list(more)!r}"
        )
    return ids


def endpoint_timeout_s(point: Endpoint, gateway_s: float) -> float:
    """How long the gateway (time-out ``gateway_s``) waits for a request to ``point``: its
    operation's own time-out when longer, else ``gateway_s`` (a meta endpoint's too)."""
    op = endpoint_operation(point)
    return gateway_s if op is None else op.rest_timeout_s(gateway_s)


def endpoint_for(operation_name: str, args: Mapping[str, Any]) -> Endpoint:
    """The REST endpoint for a call of ``operation_name`` with ``args``: of the
    operation's endpoints whose fixed arguments ``args`` agree with, the one fixing most
    (``LookupError`` when REST does not reach the operation with those arguments)."""
    fitting = [
        point
        for point in _ENDPOINTS
        if point.operation == operation_name
        and all(name in args and args[name] == value for name, value in point.fixes.items())
    ]
    if not fitting:
        raise LookupError(f"no REST endpoint carries {operation_name} with {dict(args)!r}")
    return max(fitting, key=lambda point: len(point.fixes))
