"""``AdminGateway``: the Admin API (``/admin/v2/scalable``, ``/admin/v2/segments``).

One detached async actor per port runs an aiohttp server on the actor's own
event loop and hands every request, with the caller's bearer token, to the
cluster's admin service (``actors.admin.service``), the same one the Python
admin client calls, so REST callers get exactly the semantics, checks and typed
errors of Python callers. ``ROUTES`` (``actors.gateway.routes``) is the single table that drives the
router, request validation and ``/openapi.json``, so the three cannot drift
apart.

Each request is authenticated and authorized against the policy stored in the
cluster (``actors.guard``, re-read when a second old) before its body is read,
so a rotation or a revocation applies within seconds without a restart, and a
refused request changes nothing; the service checks again before it acts. With
``RAYTOPICS_TLS_CERT`` and ``RAYTOPICS_TLS_KEY`` set the gateway speaks HTTPS
only (``runtime.tls``). Every request is answered within the gateway's time-out
(``RAYTOPICS_REST_TIMEOUT_S``, 30 s by default), or its operation's own when that is
longer (``runtime.admin_api``: those that wait on segment processes or walk storage):
past it, a 504 ``timeout`` says so, and that a change asked for may still complete.

Bad input never reaches the service: path components are validated by
``runtime.names``, bodies and query strings by strict pydantic models, and any
``ScalableTopicsError`` becomes ``{"error": code, "message": ...}`` with its
``http_status``. Only a genuine bug yields a 500, as JSON without a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import ray
from aiohttp import web
from pydantic import BaseModel, ValidationError
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.admin.caller import AdminServiceCaller
from actors.gateway.console import add_console
from actors.gateway.documents import (
    ID_PARAMS,
    MAX_SEGMENT_ID,
    Body,
    Query,
)
from actors.gateway.routes import ROUTES, Params, Route, Service, topic_of
from actors.guard import Guard, guard
from actors.metrics import record_rejected
from actors.registry import named_actors
from runtime.admin_api import endpoint_timeout_s
from runtime.auth import (
    TOKEN_ENV,
    TOKENS_FILE_ENV,
    AuthPolicy,
    bearer_token,
    default_token,
)
from runtime.config import actor_settings, apply_settings, ray_namespace
from runtime.errors import (
    ConflictError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidRequestError,
    RequestTimeoutError,
    ScalableTopicsError,
    SegmentNotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
    UnavailableError,
    is_integer,
)
from runtime.names import _DESCRIPTOR, SegmentName, TopicName, validate_part
from runtime.operations import new_request_id
from runtime.rest import IDEMPOTENCY_KEY, REST_TIMEOUT_ENV, rest_timeout_s
from runtime.tls import server_context

log = logging.getLogger(__name__)

# --- request parsing ---------------------------------------------------------------------

_NAME_PARAMS = ("tenant", "namespace", "topic", "subscription", "consumer")
_SEGMENT_ID = re.compile(r"[0-9]{1,19}")


def _parse_path(match: Mapping[str, str]) -> dict[str, Any]:
    """Validate every path component before anything acts on the request."""
    values: dict[str, Any] = {}
    for key, raw in match.items():
        if key in ID_PARAMS:
            values[key] = _segment_id(key, raw)
        elif key in _NAME_PARAMS:
            values[key] = validate_part(key, raw)
        else:
            values[key] = raw
    if "descriptor" in values:  # its hash range is checked too, not only its shape
        _descriptor(topic_of(values), values["descriptor"])
    return values


def _descriptor(topic: TopicName, descriptor: str) -> SegmentName:
    """A malformed descriptor is a bad request (400); a well-formed one whose range no
    segment can have (start above end) names nothing, as an unknown id would (404)."""
    if not _DESCRIPTOR.fullmatch(descriptor):
        return SegmentName.from_descriptor(topic, descriptor)  # raises, saying the shape
    try:
        return SegmentName.from_descriptor(topic, descriptor)
    except InvalidNameError as err:
        raise SegmentNotFoundError(f"no segment of {topic} is {descriptor}: {err}") from None


def _segment_id(key: str, raw: str) -> int:
    if not _SEGMENT_ID.fullmatch(raw) or int(raw) > MAX_SEGMENT_ID:
        raise InvalidArgumentError(
            f"invalid {key} {raw!r}: must be an integer from 0 to {MAX_SEGMENT_ID}"
        )
    return int(raw)


async def _parse_body(request: web.Request, route: Route) -> Body:
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


def _parse_query(request: web.Request, route: Route) -> Query:
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
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
        for e in err.errors(include_url=False)
    )
    syntax = all(e["type"] == "json_invalid" for e in err.errors())
    cls = InvalidRequestError if syntax else InvalidArgumentError
    return cls(f"invalid {what}: {problems}. {_allowed(model, what)}")


def _allowed(model: type[BaseModel], what: str = "request body") -> str:
    """The fields a body or query string may have, from the model itself."""
    fields = [
        f"{field.alias or name} ({'required' if field.is_required() else 'optional'}"
        + (f", {field.description})" if field.description else ")")
        for name, field in model.model_fields.items()
    ]
    return f"Allowed: {'; '.join(fields)}" if fields else f"This endpoint takes no {what}"


# --- the aiohttp application ------------------------------------------------------------

SERVICE = web.AppKey("service", Service)
GUARD = web.AppKey("guard", Guard)
TIMEOUT = web.AppKey("timeout_s", float)


def create_app(
    service: Service, auth: Guard | None = None, timeout_s: float | None = None
) -> web.Application:
    """The REST application over ``service`` (``AdminServiceCaller``, or anything with
    its ``call``).

    ``auth`` (default this process's guard, which applies the cluster's stored
    policy) checks every route with a ``permission``; while the cluster has no
    policy the API is open, as a local cluster's is. Every request is answered
    within ``timeout_s`` (default ``runtime.rest.rest_timeout_s``).
    """
    app = web.Application(middlewares=[_json_errors])
    app[SERVICE] = service
    app[GUARD] = auth if auth is not None else guard()
    app[TIMEOUT] = rest_timeout_s() if timeout_s is None else timeout_s
    resources: dict[str, web.Resource] = {}
    for route in ROUTES:
        if route.path not in resources:
            resources[route.path] = app.router.add_resource(route.path)
        resources[route.path].add_route(route.method, _handler(route))
    add_console(app)
    return app


def _handler(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        limit_s = endpoint_timeout_s(route.endpoint, request.app[TIMEOUT])
        deadline = time.monotonic() + limit_s
        token = bearer_token(request.headers.get("Authorization"))
        path = _authorized_path(request, route, token)
        params = Params(
            path=path,
            query=_parse_query(request, route),
            body=await _parse_body(request, route),
            time_left_s=deadline - time.monotonic(),
            request_id=_idempotency_key(request),
        )
        call = _operation_call(request.app[SERVICE], route, token, params.request_id)
        result = await _by_deadline(request, deadline, limit_s, route.action(call, params))
        if route.status == 204:
            return web.Response(status=204)
        return web.json_response(result, status=route.status)

    return handle


def _operation_call(
    service: Service, route: Route, token: str | None, request_id: str
) -> Callable[..., Awaitable[Any]]:
    """The route's operation on the service as the requester, with the request's id when
    the operation takes one (``runtime.admin_api``); a meta endpoint calls nothing."""
    op = route.operation
    if op is None:
        return _no_operation
    extra = {"request_id": request_id} if op.request_id else {}
    return functools.partial(service.call, op.name, credential=token, **extra)


async def _no_operation(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("a meta endpoint runs no admin operation")


_KEY = re.compile(r"[\x21-\x7e]{1,64}")  # printable ASCII, no spaces


def _idempotency_key(request: web.Request) -> str:
    """The caller's ``Idempotency-Key``, else a fresh one: either way the same id goes
    with every retry of this request into the cluster, so a split or merge that
    committed before an actor restart is answered as completed, not refused."""
    key = request.headers.get(IDEMPOTENCY_KEY)
    if key is None:
        return new_request_id()
    if not _KEY.fullmatch(key):
        raise InvalidRequestError(
            f"the {IDEMPOTENCY_KEY} header must be 1 to 64 printable ASCII characters "
            "without spaces"
        )
    return key


async def _by_deadline(
    request: web.Request, deadline: float, limit_s: float, action: Awaitable[Any]
) -> Any:
    """The action's result, or ``RequestTimeoutError`` at ``deadline`` (``limit_s`` after
    the request arrived): the caller gets an answer, though the cluster may still finish
    what was asked."""
    try:
        return await asyncio.wait_for(action, max(deadline - time.monotonic(), 0.0))
    except TimeoutError:
        after = (
            "nothing was changed by this read; ask again"
            if request.method == "GET"
            else "what it asked for may still complete: read the resource to see its state"
        )
        whose = (
            "the operation's own time-out"
            if limit_s > request.app[TIMEOUT]
            else f"the gateway's time-out, {REST_TIMEOUT_ENV}"
        )
        raise RequestTimeoutError(
            f"{request.method} {request.path} did not finish within {limit_s:g}s ({whose}); {after}"
        ) from None


def _authorized_path(request: web.Request, route: Route, token: str | None) -> dict[str, Any]:
    """Who asks first (401), then whether they may act on this namespace (403).

    Both happen before the body is read or anything acts, so a refused request
    changes nothing.
    """
    if route.operation is None:  # the gateway's own meta endpoints, open to all
        return _parse_path(request.match_info)
    checks = request.app[GUARD]
    checks.authenticate(token)
    path = _parse_path(request.match_info)
    if route.permission is None:  # about the caller (a transaction it holds): no grant
        return path
    # Routes outside any namespace (the storage root, the policy) act on every namespace.
    scope = f"{path['tenant']}/{path['namespace']}" if "tenant" in path else "*"
    checks.check(token, route.permission, scope)
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


# --- the actor --------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_restarts=-1)
class AdminGateway:
    """The REST server for one port; a restarted incarnation binds the port again."""

    def __init__(self, host: str, port: int, settings: dict[str, str] | None = None) -> None:
        apply_settings(settings)
        self._host, self._port = host, port
        self._scheme = "http"
        # Ray runs an async actor's __init__ on the actor's event loop, so the
        # server starts here and every incarnation serves without being asked.
        self._serving = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> web.AppRunner:
        tls = server_context()  # a half-configured certificate fails the start, never plaintext
        self._scheme = "https" if tls is not None else "http"
        runner = web.AppRunner(create_app(AdminServiceCaller()))
        await runner.setup()
        await web.TCPSite(runner, self._host, self._port, ssl_context=tls).start()
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
        return f"{self._scheme}://{host}:{self._port}"


GATEWAY_NAME_PREFIX = "gateway:"


def gateway_actor_name(port: int) -> str:
    return f"{GATEWAY_NAME_PREFIX}{port}"


def start_gateway(
    port: int,
    host: str = "127.0.0.1",
    *,
    timeout_s: float = 60.0,
    existing: Literal["reuse", "refuse", "replace"] = "reuse",
) -> str:
    """Start (or find) the gateway for ``port`` and return its base URL once it serves.

    ``existing`` says what a gateway already serving ``port`` means: ``reuse`` it
    (the default), ``refuse`` (``ConflictError`` naming it; ``raytopics serve``), or
    ``replace`` it with a fresh one (``raytopics serve --replace``).

    The actor is pinned to the caller's node: the caller was told a loopback (or
    this node's) address, so the server must run where that address points. It
    serves HTTPS when this process has ``RAYTOPICS_TLS_CERT`` and ``_KEY``.

    With ``RAYTOPICS_AUTH_TOKENS_FILE`` set, that file's policy is first loaded
    into the cluster (``load_operator_policy``), and nothing starts if it cannot be.
    """
    if not is_integer(port, 1, 65535):
        raise InvalidArgumentError(f"port must be an integer from 1 to 65535, got {port!r}")
    rest_timeout_s()  # a bad setting is refused here, not by a gateway that cannot start
    running = running_gateway(port)
    if running is not None and existing == "refuse":
        raise ConflictError(
            f"a gateway already serves port {port} at {running} ({gateway_actor_name(port)}); "
            "use it, stop the program that started it, or replace it (raytopics serve --replace)"
        )
    if running is not None and existing == "replace":
        stop_gateway(port)
    load_operator_policy()
    handle = AdminGateway.options(
        name=gateway_actor_name(port),
        namespace=ray_namespace(),
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        ),
    ).remote(host, port, settings=actor_settings())
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


def load_operator_policy() -> dict[str, Any] | None:
    """Load the policy of ``RAYTOPICS_AUTH_TOKENS_FILE`` (when set) into the cluster, as
    the holder of ``RAYTOPICS_TOKEN``: allowed while the cluster has no policy, else
    only with admin on ``*``. Returns the policy's status, ``None`` without a file.

    The file is read here and only digests go on; the policy already in force is
    not stored again, so a gateway restarted with the same file changes nothing.
    """
    path = os.environ.get(TOKENS_FILE_ENV)
    if not path:
        return None
    config = AuthPolicy.from_file(path).to_config()
    try:
        return AdminServiceCaller().call_blocking("load_auth", config, credential=default_token())
    except (UnauthenticatedError, UnauthorizedError, InvalidArgumentError) as err:
        raise type(err)(
            f"{TOKENS_FILE_ENV}={path} was not loaded into the cluster: {err.message}. "
            f"Loading a policy over an existing one takes a token with admin on '*' in "
            f"{TOKEN_ENV}; without {TOKENS_FILE_ENV} the cluster keeps its policy"
        ) from None


def running_gateway(port: int, timeout_s: float = 10.0) -> str | None:
    """The URL of the gateway serving ``port`` in this cluster, ``None`` if there is none."""
    try:
        handle = ray.get_actor(gateway_actor_name(port), namespace=ray_namespace())
        return ray.get(handle.url.remote(), timeout=timeout_s)
    except (ValueError, RayActorError, GetTimeoutError):
        return None


def running_gateways() -> dict[int, str]:
    """The URL of every gateway this cluster runs, by port."""
    names = named_actors(GATEWAY_NAME_PREFIX)
    ports = [int(name.removeprefix(GATEWAY_NAME_PREFIX)) for name in names]
    return {port: url for port in ports if (url := running_gateway(port)) is not None}


def gateway_id(port: int) -> str | None:
    """The Ray actor id of the gateway serving ``port`` (``None`` if there is none): what
    a program that started one keeps, to stop that gateway and never a successor."""
    try:
        handle = ray.get_actor(gateway_actor_name(port), namespace=ray_namespace())
    except ValueError:
        return None
    return handle._actor_id.hex()


def stop_gateway(port: int, *, timeout_s: float = 10.0, only: str | None = None) -> bool:
    """Kill the gateway of ``port`` and wait until it is gone (so the port is free).

    With ``only`` (a ``gateway_id``), a gateway that is not that one is left alone.
    Returns False if none was stopped.
    """
    try:
        handle = ray.get_actor(gateway_actor_name(port), namespace=ray_namespace())
    except ValueError:
        return False
    if only is not None and handle._actor_id.hex() != only:
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
