"""``AdminGateway``: the spec's Admin API (``/admin/v2/scalable``, ``/admin/v2/segments``).

One detached async actor per port runs an aiohttp server on the actor's own
event loop and serves every request through a ``ScalableTopicsAdmin`` living in
the same actor, so REST callers get exactly the semantics and typed errors of
Python callers. ``ROUTES`` is the single table that drives the router, request
validation and ``/openapi.json``, so the three cannot drift apart.

Bad input never reaches the admin: path components are validated by
``runtime.names``, bodies and query strings by strict pydantic models, and any
``ScalableTopicsError`` becomes ``{"error": code, "message": ...}`` with its
``http_status``. Only a genuine bug yields a 500, as JSON without a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import ray
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.json_schema import models_json_schema
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.metrics import record_rejected
from clients.admin import ScalableTopicsAdmin
from clients.http import (
    LIMITS_PATH,
    MERGE_PATH,
    NAMESPACE_PATH,
    ORPHANED_STORAGE_PATH,
    POLICY_PATH,
    RECOVER_PATH,
    SEGMENT_PATH,
    SPLIT_PATH,
    STATS_PATH,
    STORAGE_PATH,
    SUBSCRIPTION_PATH,
    SUBSCRIPTIONS_PATH,
    TERMINATE_PATH,
    TOPIC_PATH,
)
from runtime.auth import AuthPolicy, Permission, bearer_token
from runtime.config import apply_settings, ray_namespace
from runtime.connect import actor_settings, metadata_durability
from runtime.errors import (
    ConflictError,
    InvalidArgumentError,
    InvalidRequestError,
    ScalableTopicsError,
    UnavailableError,
    is_integer,
)
from runtime.layout import MAX_SEGMENTS, ScalableTopicMetadata
from runtime.limits import Limits
from runtime.names import _DESCRIPTOR, _PART, SegmentName, TopicName, validate_part
from runtime.operations import CompletedOperation
from runtime.policy import TopicPolicy
from runtime.subscription import DEFAULT_GRACE_S, StartPosition
from storage.topic_storage import INCARNATION_PATTERN

log = logging.getLogger(__name__)

# --- request and response documents ------------------------------------------------------


class _Body(BaseModel):
    """Request bodies: JSON types taken literally ("4" is not 4), unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NoBody(_Body):
    """Endpoints without a body accept only an empty body or ``{}``."""


class CreateTopicBody(_Body):
    num_segments: int = Field(
        alias="numSegments",
        ge=1,
        le=MAX_SEGMENTS,
        description=f"number of initial segments, an integer from 1 to {MAX_SEGMENTS}",
    )
    properties: dict[str, str] | None = Field(
        default=None, description="free-form string-to-string map stored with the topic"
    )


class CreateSubscriptionBody(_Body):
    position: StartPosition = Field(
        default="earliest", description="where the subscription starts: 'earliest' or 'latest'"
    )
    session_grace_s: float = Field(
        default=DEFAULT_GRACE_S,
        alias="sessionGraceS",
        gt=0,
        allow_inf_nan=False,
        description="seconds a disconnected stream consumer keeps its segments, > 0",
    )


class CreateSegmentBody(_Body):
    subscriptions: list[str] = Field(
        default_factory=list, description="subscription names to pre-create at Earliest"
    )


class RecoverBody(_Body):
    incarnation: str | None = Field(
        default=None,
        pattern=f"^{INCARNATION_PATTERN}$",
        description="which stored incarnation to recover (GET /admin/v2/storage lists them); "
        "may be omitted when only one exists",
    )


class _Query(BaseModel):
    """Query strings: text is coerced ("true" is True), unknown parameters refused."""

    model_config = ConfigDict(extra="forbid")


class NoQuery(_Query):
    """Endpoints without query parameters refuse any."""


class DeleteSegmentQuery(_Query):
    force: bool = Field(default=False, description="delete even if ACTIVE in the layout")


class TerminateSegmentQuery(_Query):
    force: bool = Field(default=False, description="terminate even if ACTIVE in the layout")


def _limits_model(name: str, doc: str, base: type[BaseModel], *, partial: bool) -> Any:
    """One integer field per ``runtime.limits.Limits`` field, so the REST documents
    cannot drift from the limits; ``partial``: each may be omitted (an override)."""
    annotation, default = (int | None, None) if partial else (int, ...)
    limit = Field(default=default, ge=1, le=(1 << 63) - 1)  # stored as JSON, used as int64
    model = create_model(
        name, __base__=base, **{f.name: (annotation, limit) for f in fields(Limits)}
    )
    model.__doc__ = doc
    return model


