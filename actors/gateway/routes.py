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
    OBJECTS,
    STRINGS,
    AcknowledgeBody,
    AssignmentQuery,
    AuthDocument,
    CheckpointGroupBody,
    CreateSegmentBody,
    CreateSubscriptionBody,
    CreateTopicBody,
    DeleteSegmentQuery,
    LayoutQuery,
    MergeBody,
    NamespaceLimits,
    NamespaceLimitsBody,
    NewTransactionBody,
    NoBody,
    NoQuery,
    Query,
    RecoverBody,
    ResetCheckpointGroupBody,
    ResetSubscriptionBody,
    SegmentPositionBody,
    SplitBody,
    StatusQuery,
    StreamInitialBody,
    StreamLatestBody,
    StreamRangesBody,
    StreamSinkFinishBody,
    StreamSinkOpenBody,
    StreamSinkRerouteBody,
    StreamWriteBody,
    TerminateResult,
    TerminateSegmentQuery,
    TopicStatus,
    TransactionAckBody,
)
from actors.gateway.openapi import build_openapi
from runtime.admin_api import Endpoint, Operation, endpoint, endpoint_operation
from runtime.auth import AuthPolicy, Permission
from runtime.layout import ScalableTopicMetadata
from runtime.names import SegmentName, TopicName
from runtime.operations import CompletedOperation
from runtime.policy import TopicPolicy
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


