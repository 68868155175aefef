"""The REST gateway's route table: one ``Route`` per endpoint, and what each one calls.

``ROUTES`` drives the router and request validation (``actors.gateway.server``) and
``/openapi.json`` (``actors.gateway.openapi``), so the three cannot drift apart.
An action gets the request's validated inputs and a ``call`` that runs an admin
service method as the requester; it decides nothing itself.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import ray
from pydantic import BaseModel

from actors.gateway.documents import (
    HEALTH,
    OBJECT,
    STRINGS,
    AuthDocument,
    CreateSegmentBody,
    CreateSubscriptionBody,
    CreateTopicBody,
    DeleteSegmentQuery,
    NamespaceLimits,
    NamespaceLimitsBody,
    NoBody,
    NoQuery,
    Query,
    RecoverBody,
    ResetSubscriptionBody,
    StatusQuery,
    StreamInitialBody,
    StreamLatestBody,
    StreamRangesBody,
    StreamWriteBody,
    TerminateResult,
    TerminateSegmentQuery,
    TopicStatus,
)
from actors.gateway.openapi import build_openapi
from runtime.auth import (
    AuthPolicy,
    Permission,
)
from runtime.layout import ScalableTopicMetadata
from runtime.names import SegmentName, TopicName
from runtime.operations import CompletedOperation
from runtime.policy import TopicPolicy
from runtime.rest import (
    AUTH_PATH,
    CLEAR_BACKLOG_PATH,
    LIMITS_PATH,
    MERGE_PATH,
    NAMESPACE_PATH,
    NAMESPACE_POLICY_PATH,
    ORPHANED_STORAGE_PATH,
    POLICY_PATH,
    RECOVER_PATH,
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
    STREAM_WRITE_PATH,
    SUBSCRIPTION_PATH,
    SUBSCRIPTIONS_PATH,
    TERMINATE_PATH,
    TOPIC_PATH,
)
from storage.metadata import metadata_durability

# --- the route table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """A request's validated inputs, handed to a route's action."""

    path: Mapping[str, Any]
    body: Any
    query: Any
    time_left_s: float  # until the gateway's time-out answers for the action
    request_id: str  # the caller's Idempotency-Key, else one made for this request

    @property
    def namespace(self) -> str:
        return f"{self.path['tenant']}/{self.path['namespace']}"

    @property
    def topic(self) -> str:
        return str(topic_of(self.path))

    @property
    def segment(self) -> str:
        return str(SegmentName.from_descriptor(topic_of(self.path), self.path["descriptor"]))


def topic_of(path: Mapping[str, str]) -> TopicName:
    return TopicName(path["tenant"], path["namespace"], path["topic"])


class Service(Protocol):
    """What the routes call: ``actors.admin.caller.AdminServiceCaller``."""

    async def call(self, method: str, *args: Any, credential: str | None, **kwargs: Any) -> Any:
        """Run the service's ``method`` as the holder of ``credential``."""