NamespaceLimitsBody = _limits_model(
    "NamespaceLimitsBody",
    "Overrides for one namespace; an omitted limit keeps its value.",
    _Body,
    partial=True,
)
NamespaceLimits = _limits_model(
    "NamespaceLimits", "The limits in force in a namespace.", BaseModel, partial=False
)


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer; ``error`` is the ``code`` of a ``runtime.errors`` class."""

    error: str = Field(description="stable machine-readable code, e.g. topic_not_found")
    message: str = Field(description="what went wrong and what is allowed instead")


class TerminateResult(BaseModel):
    end_offset: int = Field(alias="endOffset", description="offset after the last record")


_STRINGS = {"type": "array", "items": {"type": "string"}}
_HEALTH = {
    "type": "object",
    "properties": {
        "status": {"const": "ok"},
        "metadata": {
            "type": "object",
            "description": "where the cluster's GCS keeps metadata; durable: survives a "
            "restart of the head",
            "properties": {
                "backend": {"enum": ["rocksdb", "redis", "memory", "unknown"]},
                "durable": {"type": "boolean"},
            },
        },
    },
}
_OBJECT = {"type": "object", "additionalProperties": True}

# --- the route table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """A request's validated inputs, handed to a route's action."""

    path: Mapping[str, Any]
    body: Any
    query: Any

    @property
    def namespace(self) -> str:
        return f"{self.path['tenant']}/{self.path['namespace']}"

    @property
    def topic(self) -> str:
        return str(_topic_of(self.path))

    @property
    def segment(self) -> str:
        return str(SegmentName.from_descriptor(_topic_of(self.path), self.path["descriptor"]))


def _topic_of(path: Mapping[str, str]) -> TopicName:
    return TopicName(path["tenant"], path["namespace"], path["topic"])


Action = Callable[[ScalableTopicsAdmin, Params], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One endpoint: how to call the admin, what it accepts, what it answers."""

    method: str
    path: str
    operation_id: str
    summary: str
    action: Action
    status: int = 200
    body: type[BaseModel] = NoBody
    body_required: bool = False
    query: type[_Query] = NoQuery
    returns: type[BaseModel] | dict[str, Any] | None = None
    errors: tuple[int, ...] = (400, 404, 503)
    tag: str = "scalable"
    permission: Permission | None = Permission.ADMIN  # None: open to all (meta endpoints)


_MUTATION_ERRORS = (400, 404, 409, 503)


async def _create_topic(admin: ScalableTopicsAdmin, p: Params) -> dict[str, Any]:
    return await admin.create_scalable_topic_async(p.topic, p.body.num_segments, p.body.properties)


async def _set_limits(admin: ScalableTopicsAdmin, p: Params) -> dict[str, int]:
    overrides = p.body.model_dump(exclude_none=True)
    return await admin.set_namespace_limits_async(p.namespace, **overrides)


async def _terminate(admin: ScalableTopicsAdmin, p: Params) -> dict[str, int]:
    return {"endOffset": await admin.terminate_segment_async(p.segment, p.query.force)}


async def _health(_admin: ScalableTopicsAdmin, _p: Params) -> dict[str, Any]:
    """Alive, and where the cluster keeps its metadata (``durable`` false: it is lost
    when the head restarts; see ``runtime.connect.metadata_durability``)."""
    return {"status": "ok", "metadata": metadata_durability()}


async def _openapi(_admin: ScalableTopicsAdmin, _p: Params) -> dict[str, Any]:
    return openapi_document()


