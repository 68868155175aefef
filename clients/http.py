"""``AdminHttpClient``: the ``ScalableTopicsAdmin`` API spoken over the REST gateway.

Same method names, signatures, return types and typed exceptions as the Ray
client, so code (and the CLI) can switch transports by swapping one object. It
needs no Ray connection: the gateway's JSON error body carries the error's
``code``, which is mapped back to the class in ``runtime.errors``.

Its methods are ``clients.admin_calls``'s; each call's REST endpoint (method, path,
where each argument travels, whether it sends an ``Idempotency-Key``, how long the
gateway may take) comes from the Admin API table both sides share
(``runtime.admin_api``). A call waits for the gateway's answer a little longer than the
gateway waits for the cluster, so a slow operation is answered by the gateway's 504
(``RequestTimeoutError``, saying a change may still complete) rather than by a dropped
connection; a gateway that does not answer even then raises the same error. An
``https://`` gateway's certificate is verified, host name included, against ``ca``
(default ``RAYTOPICS_TLS_CA``); with a CA configured a plain ``http://`` URL is
refused, so a token is never sent in the clear where the operator asked for TLS.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import aiohttp

from clients._loop import background_loop, with_sync_twins
from clients.admin_calls import AdminCall, AdminCalls
from runtime.admin_api import Endpoint, endpoint_for, endpoint_operation, endpoint_timeout_s
from runtime.auth import default_token
from runtime.errors import (
    InvalidArgumentError,
    RequestTimeoutError,
    ScalableTopicsError,
    UnavailableError,
    error_from_code,
)
from runtime.names import SegmentName, TopicName, parse_namespace, validate_part
from runtime.operations import CompletedOperation, new_request_id
from runtime.rest import IDEMPOTENCY_KEY
from runtime.tls import CA_ENV, client_context

T = TypeVar("T")

# Waited past the gateway's time-out for the gateway's own answer (its 504) to arrive.
ANSWER_GRACE_S = 5.0


@with_sync_twins
class AdminHttpClient(AdminCalls):
    """Administer scalable topics through an ``AdminGateway`` (the Admin Client API of
    ``clients.admin_calls``); every method has an ``_async`` twin.

    aiohttp sessions belong to the event loop that created them, so the one
    session lives on the shared background loop: sync twins already run there,
    and async calls from any other loop are bridged onto it.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30,
        token: str | None = None,
        ca: str | None = None,
    ) -> None:
        """``timeout_s``: the gateway's time-out (``RAYTOPICS_REST_TIMEOUT_S`` there, 30 s
        by default); an operation with a longer one of its own is waited for that long,
        each with ``ANSWER_GRACE_S`` more for the gateway's answer. ``token`` (default
        ``RAYTOPICS_TOKEN``) goes out as ``Authorization: Bearer``; ``ca`` (default
        ``RAYTOPICS_TLS_CA``) is the CA file an ``https://`` gateway's certificate must
        chain to (else the system's trust store)."""
        self.url = url.rstrip("/")
        self._token = token if token is not None else default_token()
        self._ssl = _tls_context(self.url, ca)
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    # --- lifecycle of the client itself --------------------------------------------------

    async def close_async(self) -> None:
        """Close the HTTP session (a later call opens a new one)."""
        await _on_background_loop(self._close_session())

    def __enter__(self) -> AdminHttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> AdminHttpClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close_async()

    # --- transport -----------------------------------------------------------------------

    async def _run(self, call: AdminCall) -> Any:
        """The call as a request to its endpoint (``runtime.admin_api.endpoint_for``): the
        path's fields, body and query from the call's arguments as the endpoint declares
        them, a fresh ``Idempotency-Key`` when its operation takes a request id (sent again
        unchanged, it is applied once); the answer in the shape the Ray client returns."""
        point = endpoint_for(call.operation, call.args)
        path, body, params = _request_parts(point, call.args)
        op = endpoint_operation(point)
        key = new_request_id() if op is not None and op.request_id else None
        try:
            data = None if body is None else json.dumps(body)
        except (TypeError, ValueError) as err:
            raise InvalidArgumentError(f"request body is not JSON-serializable: {err}") from None
        wait_s = endpoint_timeout_s(point, self._timeout_s)
        request = (point.method, path, data, params, key)
        answer = await _on_background_loop(self._request(*request, wait_s=wait_s))
        shaped = _ANSWERS.get(point.operation_id)
        return answer if shaped is None else shaped(answer)

    async def _request(
        self,
        method: str,
        path: str,
        data: str | None,
        params: dict[str, str] | None,
        key: str | None,
        *,
        wait_s: float,
    ) -> Any:
        """One HTTP exchange on the background loop, given ``wait_s`` (the gateway's
        time-out for it) and ``ANSWER_GRACE_S``; errors come back typed."""
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if key is not None:
            headers[IDEMPOTENCY_KEY] = key
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        timeout = aiohttp.ClientTimeout(total=wait_s + ANSWER_GRACE_S)
        try:
            async with self._session_here().request(
                method,
                self.url + path,
                data=data,
                params=params,
                headers=headers,
                ssl=self._ssl,
                timeout=timeout,
            ) as response:
                status, text = response.status, await response.text()
        except aiohttp.ClientConnectorCertificateError as err:
            raise UnavailableError(
                f"the admin gateway at {self.url} is not trusted: {err.certificate_error}; "
                f"give the CA that signed its certificate (ca= or {CA_ENV})"
            ) from None
        except TimeoutError:
            raise RequestTimeoutError(
                f"{method} {path}: no answer from the admin gateway at {self.url} within "
                f"{timeout.total:g}s; what it asked for may still complete: read the resource "
                "to see its state"
            ) from None
        except aiohttp.ClientError as err:
            raise UnavailableError(
                f"cannot reach the admin gateway at {self.url}: {err or type(err).__name__}"
            ) from None
        if status >= 400:
            raise error_from_response(status, text)
        return json.loads(text) if text else None

    def _session_here(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


# --- typed errors back from JSON --------------------------------------------------------


def error_from_response(status: int, text: str) -> ScalableTopicsError:
    """The typed exception an error response stands for.

    An unknown code (a newer gateway) or a non-JSON body (a proxy in between)
    still yields the broad class of the HTTP status, so callers catching
    ``NotFoundError`` or ``ConflictError`` keep working.
    """
    try:
        payload = json.loads(text)
        code, message = payload["error"], payload["message"]
    except (ValueError, TypeError, KeyError):
        code, message = None, f"HTTP {status}: {' '.join(text.split())[:200] or 'no body'}"
    return error_from_code(code, str(message), status)


# --- helpers ----------------------------------------------------------------------------


def _tls_context(url: str, ca: str | None) -> ssl.SSLContext | bool:
    """How to reach ``url``: a verifying context for ``https://`` (``True``: the system's
    trust store), ``True`` for ``http://`` (nothing to verify) unless a CA says TLS."""
    context = client_context(ca)
    if url.startswith("https://"):
        return context if context is not None else True
    if context is not None:
        raise InvalidArgumentError(
            f"{url} is plain HTTP while a TLS CA is configured ({ca or CA_ENV}): "
            "use the gateway's https:// URL, so the token does not travel in the clear"
        )
    return True


def _request_parts(
    point: Endpoint, args: Mapping[str, Any]
) -> tuple[str, Any, dict[str, str] | None]:
    """``point``'s path, JSON body (``None``: none) and query for a call with ``args``,
    names checked here as the cluster checks them (the same typed errors, before any
    I/O); an argument the endpoint does not carry is a programming error."""
    fields: dict[str, Any] = {}
    for parameter in point.path_parameters:
        fields |= _PATH_FIELDS[parameter](args[parameter])
    if point.body_is is not None:
        body = args[point.body_is]
    else:
        given = {name: args.get(parameter) for name, parameter in point.body.items()}
        body = {name: value for name, value in given.items() if value is not None} or None
    query = {name: _query_value(args[p]) for name, p in point.query.items() if p in args}
    left = set(args) - point.carries()
    if left:
        raise LookupError(f"{point.operation_id} carries no {sorted(left)}")
    return point.path.format(**fields), body, query or None


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _namespace_fields(namespace: str) -> dict[str, str]:
    parse_namespace(namespace)  # raises what ScalableTopicsAdmin raises
    tenant, ns = namespace.split("/")
    return {"tenant": tenant, "namespace": ns}


def _topic_fields(topic: str) -> dict[str, str]:
    name = TopicName.parse(topic)
    return {"tenant": name.tenant, "namespace": name.namespace, "topic": name.topic}


def _segment_fields(segment_topic: str) -> dict[str, str]:
    segment = SegmentName.parse(segment_topic)
    return {**_topic_fields(str(segment.topic)), "descriptor": segment.descriptor}


def _subscription_fields(subscription: str) -> dict[str, str]:
    validate_part("subscription", subscription)
    return {"subscription": subscription}


# How each path parameter (``runtime.admin_api.PATH_PARAMETERS``) fills its path fields.
_PATH_FIELDS: Mapping[str, Callable[[Any], dict[str, Any]]] = {
    "segment": _segment_fields,
    "name": _topic_fields,
    "namespace": _namespace_fields,
    "subscription": _subscription_fields,
    "consumer": lambda value: {"consumer": validate_part("consumer name", value)},
    "segment_id": lambda value: {"segmentId": value},
    "segment_id1": lambda value: {"segmentId1": value},
    "segment_id2": lambda value: {"segmentId2": value},
    "txn_id": lambda value: {"txnId": validate_part("transaction id", value)},
}


def _completed(reply: dict[str, Any]) -> dict[str, Any]:
    """The operation exactly as the Ray client returns it (tuples, not JSON lists)."""
    return CompletedOperation.model_validate(reply).model_dump(by_alias=True)


# Answers whose REST shape differs from what the admin service returns.
_ANSWERS: Mapping[str, Callable[[Any], Any]] = {
    "splitSegment": _completed,
    "mergeSegments": _completed,
    "terminateSegment": lambda reply: reply["endOffset"],
}


async def _on_background_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the loop that owns the session, from whichever loop awaits it."""
    loop = background_loop().loop
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