# call(method, *args, **kwargs): the admin service's method, as the requester
Call = Callable[..., Awaitable[Any]]
Action = Callable[[Call, Params], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One endpoint: how to call the service, what it accepts, what it answers."""

    method: str
    path: str
    operation_id: str
    summary: str
    action: Action
    status: int = 200
    body: type[BaseModel] = NoBody
    body_required: bool = False
    query: type[Query] = NoQuery
    returns: type[BaseModel] | dict[str, Any] | None = None
    errors: tuple[int, ...] = (400, 404, 503)
    tag: str = "scalable"
    permission: Permission | None = Permission.ADMIN  # None: open to all (meta endpoints)
    idempotent: bool = False  # takes an Idempotency-Key: the same key is applied once


_MUTATION_ERRORS = (400, 404, 409, 503)


async def _create_topic(call: Call, p: Params) -> dict[str, Any]:
    return await call("create_scalable_topic", p.topic, p.body.num_segments, p.body.properties)


async def _status(call: Call, p: Params) -> dict[str, Any]:
    """A long poll kept well inside the time-out, so the answer (ready or not) arrives."""
    return await call("topic_status", p.topic, min(p.query.wait_s, p.time_left_s / 2))


async def _stream_initial(call: Call, p: Params) -> dict[str, Any]:
    return await call(
        "stream_initial", p.topic, p.body.starting_offsets, p.body.starting_timestamp_ms
    )


async def _stream_latest(call: Call, p: Params) -> dict[str, Any]:
    b = p.body
    until = b.until.model_dump() if b.until is not None else None
    return await call(
        "stream_latest", p.topic, b.start.model_dump(), b.max_messages, until, b.fail_on_data_loss
    )


async def _stream_ranges(call: Call, p: Params) -> dict[str, Any]:
    b = p.body
    return await call(
        "stream_ranges", p.topic, b.start.model_dump(), b.end.model_dump(), b.fail_on_data_loss
    )


async def _stream_write(call: Call, p: Params) -> dict[str, Any]:
    b = p.body
    records = [(r.key, base64.b64decode(r.value), r.properties) for r in b.records]
    return await call(
        "stream_write", p.topic, b.query_id, b.batch_id, b.partition_id, b.chunk, records
    )


async def _set_limits(call: Call, p: Params) -> dict[str, int]:
    return await call("set_namespace_limits", p.namespace, p.body.model_dump(exclude_none=True))


async def _terminate(call: Call, p: Params) -> dict[str, int]:
    return {"endOffset": await call("terminate_segment", p.segment, p.query.force)}


async def _load_auth(call: Call, p: Params) -> dict[str, Any]:
    """Validated whole (``runtime.auth``); plain tokens go no further than this process."""
    config = AuthPolicy.from_config(p.body.model_dump(exclude_none=True)).to_config()
    return await call("load_auth", config, over_rest=True)


async def _health(_call: Call, _p: Params) -> dict[str, Any]:
    """Alive, and where the cluster keeps its metadata (``durable`` false: it is lost
    when the head restarts; see ``storage.metadata.metadata_durability``)."""
    return {"status": "ok", "metadata": metadata_durability(), "metrics": metrics_endpoints()}


def metrics_endpoints() -> list[str]:
    """Where Prometheus scrapes each live node (Ray's metrics agent, one per node): the
    gateway does not re-serve metrics, which live with the node that records them."""
    return sorted(
        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for node in ray.nodes()
        if node.get("Alive") and node.get("MetricsExportPort")
    )


async def _openapi(_call: Call, _p: Params) -> dict[str, Any]:
    return openapi_document()


# fmt: off
ROUTES: tuple[Route, ...] = (
    Route(
        "GET", NAMESPACE_PATH, "listScalableTopics", "List the scalable topics of a namespace",
        lambda c, p: c("list_scalable_topics", p.namespace), returns=STRINGS, errors=(400, 503),
        permission=Permission.LOOKUP,
    ),
    Route(
        "PUT", TOPIC_PATH, "createScalableTopic", "Create a scalable topic",
        _create_topic, status=201, body=CreateTopicBody, body_required=True,
        returns=ScalableTopicMetadata, errors=(400, 409, 503),
    ),
    Route(
        "GET", TOPIC_PATH, "getMetadata", "Get the topic's segment DAG metadata",
        lambda c, p: c("get_metadata", p.topic), returns=ScalableTopicMetadata,
        permission=Permission.LOOKUP,
    ),
    Route(
        "DELETE", TOPIC_PATH, "deleteScalableTopic", "Delete a topic and all its segments",
        lambda c, p: c("delete_scalable_topic", p.topic), status=204, errors=_MUTATION_ERRORS,
    ),
    Route(
        "GET", STATS_PATH, "getStats",
        "Aggregated stats: segment counts, per-segment size, per-subscription backlog",
        lambda c, p: c("get_stats", p.topic), returns=OBJECT, permission=Permission.LOOKUP,
    ),
    Route(
        "GET", STATUS_PATH, "getStatus",
        "Whether every segment of the topic has a running actor (a new topic's segments "
        "start in the background); waits up to waitS seconds for it",
        _status, query=StatusQuery, returns=TopicStatus, permission=Permission.LOOKUP,
    ),
    Route(
        "POST", STREAM_INITIAL_PATH, "planStreamStart",
        "A streaming query's first position (Spark's readStream; see docs/spark.md)",
        _stream_initial, body=StreamInitialBody, returns=OBJECT, errors=_MUTATION_ERRORS,
        permission=Permission.CONSUME, tag="stream",
    ),
    Route(
        "POST", STREAM_LATEST_PATH, "planStreamBatch",
        "The end position of the micro-batch starting at a position: a segment is read only "
        "after its parents were read to their end",
        _stream_latest, body=StreamLatestBody, body_required=True, returns=OBJECT,
        errors=_MUTATION_ERRORS, permission=Permission.CONSUME, tag="stream",
    ),
    Route(
        "POST", STREAM_RANGES_PATH, "getStreamRanges",
        "The offset ranges between two positions, with each segment's data plane address",
        _stream_ranges, body=StreamRangesBody, body_required=True, returns=OBJECT,
        errors=_MUTATION_ERRORS, permission=Permission.CONSUME, tag="stream",
    ),
    Route(
        "POST", STREAM_WRITE_PATH, "writeStreamChunk",
        "Store one chunk of a streaming sink's micro-batch partition, once however often "
        "it is replayed (idempotent per queryId, batchId, partitionId, chunk)",
        _stream_write, body=StreamWriteBody, body_required=True, returns=OBJECT,
        errors=_MUTATION_ERRORS, permission=Permission.PRODUCE, tag="stream",
    ),
    Route(
        "GET", STREAM_ENDPOINT_PATH, "getSegmentEndpoint",
        "Where a segment's data plane listens now (a reader reconnecting)",
        lambda c, p: c("stream_endpoint", p.topic, p.path["segmentId"]), returns=OBJECT,
        permission=Permission.CONSUME, tag="stream",
    ),
    Route(
        "GET", SUBSCRIPTIONS_PATH, "listSubscriptions", "List the topic's subscriptions",
        lambda c, p: c("list_subscriptions", p.topic), returns=STRINGS,
        permission=Permission.LOOKUP,
    ),
    Route(
        "PUT", SUBSCRIPTION_PATH, "createSubscription",
        "Create a subscription on every segment of the topic",
        lambda c, p: c(
            "create_subscription",
            p.topic, p.path["subscription"], p.body.position, p.body.session_grace_s,
        ),
        status=204, body=CreateSubscriptionBody, errors=_MUTATION_ERRORS,
        permission=Permission.CONSUME,
    ),
    Route(
        "DELETE", SUBSCRIPTION_PATH, "deleteSubscription",
        "Delete a subscription from every segment of the topic (admin, or consume for "
        "one the caller's principal created)",
        lambda c, p: c("delete_subscription", p.topic, p.path["subscription"]),
        status=204, errors=_MUTATION_ERRORS, permission=Permission.CONSUME,
    ),
    Route(
        "POST", RESET_PATH, "resetSubscription",
        "Move a subscription to earliest, latest or a publish time on every segment "
        "(409 while stream consumers are registered)",
        lambda c, p: c("reset_subscription", p.topic, p.path["subscription"], p.body.to),
        body=ResetSubscriptionBody, body_required=True, returns=OBJECT,
        errors=_MUTATION_ERRORS, permission=Permission.CONSUME,
    ),
    Route(
        "POST", CLEAR_BACKLOG_PATH, "clearBacklog",
        "Acknowledge everything a subscription has not yet (a reset to latest)",
        lambda c, p: c("reset_subscription", p.topic, p.path["subscription"], "latest"),
        returns=OBJECT, errors=_MUTATION_ERRORS, permission=Permission.CONSUME,
    ),
    Route(
        "POST", SPLIT_PATH, "splitSegment", "Split an ACTIVE segment at its hash midpoint",
        lambda c, p: c("split_segment", p.topic, p.path["segmentId"], request_id=p.request_id),
        returns=CompletedOperation, errors=_MUTATION_ERRORS, idempotent=True,
    ),
    Route(
        "POST", MERGE_PATH, "mergeSegments", "Merge two adjacent ACTIVE segments",
        lambda c, p: c(
            "merge_segments", p.topic, p.path["segmentId1"], p.path["segmentId2"],
            request_id=p.request_id,
        ),
        returns=CompletedOperation, errors=_MUTATION_ERRORS, idempotent=True,
    ),
    Route(
        "GET", POLICY_PATH, "getPolicy", "Get the topic's autoscale and retention policy",
        lambda c, p: c("get_policy", p.topic), returns=TopicPolicy,
        permission=Permission.LOOKUP,
    ),
    Route(
        "PUT", POLICY_PATH, "setPolicy", "Replace the topic's autoscale and retention policy",
        lambda c, p: c("set_policy", p.topic, p.body.to_dict()), body=TopicPolicy,
        body_required=True, returns=TopicPolicy, errors=_MUTATION_ERRORS,
    ),
    Route(
        "PUT", SEGMENT_PATH, "createSegment", "Create a segment topic (low level)",
        lambda c, p: c("create_segment", p.segment, p.body.subscriptions),
        status=204, body=CreateSegmentBody, errors=_MUTATION_ERRORS, tag="segments",
    ),
    Route(
        "POST", TERMINATE_PATH, "terminateSegment", "Terminate (seal) a segment topic (low level)",
        _terminate, returns=TerminateResult, query=TerminateSegmentQuery,
        errors=_MUTATION_ERRORS, tag="segments",
    ),
    Route(
        "DELETE", SEGMENT_PATH, "deleteSegment", "Delete a segment topic (low level)",
        lambda c, p: c("delete_segment", p.segment, p.query.force),
        status=204, query=DeleteSegmentQuery, errors=_MUTATION_ERRORS, tag="segments",
    ),
    Route(
        "GET", NAMESPACE_POLICY_PATH, "getNamespacePolicy",
        "The policy a namespace's topics follow where their own policy sets nothing",
        lambda c, p: c("get_namespace_policy", p.namespace), returns=TopicPolicy,
        errors=(400, 503), tag="policy", permission=Permission.LOOKUP,
    ),
    Route(
        "PUT", NAMESPACE_POLICY_PATH, "setNamespacePolicy",
        "Replace a namespace's default policy (each part applies where a topic sets none)",
        lambda c, p: c("set_namespace_policy", p.namespace, p.body.to_dict()),
        body=TopicPolicy, body_required=True, returns=TopicPolicy, errors=(400, 409, 503),
        tag="policy",
    ),
    Route(
        "GET", LIMITS_PATH, "getNamespaceLimits",
        "The limits in force in a namespace (defaults plus its overrides)",
        lambda c, p: c("get_namespace_limits", p.namespace), returns=NamespaceLimits,
        errors=(400, 503), tag="limits", permission=Permission.LOOKUP,
    ),
    Route(
        "PUT", LIMITS_PATH, "setNamespaceLimits",
        "Override limits for a namespace (validated as a whole); returns those in force",
        _set_limits, body=NamespaceLimitsBody, body_required=True, returns=NamespaceLimits,
        errors=(400, 409, 503), tag="limits",
    ),
    Route(
        "POST", RECOVER_PATH, "recoverTopic",
        "Rebuild a topic whose metadata was lost from its storage (DAG, subscriptions, cursors)",
        lambda c, p: c("recover_topic", p.topic, p.body.incarnation), body=RecoverBody,
        returns=OBJECT, errors=_MUTATION_ERRORS,
    ),
    Route(
        "GET", STORAGE_PATH, "checkStorage",
        "Storage under the storage root that no live metadata names (needs admin on '*')",
        lambda c, p: c("check_storage"), returns=OBJECT, errors=(400, 503), tag="storage",
    ),
    Route(
        "DELETE", ORPHANED_STORAGE_PATH, "deleteOrphanedStorage",
        "Delete the storage no live metadata names; returns the report with what was deleted",
        lambda c, p: c("check_storage", True), returns=OBJECT, errors=(400, 409, 503),
        tag="storage",
    ),
    Route(
        "GET", AUTH_PATH, "getAuthStatus",
        "The cluster's authentication policy: principals, grants, 8 hex digits of each "
        "token's SHA-256, never a token (needs admin on '*')",
        lambda c, p: c("auth_status"), returns=OBJECT, errors=(400, 503), tag="auth",
    ),
    Route(
        "PUT", AUTH_PATH, "loadAuth",
        "Replace the authentication policy, validated whole (needs admin on '*'); returns it "
        "as getAuthStatus does. While no policy is stored this is refused (403): the first "
        "policy is the operator's, loaded from inside the cluster (raytopics auth load)",
        _load_auth, body=AuthDocument, body_required=True, returns=OBJECT,
        errors=(400, 409, 503), tag="auth",
    ),
    Route(
        "DELETE", AUTH_PATH, "disableAuth",
        "Turn authentication off: anyone who reaches the API may do anything (needs admin "
        "on '*')",
        lambda c, p: c("disable_auth"), returns=OBJECT, errors=(400, 503), tag="auth",
    ),
    Route(
        "GET", "/openapi.json", "getOpenApi", "This API as an OpenAPI 3.1 document",
        _openapi, returns=OBJECT, errors=(400,), tag="meta", permission=None,
    ),
    Route(
        "GET", "/healthz", "health", "Liveness probe", _health,
        returns=HEALTH,
        errors=(400,), tag="meta", permission=None,
    ),
)
# fmt: on


# --- OpenAPI ----------------------------------------------------------------------------


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ROUTES`` (``actors.gateway.openapi``)."""
    return build_openapi(ROUTES)