# fmt: off
ROUTES: tuple[Route, ...] = (
    Route(
        "GET", NAMESPACE_PATH, "listScalableTopics", "List the scalable topics of a namespace",
        lambda a, p: a.list_scalable_topics_async(p.namespace), returns=_STRINGS, errors=(400, 503),
        permission=Permission.LOOKUP,
    ),
    Route(
        "PUT", TOPIC_PATH, "createScalableTopic", "Create a scalable topic",
        _create_topic, status=201, body=CreateTopicBody, body_required=True,
        returns=ScalableTopicMetadata, errors=(400, 409, 503),
    ),
    Route(
        "GET", TOPIC_PATH, "getMetadata", "Get the topic's segment DAG metadata",
        lambda a, p: a.get_metadata_async(p.topic), returns=ScalableTopicMetadata,
        permission=Permission.LOOKUP,
    ),
    Route(
        "DELETE", TOPIC_PATH, "deleteScalableTopic", "Delete a topic and all its segments",
        lambda a, p: a.delete_scalable_topic_async(p.topic), status=204, errors=_MUTATION_ERRORS,
    ),
    Route(
        "GET", STATS_PATH, "getStats",
        "Aggregated stats: segment counts, per-segment size, per-subscription backlog",
        lambda a, p: a.get_stats_async(p.topic), returns=_OBJECT, permission=Permission.LOOKUP,
    ),
    Route(
        "GET", SUBSCRIPTIONS_PATH, "listSubscriptions", "List the topic's subscriptions",
        lambda a, p: a.list_subscriptions_async(p.topic), returns=_STRINGS,
        permission=Permission.LOOKUP,
    ),
    Route(
        "PUT", SUBSCRIPTION_PATH, "createSubscription",
        "Create a subscription on every segment of the topic",
        lambda a, p: a.create_subscription_async(
            p.topic, p.path["subscription"], p.body.position, p.body.session_grace_s
        ),
        status=204, body=CreateSubscriptionBody, errors=_MUTATION_ERRORS,
        permission=Permission.CONSUME,
    ),
    Route(
        "DELETE", SUBSCRIPTION_PATH, "deleteSubscription",
        "Delete a subscription from every segment of the topic",
        lambda a, p: a.delete_subscription_async(p.topic, p.path["subscription"]),
        status=204, errors=_MUTATION_ERRORS,
    ),
    Route(
        "POST", SPLIT_PATH, "splitSegment", "Split an ACTIVE segment at its hash midpoint",
        lambda a, p: a.split_segment_async(p.topic, p.path["segmentId"]),
        returns=CompletedOperation, errors=_MUTATION_ERRORS,
    ),
    Route(
        "POST", MERGE_PATH, "mergeSegments", "Merge two adjacent ACTIVE segments",
        lambda a, p: a.merge_segments_async(p.topic, p.path["segmentId1"], p.path["segmentId2"]),
        returns=CompletedOperation, errors=_MUTATION_ERRORS,
    ),
    Route(
        "GET", POLICY_PATH, "getPolicy", "Get the topic's autoscale and retention policy",
        lambda a, p: a.get_policy_async(p.topic), returns=TopicPolicy,
    ),
    Route(
        "PUT", POLICY_PATH, "setPolicy", "Replace the topic's autoscale and retention policy",
        lambda a, p: a.set_policy_async(p.topic, p.body.to_dict()), body=TopicPolicy,
        body_required=True, returns=TopicPolicy, errors=_MUTATION_ERRORS,
    ),
    Route(
        "PUT", SEGMENT_PATH, "createSegment", "Create a segment topic (low level)",
        lambda a, p: a.create_segment_async(p.segment, p.body.subscriptions),
        status=204, body=CreateSegmentBody, errors=_MUTATION_ERRORS, tag="segments",
    ),
    Route(
        "POST", TERMINATE_PATH, "terminateSegment", "Terminate (seal) a segment topic (low level)",
        _terminate, returns=TerminateResult, query=TerminateSegmentQuery,
        errors=_MUTATION_ERRORS, tag="segments",
    ),
    Route(
        "DELETE", SEGMENT_PATH, "deleteSegment", "Delete a segment topic (low level)",
        lambda a, p: a.delete_segment_async(p.segment, p.query.force),
        status=204, query=DeleteSegmentQuery, errors=_MUTATION_ERRORS, tag="segments",
    ),
    Route(
        "GET", LIMITS_PATH, "getNamespaceLimits",
        "The limits in force in a namespace (defaults plus its overrides)",
        lambda a, p: a.get_namespace_limits_async(p.namespace), returns=NamespaceLimits,
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
        lambda a, p: a.recover_topic_async(p.topic, p.body.incarnation), body=RecoverBody,
        returns=_OBJECT, errors=_MUTATION_ERRORS,
    ),
    Route(
        "GET", STORAGE_PATH, "checkStorage",
        "Storage under the storage root that no live metadata names (needs admin on '*')",
        lambda a, p: a.check_storage_async(), returns=_OBJECT, errors=(400, 503), tag="storage",
    ),
    Route(
        "DELETE", ORPHANED_STORAGE_PATH, "deleteOrphanedStorage",
        "Delete the storage no live metadata names; returns the report with what was deleted",
        lambda a, p: a.check_storage_async(delete=True), returns=_OBJECT, errors=(400, 409, 503),
        tag="storage",
    ),
    Route(
        "GET", "/openapi.json", "getOpenApi", "This API as an OpenAPI 3.1 document",
        _openapi, returns=_OBJECT, errors=(400,), tag="meta", permission=None,
    ),
    Route(
        "GET", "/healthz", "health", "Liveness probe", _health,
        returns=_HEALTH,
        errors=(400,), tag="meta", permission=None,
    ),
)
# fmt: on