# call(*args, **kwargs): the route's operation on the admin service, as the requester
# (with the request's id when the operation takes one)
Call = Callable[..., Awaitable[Any]]
Action = Callable[[Call, Params], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One endpoint (``runtime.admin_api.ENDPOINTS``: its method, path, name and the
    operation it runs) with what the gateway needs to serve it: how to call the
    operation, what it accepts, what it answers."""

    endpoint: Endpoint
    action: Action
    body: type[BaseModel] = NoBody
    body_required: bool = False
    query: type[Query] = NoQuery
    returns: type[BaseModel] | dict[str, Any] | None = None
    errors: tuple[int, ...] = (400, 404, 503)
    tag: str = "scalable"

    @property
    def method(self) -> str:
        return self.endpoint.method

    @property
    def path(self) -> str:
        return self.endpoint.path

    @property
    def operation_id(self) -> str:
        return self.endpoint.operation_id

    @property
    def summary(self) -> str:
        return self.endpoint.summary

    @property
    def status(self) -> int:
        return self.endpoint.status

    @property
    def operation(self) -> Operation | None:
        return endpoint_operation(self.endpoint)

    @property
    def permission(self) -> Permission | None:
        """What the caller needs (``None``: open to all, the meta endpoints)."""
        op = self.operation
        return None if op is None else op.permission

    @property
    def idempotent(self) -> bool:
        """Takes an ``Idempotency-Key``: the same key is applied once."""
        op = self.operation
        return op is not None and op.request_id


_MUTATION_ERRORS = (400, 404, 409, 503)


async def _status(call: Call, p: Params) -> dict[str, Any]:
    """A long poll kept well inside the time-out, so the answer (ready or not) arrives."""
    return await call(p.topic, min(p.query.wait_s, p.time_left_s / 2))


async def _watch_layout(call: Call, p: Params) -> dict[str, Any]:
    """A long poll kept well inside the time-out, as ``_status``'s."""
    return await call(p.topic, p.query.known_epoch, min(p.query.wait_s, p.time_left_s / 2))


async def _poll_assignment(call: Call, p: Params) -> dict[str, Any]:
    """A long poll kept well inside the time-out, as ``_status``'s."""
    q = p.query
    wait_s = min(q.wait_s, p.time_left_s / 2)
    return await call(p.topic, p.path["subscription"], p.path["consumer"], q.known_version, wait_s)


async def _stream_latest(call: Call, p: Params) -> dict[str, Any]:
    b = p.body
    until = b.until.model_dump() if b.until is not None else None
    return await call(
        p.topic, b.start.model_dump(), b.max_messages, until, b.fail_on_data_loss, b.max_bytes
    )


async def _stream_ranges(call: Call, p: Params) -> dict[str, Any]:
    b = p.body
    return await call(p.topic, b.start.model_dump(), b.end.model_dump(), b.fail_on_data_loss)


async def _stream_write(call: Call, p: Params) -> dict[str, Any]:
    b = p.body
    records = [(r.key, base64.b64decode(r.value), r.properties) for r in b.records]
    return await call(p.topic, b.query_id, b.batch_id, b.partition_id, b.chunk, records)


async def _set_limits(call: Call, p: Params) -> dict[str, int]:
    return await call(p.namespace, p.body.model_dump(exclude_none=True))


async def _terminate(call: Call, p: Params) -> dict[str, int]:
    return {"endOffset": await call(p.segment, p.query.force)}


async def _load_auth(call: Call, p: Params) -> dict[str, Any]:
    """Validated whole (``runtime.auth``); plain tokens go no further than this process."""
    config = AuthPolicy.from_config(p.body.model_dump(exclude_none=True)).to_config()
    return await call(config, over_rest=True)


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


def _route(operation_id: str, action: Action | None = None, **serving: Any) -> Route:
    """The route of ``operation_id``; without an ``action``, its operation is called with
    the arguments the endpoint declares (``runtime.admin_api.Endpoint``)."""
    point = endpoint(operation_id)
    return Route(point, action or functools.partial(_declared, point), **serving)


async def _declared(point: Endpoint, call: Call, p: Params) -> Any:
    return await call(**declared_arguments(point, p))


def declared_arguments(point: Endpoint, p: Params) -> dict[str, Any]:
    """The operation's arguments from a request to ``point``: its path's parameters, the
    body and query fields the endpoint declares, and the arguments it fixes. The same
    declarations ``AdminHttpClient`` builds its requests from."""
    args = {parameter: _PATH_VALUES[parameter](p) for parameter in point.path_parameters}
    if point.body:
        body = p.body.model_dump(by_alias=True)
        args |= {parameter: body.get(name) for name, parameter in point.body.items()}
    if point.query:
        query = p.query.model_dump(by_alias=True)
        args |= {parameter: query[name] for name, parameter in point.query.items()}
    return args | dict(point.fixes)


# What each path parameter (``runtime.admin_api.PATH_PARAMETERS``) is, from a request.
_PATH_VALUES: Mapping[str, Callable[[Params], Any]] = {
    "segment": lambda p: p.segment,
    "name": lambda p: p.topic,
    "namespace": lambda p: p.namespace,
    "subscription": lambda p: p.path["subscription"],
    "consumer": lambda p: p.path["consumer"],
    "segment_id": lambda p: p.path["segmentId"],
    "segment_id1": lambda p: p.path["segmentId1"],
    "segment_id2": lambda p: p.path["segmentId2"],
    "txn_id": lambda p: p.path["txnId"],
}


# fmt: off
ROUTES: tuple[Route, ...] = (
    _route("listScalableTopics", returns=STRINGS, errors=(400, 503)),
    _route("createScalableTopic", body=CreateTopicBody, body_required=True,
           returns=ScalableTopicMetadata, errors=(400, 409, 503)),
    _route("getMetadata", returns=ScalableTopicMetadata),
    _route("deleteScalableTopic", errors=_MUTATION_ERRORS),
    _route("getStats", returns=OBJECT),
    _route("getStatus", _status, query=StatusQuery, returns=TopicStatus),
    _route("watchLayout", _watch_layout, query=LayoutQuery, returns=OBJECT, tag="stream"),
    _route("planStreamStart", body=StreamInitialBody, returns=OBJECT,
           errors=_MUTATION_ERRORS, tag="stream"),
    _route("planStreamBatch", _stream_latest, body=StreamLatestBody, body_required=True,
           returns=OBJECT, errors=_MUTATION_ERRORS, tag="stream"),
    _route("getStreamRanges", _stream_ranges, body=StreamRangesBody, body_required=True,
           returns=OBJECT, errors=_MUTATION_ERRORS, tag="stream"),
    _route("writeStreamChunk", _stream_write, body=StreamWriteBody, body_required=True,
           returns=OBJECT, errors=_MUTATION_ERRORS, tag="stream"),
    _route("openStreamSinkChunk", body=StreamSinkOpenBody, body_required=True, returns=OBJECT,
           errors=_MUTATION_ERRORS, tag="stream"),
    _route("rerouteStreamSinkPart", body=StreamSinkRerouteBody, body_required=True,
           returns=OBJECT, errors=_MUTATION_ERRORS, tag="stream"),
    _route("finishStreamSinkChunk", body=StreamSinkFinishBody, body_required=True,
           returns=OBJECT, errors=_MUTATION_ERRORS, tag="stream"),
    _route("getSegmentEndpoint", returns=OBJECT, tag="stream"),
    _route("listSubscriptions", returns=STRINGS),
    _route("createSubscription", body=CreateSubscriptionBody, errors=_MUTATION_ERRORS),
    _route("deleteSubscription", errors=_MUTATION_ERRORS),
    _route("resetSubscription", body=ResetSubscriptionBody, body_required=True, returns=OBJECT,
           errors=_MUTATION_ERRORS),
    _route("clearBacklog", returns=OBJECT, errors=_MUTATION_ERRORS),
    _route("registerConsumer", returns=OBJECT, errors=_MUTATION_ERRORS, tag="consumers"),
    _route("pollAssignment", _poll_assignment, query=AssignmentQuery, returns=OBJECT,
           tag="consumers"),
    _route("releaseSegment", body=SegmentPositionBody, errors=_MUTATION_ERRORS,
           tag="consumers"),
    _route("finishSegment", body=SegmentPositionBody, errors=_MUTATION_ERRORS,
           tag="consumers"),
    _route("unregisterConsumer", errors=_MUTATION_ERRORS, tag="consumers"),
    _route("getCursor", returns=OBJECT, tag="consumers"),
    _route("acknowledgeCumulative", body=AcknowledgeBody, body_required=True,
           errors=_MUTATION_ERRORS, tag="consumers"),
    _route("ensureCheckpointGroup", body=CheckpointGroupBody, errors=_MUTATION_ERRORS,
           tag="consumers"),
    _route("getCheckpointGroup", returns=OBJECT, tag="consumers"),
    _route("resetCheckpointGroup", body=ResetCheckpointGroupBody, body_required=True,
           errors=_MUTATION_ERRORS, tag="consumers"),
    _route("splitSegment", body=SplitBody, returns=CompletedOperation, errors=_MUTATION_ERRORS),
    _route("mergeSegments", body=MergeBody, returns=CompletedOperation, errors=_MUTATION_ERRORS),
    _route("getPolicy", returns=TopicPolicy),
    _route("setPolicy", lambda c, p: c(p.topic, p.body.to_dict()), body=TopicPolicy,
           body_required=True, returns=TopicPolicy, errors=_MUTATION_ERRORS),
    _route("createSegment", body=CreateSegmentBody, errors=_MUTATION_ERRORS, tag="segments"),
    _route("terminateSegment", _terminate, returns=TerminateResult, query=TerminateSegmentQuery,
           errors=_MUTATION_ERRORS, tag="segments"),
    _route("deleteSegment", query=DeleteSegmentQuery, errors=_MUTATION_ERRORS, tag="segments"),
    _route("getNamespacePolicy", returns=TopicPolicy, errors=(400, 503), tag="policy"),
    _route("setNamespacePolicy", lambda c, p: c(p.namespace, p.body.to_dict()),
           body=TopicPolicy, body_required=True, returns=TopicPolicy, errors=(400, 409, 503),
           tag="policy"),
    _route("getNamespaceLimits", returns=NamespaceLimits, errors=(400, 503), tag="limits"),
    _route("setNamespaceLimits", _set_limits, body=NamespaceLimitsBody, body_required=True,
           returns=NamespaceLimits, errors=(400, 409, 503), tag="limits"),
    _route("recoverTopic", body=RecoverBody, returns=OBJECT, errors=_MUTATION_ERRORS),
    _route("checkStorage", returns=OBJECT, errors=(400, 503), tag="storage"),
    _route("deleteOrphanedStorage", returns=OBJECT, errors=(400, 409, 503), tag="storage"),
    _route("getAuthStatus", returns=OBJECT, errors=(400, 503), tag="auth"),
    _route("loadAuth", _load_auth, body=AuthDocument, body_required=True, returns=OBJECT,
           errors=(400, 409, 503), tag="auth"),
    _route("disableAuth", returns=OBJECT, errors=(400, 503), tag="auth"),
    _route("newTransaction", body=NewTransactionBody, returns=OBJECT, errors=_MUTATION_ERRORS,
           tag="transactions"),
    _route("listTransactions", returns=OBJECTS, tag="transactions"),
    _route("getTransaction", returns=OBJECT, tag="transactions"),
    _route("commitTransaction", returns=OBJECT, errors=_MUTATION_ERRORS, tag="transactions"),
    _route("abortTransaction", returns=OBJECT, errors=_MUTATION_ERRORS, tag="transactions"),
    _route("transactionAcknowledge", body=TransactionAckBody, body_required=True,
           returns=OBJECT, errors=_MUTATION_ERRORS, tag="transactions"),
    _route("getOpenApi", _openapi, returns=OBJECT, errors=(400,), tag="meta"),
    _route("health", _health, returns=HEALTH, errors=(400,), tag="meta"),
)
# fmt: on


# --- OpenAPI ----------------------------------------------------------------------------


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ROUTES`` (``actors.gateway.openapi``)."""
    return build_openapi(ROUTES)