# --- request parsing ---------------------------------------------------------------------

_NAME_PARAMS = ("tenant", "namespace", "topic", "subscription")
_ID_PARAMS = ("segmentId", "segmentId1", "segmentId2")
_SEGMENT_ID = re.compile(r"[0-9]{1,19}")


def _parse_path(match: Mapping[str, str]) -> dict[str, Any]:
    """Validate every path component before anything acts on the request."""
    values: dict[str, Any] = {}
    for key, raw in match.items():
        if key in _ID_PARAMS:
            values[key] = _segment_id(key, raw)
        elif key in _NAME_PARAMS:
            values[key] = validate_part(key, raw)
        else:
            values[key] = raw
    if "descriptor" in values:  # its hash range is checked too, not only its shape
        SegmentName.from_descriptor(_topic_of(values), values["descriptor"])
    return values


def _segment_id(key: str, raw: str) -> int:
    if not _SEGMENT_ID.fullmatch(raw):
        raise InvalidArgumentError(f"invalid {key} {raw!r}: must be a non-negative integer")
    return int(raw)


async def _parse_body(request: web.Request, route: Route) -> _Body:
    raw = await request.read()
    if not raw.strip():
        if route.body_required:
            raise InvalidRequestError(
                f"{route.method} {route.path} needs a JSON object body. {_allowed(route.body)}"
            )
        return route.body()
    try:
        return route.body.model_validate_json(raw)
    except ValidationError as err:
        raise _invalid("request body", route.body, err) from None


def _parse_query(request: web.Request, route: Route) -> _Query:
    query = request.query
    repeated = sorted({k for k in query if len(query.getall(k)) > 1})
    if repeated:
        raise InvalidArgumentError(f"query parameters given more than once: {repeated}")
    try:
        return route.query.model_validate(dict(query))
    except ValidationError as err:
        raise _invalid("query string", route.query, err) from None


def _invalid(what: str, model: type[BaseModel], err: ValidationError) -> InvalidRequestError:
    """Say what is wrong and what is allowed; bad JSON syntax is a malformed request."""
    problems = "; ".join(
        f"{'.'.join(map(str, e['loc'])) or what}: {e['msg']}" for e in err.errors(include_url=False)
    )
    syntax = all(e["type"] == "json_invalid" for e in err.errors())
    cls = InvalidRequestError if syntax else InvalidArgumentError
    return cls(f"invalid {what}: {problems}. {_allowed(model, what)}")


def _allowed(model: type[BaseModel], what: str = "request body") -> str:
    """The fields a body or query string may have, from the model itself."""
    fields = [
        f"{field.alias or name} ({'required' if field.is_required() else 'optional'}, "
        f"{field.description})"
        for name, field in model.model_fields.items()
    ]
    return f"Allowed: {'; '.join(fields)}" if fields else f"This endpoint takes no {what}"


# --- the aiohttp application ------------------------------------------------------------

ADMIN = web.AppKey("admin", ScalableTopicsAdmin)
AUTH = web.AppKey("auth", AuthPolicy)


def create_app(admin: ScalableTopicsAdmin, auth: AuthPolicy | None = None) -> web.Application:
    """The REST application over ``admin`` (any object with the admin's async methods).

    ``auth`` guards every route with a ``permission``; without it (or with no
    tokens configured) the API is open, as a local cluster's is.
    """
    app = web.Application(middlewares=[_json_errors])
    app[ADMIN] = admin
    app[AUTH] = auth or AuthPolicy()
    resources: dict[str, web.Resource] = {}
    for route in ROUTES:
        if route.path not in resources:
            resources[route.path] = app.router.add_resource(route.path)
        resources[route.path].add_route(route.method, _handler(route))
    return app


def _handler(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        path = _authorized_path(request, route)
        params = Params(
            path=path,
            query=_parse_query(request, route),
            body=await _parse_body(request, route),
        )
        result = await route.action(request.app[ADMIN], params)
        if route.status == 204:
            return web.Response(status=204)
        return web.json_response(result, status=route.status)

    return handle


def _authorized_path(request: web.Request, route: Route) -> dict[str, Any]:
    """Who asks first (401), then whether they may act on this namespace (403).

    Both happen before the body is read or anything acts, so a refused request
    changes nothing.
    """
    if route.permission is None:
        return _parse_path(request.match_info)
    policy = request.app[AUTH]
    token = bearer_token(request.headers.get("Authorization"))
    policy.authenticate(token)
    path = _parse_path(request.match_info)
    # Routes outside any namespace (the storage root) act on every namespace.
    scope = f"{path['tenant']}/{path['namespace']}" if "tenant" in path else "*"
    policy.authorize(token, route.permission, scope)
    return path


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure as ``{"error", "message"}`` JSON, never an HTML page or a traceback."""
    try:
        return await handler(request)
    except ScalableTopicsError as err:
        if err.http_status < 500:
            record_rejected(_topic_label(request.match_info), "gateway", err.code)
        return web.json_response(err.to_dict(), status=err.http_status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(request, exc)
    except Exception as err:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        message = (
            f"unexpected {type(err).__name__} while serving {request.method} {request.path}; "
            "details are in the gateway's log"
        )
        return web.json_response({"error": "internal", "message": message}, status=500)


def _topic_label(match: Mapping[str, str]) -> str:
    """A request's topic path as given (it may be what was invalid); empty if none."""
    parts = [match.get(key, "") for key in ("tenant", "namespace", "topic")]
    return "/".join(p for p in parts if p)


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (no route, wrong method, body too large) in our JSON shape."""
    headers = {}
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        headers["Allow"] = allowed
        message = f"{request.method} is not allowed on {request.path}; allowed: {allowed}"
    elif isinstance(exc, web.HTTPNotFound):
        message = f"no endpoint {request.path}; GET /openapi.json lists them all"
    else:
        message = f"{exc.reason}: {request.method} {request.path}"
    code = exc.reason.lower().replace(" ", "_")
    return web.json_response(
        {"error": code, "message": message}, status=exc.status, headers=headers
    )


# --- OpenAPI ----------------------------------------------------------------------------

_REF = "#/components/schemas/{model}"
_STATUS_TEXT = {
    200: "OK",
    401: "No valid bearer token (only when the operator configured tokens)",
    403: "The token's principal lacks the permission on this namespace",
    201: "Created",
    204: "No Content",
    400: "Malformed request: bad JSON, wrong types, unknown fields, invalid names",
    404: "Topic, segment or subscription not found",
    405: "Method not allowed on this path",
    409: "Conflicts with the current state (exists, sealed, not adjacent, in progress)",
    500: "Unexpected internal error",
    503: "A controller or segment is unavailable",
}


def _param_schema(name: str) -> dict[str, Any]:
    """The same regexes that validate names describe them, so they cannot drift."""
    if name in _ID_PARAMS:
        return {"type": "integer", "minimum": 0}
    if name == "descriptor":
        return {"type": "string", "pattern": _DESCRIPTOR.pattern, "example": "0000-7fff-1"}
    return {"type": "string", "pattern": _PART.pattern}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """An OpenAPI 3.1 document of ``ROUTES``, schemas generated from the pydantic models."""
    models = {(ErrorBody, "serialization"): None}  # a model can be a body and a reply
    for route in ROUTES:
        if route.body.model_fields:
            models[(route.body, "validation")] = None
        if isinstance(route.returns, type):
            models[(route.returns, "serialization")] = None
    keys, defs = models_json_schema(list(models), ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, keys)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Scalable Topics on Ray: Admin API",
            "version": "2",
            "description": "Scalable topics (segment DAGs that split and merge) and segments.",
        },
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(route: Route, keys: Mapping[tuple[type, str], dict[str, Any]]) -> dict[str, Any]:
    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return keys[(model, mode)]

    parameters = [
        {"name": name, "in": "path", "required": True, "schema": _param_schema(name)}
        for name in re.findall(r"{(\w+)}", route.path)
    ]
    query = route.query.model_json_schema()
    for name, schema in query.get("properties", {}).items():
        required = name in query.get("required", ())
        description = schema.pop("description", "")
        parameters.append(
            {"name": name, "in": "query", "required": required, "schema": schema}
            | {"description": description}
        )
    success: dict[str, Any] = {"description": _STATUS_TEXT[route.status]}
    if route.returns is not None:
        returns = route.returns
        schema = ref(returns, "serialization") if isinstance(returns, type) else returns
        success["content"] = {"application/json": {"schema": schema}}
    error = {"application/json": {"schema": ref(ErrorBody, "serialization")}}
    responses = {str(route.status): success}
    secured = (401, 403) if route.permission is not None else ()
    for status in (*route.errors, *secured, 405, 500):
        responses[str(status)] = {"description": _STATUS_TEXT[status], "content": error}
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if route.permission is not None:
        operation["security"] = [{"bearerAuth": []}]
        operation["x-permission"] = route.permission.value
    if route.body.model_fields:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": ref(route.body, "validation")}},
        }
    return operation


# --- the actor --------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_restarts=-1)
class AdminGateway:
    """The REST server for one port; a restarted incarnation binds the port again."""

    def __init__(
        self,
        host: str,
        port: int,
        auth_config: dict[str, Any] | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        apply_settings(settings)
        self._host, self._port = host, port
        # A policy without principals travels as no document: authentication off.
        self._auth = AuthPolicy.from_config(auth_config) if auth_config else AuthPolicy()
        # Ray runs an async actor's __init__ on the actor's event loop, so the
        # server starts here and every incarnation serves without being asked.
        self._serving = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> web.AppRunner:
        # The gateway authorizes each request itself; its own admin acts for it.
        admin = ScalableTopicsAdmin(auth=AuthPolicy())
        runner = web.AppRunner(create_app(admin, self._auth))
        await runner.setup()
        await web.TCPSite(runner, self._host, self._port).start()
        return runner

    async def ready(self) -> dict[str, Any]:
        """Wait until the port is bound; says where (or why not, as UnavailableError)."""
        try:
            await asyncio.shield(self._serving)
        except OSError as err:
            raise UnavailableError(
                f"the admin gateway cannot listen on {self._host}:{self._port}: {err.strerror}"
            ) from None
        return {"host": self._host, "port": self._port, "url": await self.url()}

    async def url(self) -> str:
        """Base URL of the API; a wildcard bind is reported as this node's address."""
        host = self._host
        if host in ("", "0.0.0.0", "::"):
            host = ray.util.get_node_ip_address()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._port}"


def gateway_actor_name(port: int) -> str:
    return f"gateway:{port}"


def start_gateway(
    port: int,
    host: str = "127.0.0.1",
    *,
    timeout_s: float = 60.0,
    auth: AuthPolicy | None = None,
) -> str:
    """Start (or find) the gateway for ``port`` and return its base URL once it serves.

    The actor is pinned to the caller's node: the caller was told a loopback (or
    this node's) address, so the server must run where that address points.
    ``auth`` defaults to the caller's ``RAYTOPICS_AUTH_TOKENS_FILE``; only token
    digests travel to the actor. A gateway already running keeps its policy.
    """
    policy = AuthPolicy.from_env() if auth is None else auth
    if not is_integer(port, 1, 65535):
        raise InvalidArgumentError(f"port must be an integer from 1 to 65535, got {port!r}")
    handle = AdminGateway.options(
        name=gateway_actor_name(port),
        namespace=ray_namespace(),
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        ),
    ).remote(host, port, policy.to_config() if policy.enabled else None, settings=actor_settings())
    try:
        info = ray.get(handle.ready.remote(), timeout=timeout_s)
    except (RayTaskError, GetTimeoutError) as err:
        ray.kill(handle, no_restart=True)  # free the name so a later attempt starts afresh
        cause = err.cause if isinstance(err, RayTaskError) else None
        if isinstance(cause, ScalableTopicsError):
            raise cause from None
        why = f"{type(cause).__name__}: {cause}" if cause else f"no answer within {timeout_s}s"
        raise UnavailableError(f"the admin gateway on port {port} did not start: {why}") from None
    if info["host"] != host:
        raise ConflictError(
            f"{gateway_actor_name(port)} already serves {info['url']} (bound to {info['host']!r}, "
            f"not {host!r}); stop it first"
        )
    return info["url"]


def stop_gateway(port: int, *, timeout_s: float = 10.0) -> bool:
    """Kill the gateway of ``port`` and wait until it is gone (so the port is free).

    Returns False if none was running.
    """
    try:
        handle = ray.get_actor(gateway_actor_name(port), namespace=ray_namespace())
    except ValueError:
        return False
    ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.url.remote(), timeout=1)
        except RayActorError:
            return True
        except GetTimeoutError:
            continue
        time.sleep(0.05)
    return True
