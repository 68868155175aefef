"""``AdminHttpClient``: the ``ScalableTopicsAdmin`` API spoken over the REST gateway.

Same method names, signatures, return types and typed exceptions as the Ray
client, so code (and the CLI) can switch transports by swapping one object. It
needs no Ray connection: the gateway's JSON error body carries the error's
``code``, which is mapped back to the class in ``runtime.errors``.

Each method's REST endpoint (method, path, whether it sends an ``Idempotency-Key``,
how long the gateway may take) comes from the Admin API table both sides share
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
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp

from clients._ray import background_loop, with_sync_twins
from runtime.admin_api import (
    endpoint,
    endpoint_operation,
    endpoint_timeout_s,
    merged_ids,
    split_hashes,
)
from runtime.auth import AuthPolicy, default_token
from runtime.errors import (
    InvalidArgumentError,
    RequestTimeoutError,
    ScalableTopicsError,
    UnavailableError,
    error_from_code,
)
from runtime.layout import SegmentLayout
from runtime.names import SegmentName, TopicName, parse_namespace, validate_part
from runtime.operations import CompletedOperation, new_request_id
from runtime.policy import TopicPolicy
from runtime.readiness import DEFAULT_READY_TIMEOUT_S, wait_until_ready
from runtime.rest import IDEMPOTENCY_KEY
from runtime.subscription import DEFAULT_GRACE_S, ResetTo, StartPosition, reset_ms, time_ms
from runtime.tls import CA_ENV, client_context

T = TypeVar("T")

# Waited past the gateway's time-out for the gateway's own answer (its 504) to arrive.
ANSWER_GRACE_S = 5.0


@with_sync_twins
class AdminHttpClient:
    """Administer scalable topics through an ``AdminGateway``; every method has an
    ``_async`` twin.

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

    # --- reads ---------------------------------------------------------------------------

    async def list_scalable_topics_async(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` as ``topic://`` names."""
        return await self._rest("listScalableTopics", _namespace(namespace))

    async def get_metadata_async(self, topic: str) -> dict[str, Any]:
        """The topic's ``ScalableTopicMetadata`` document (its public JSON shape)."""
        return await self._rest("getMetadata", _topic(topic))

    async def get_layout_async(self, topic: str) -> SegmentLayout:
        return SegmentLayout.from_dict(await self.get_metadata_async(topic))

    async def list_subscriptions_async(self, topic: str) -> list[str]:
        return await self._rest("listSubscriptions", _topic(topic))

    async def get_stats_async(self, topic: str) -> dict[str, Any]:
        """Segment counts, per-segment size/records, per-subscription backlog and consumers."""
        return await self._rest("getStats", _topic(topic))

    async def get_status_async(self, topic: str) -> dict[str, Any]:
        """Whether every segment of the topic has a running actor (``state`` ``ready`` or
        ``starting``, with the segments not running yet)."""
        return await self._rest("getStatus", _topic(topic))

    async def wait_until_ready_async(
        self, topic: str, timeout_s: float = DEFAULT_READY_TIMEOUT_S
    ) -> dict[str, Any]:
        """Wait until every segment of the topic runs (``TopicNotReadyError`` after
        ``timeout_s``); each request waits on the gateway for at most ``MAX_WAIT_S``."""
        return await wait_until_ready(
            lambda wait_s: self._rest(
                "getStatus", _topic(topic), params={"waitS": f"{wait_s:.3f}"}
            ),
            timeout_s,
        )

    # --- topic lifecycle -----------------------------------------------------------------

    async def create_scalable_topic_async(
        self, topic: str, num_segments: int, properties: dict[str, str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"numSegments": num_segments}
        if properties is not None:
            body["properties"] = properties
        return await self._rest("createScalableTopic", _topic(topic), body=body)

    async def delete_scalable_topic_async(self, topic: str) -> None:
        await self._rest("deleteScalableTopic", _topic(topic))

    # --- subscriptions -------------------------------------------------------------------

    async def create_subscription_async(
        self,
        topic: str,
        subscription: str,
        position: StartPosition = "earliest",
        session_grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        """Create on every segment with its cursors at ``position``.

        ``session_grace_s``: how long a disconnected stream consumer keeps its
        segments before they move to the others.
        """
        body = {"position": position, "sessionGraceS": session_grace_s}
        await self._rest("createSubscription", _subscription(topic, subscription), body=body)

    async def delete_subscription_async(self, topic: str, subscription: str) -> None:
        await self._rest("deleteSubscription", _subscription(topic, subscription))

    async def reset_subscription_async(
        self, topic: str, subscription: str, to: ResetTo
    ) -> dict[str, Any]:
        where = _subscription(topic, subscription)
        return await self._rest("resetSubscription", where, body={"to": reset_ms(to)})

    async def position_at_time_async(self, topic: str, when: ResetTo) -> dict[str, Any]:
        body = {"startingTimestampMs": time_ms(when)}
        answer = await self._rest("planStreamStart", _topic(topic), body=body)
        position = answer["position"]
        return {"next": dict(position["next"]), "finished": list(position["finished"])}

    async def clear_backlog_async(self, topic: str, subscription: str) -> dict[str, Any]:
        return await self.reset_subscription_async(topic, subscription, "latest")

    # --- layout changes ------------------------------------------------------------------

    async def split_segment_async(
        self,
        topic: str,
        segment_id: int,
        at: int | Sequence[int] | None = None,
        parts: int | None = None,
    ) -> dict[str, Any]:
        """Split an active segment in two halves, with a child starting at each ``at``
        (one hash or ascending ones: a key's hash is ``runtime.hashing.key_hash``), or
        into ``parts`` near-equal children; returns the completed operation."""
        given = {"at": split_hashes(at), "parts": parts}
        body = {k: v for k, v in given.items() if v is not None} or None
        found = await self._rest("splitSegment", _topic(topic), body=body, segmentId=segment_id)
        return _completed(found)

    async def merge_segments_async(
        self,
        topic: str,
        segment_id1: int | Sequence[int],
        segment_id2: int | None = None,
        *more_segment_ids: int,
    ) -> dict[str, Any]:
        """Merge two adjacent active segments, or a run of neighbouring ones (up to 64, in
        any order: ``merge_segments(topic, [4, 5, 6])`` or ``(topic, 4, 5, 6)``);
        returns the completed operation."""
        first, second, *more = merged_ids(segment_id1, segment_id2, more_segment_ids)
        ids = {"segmentId1": first, "segmentId2": second}
        body = {"moreSegmentIds": more} if more else None
        return _completed(await self._rest("mergeSegments", _topic(topic), body=body, **ids))

    # --- operating policy (autoscale, retention) ------------------------------------------

    async def get_policy_async(self, topic: str) -> dict[str, Any]:
        return await self._rest("getPolicy", _topic(topic))

    async def set_policy_async(self, topic: str, policy: dict[str, Any]) -> dict[str, Any]:
        """Replace the topic's policy; returns it as stored (defaults filled in)."""
        TopicPolicy.parse(policy)  # the same typed error the Ray client raises, before any I/O
        return await self._rest("setPolicy", _topic(topic), body=policy)

    # --- segments (docs/reference/admin.md) ----------------------------------------------

    async def create_segment_async(
        self, segment_topic: str, subscriptions: list[str] | None = None
    ) -> None:
        body = {"subscriptions": list(subscriptions or [])}
        await self._rest("createSegment", _segment(segment_topic), body=body)

    async def terminate_segment_async(self, segment_topic: str, force: bool = False) -> int:
        """Seal a segment; returns its end offset."""
        params = {"force": "true" if force else "false"}
        reply = await self._rest("terminateSegment", _segment(segment_topic), params=params)
        return reply["endOffset"]

    async def delete_segment_async(self, segment_topic: str, force: bool = False) -> None:
        params = {"force": "true" if force else "false"}
        await self._rest("deleteSegment", _segment(segment_topic), params=params)

    # --- namespace default policy ---------------------------------------------------------

    async def get_namespace_policy_async(self, namespace: str) -> dict[str, Any]:
        return await self._rest("getNamespacePolicy", _namespace(namespace))

    async def set_namespace_policy_async(
        self, namespace: str, policy: dict[str, Any]
    ) -> dict[str, Any]:
        """Replace the namespace's default policy; returns it as stored."""
        TopicPolicy.parse(policy)
        return await self._rest("setNamespacePolicy", _namespace(namespace), body=policy)

    # --- limits -------------------------------------------------------------------------

    async def get_namespace_limits_async(self, namespace: str) -> dict[str, int]:
        """The limits in force in ``tenant/namespace`` (defaults plus its overrides)."""
        return await self._rest("getNamespaceLimits", _namespace(namespace))

    async def set_namespace_limits_async(self, namespace: str, **limits: int) -> dict[str, int]:
        """Override limits (``max_message_bytes=...``) for one namespace; returns those in force."""
        return await self._rest("setNamespaceLimits", _namespace(namespace), body=limits)

    # --- storage: check and recover ------------------------------------------------------

    async def check_storage_async(self, delete: bool = False) -> dict[str, Any]:
        """Storage no live metadata names; with ``delete`` that storage removed."""
        if delete:
            return await self._rest("deleteOrphanedStorage", {})
        return await self._rest("checkStorage", {})

    async def recover_topic_async(
        self, topic: str, incarnation: str | None = None
    ) -> dict[str, Any]:
        """Rebuild a topic whose metadata is lost from its storage."""
        body = {} if incarnation is None else {"incarnation": incarnation}
        return await self._rest("recoverTopic", _topic(topic), body=body)

    # --- the cluster's authentication policy (admin on every namespace, "*") -----------

    async def load_auth_async(self, document: dict[str, Any]) -> dict[str, Any]:
        """Make ``document`` the cluster's policy; plain tokens are hashed here, so only
        digests go over the wire."""
        config = AuthPolicy.from_config(document).to_config()
        return await self._rest("loadAuth", {}, body=config)

    async def disable_auth_async(self) -> dict[str, Any]:
        return await self._rest("disableAuth", {})

    async def auth_status_async(self) -> dict[str, Any]:
        return await self._rest("getAuthStatus", {})

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

    async def _rest(
        self,
        operation_id: str,
        fields: dict[str, Any],
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        **path_values: Any,
    ) -> Any:
        """Call the endpoint ``operation_id`` (``runtime.admin_api``): its method, its path
        filled from ``fields`` and ``path_values``, and a fresh ``Idempotency-Key`` when
        its operation takes a request id (sent again unchanged, it is applied once)."""
        point = endpoint(operation_id)
        op = endpoint_operation(point)
        key = new_request_id() if op is not None and op.request_id else None
        try:
            data = None if body is None else json.dumps(body)
        except (TypeError, ValueError) as err:
            raise InvalidArgumentError(f"request body is not JSON-serializable: {err}") from None
        path = point.path.format(**fields, **path_values)
        wait_s = endpoint_timeout_s(point, self._timeout_s)
        request = (point.method, path, data, params, key)
        return await _on_background_loop(self._request(*request, wait_s=wait_s))

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


def _namespace(namespace: str) -> dict[str, str]:
    """A path's namespace fields from ``tenant/namespace``, validated as the Ray client does."""
    parse_namespace(namespace)  # raises what ScalableTopicsAdmin raises
    tenant, ns = namespace.split("/")
    return {"tenant": tenant, "namespace": ns}


def _topic(topic: str) -> dict[str, str]:
    """A path's topic fields from a ``topic://`` name, validated as the Ray client does."""
    name = TopicName.parse(topic)
    return {"tenant": name.tenant, "namespace": name.namespace, "topic": name.topic}


def _completed(reply: dict[str, Any]) -> dict[str, Any]:
    """The operation exactly as the Ray client returns it (tuples, not JSON lists)."""
    return CompletedOperation.model_validate(reply).model_dump(by_alias=True)


def _subscription(topic: str, subscription: str) -> dict[str, str]:
    validate_part("subscription", subscription)
    return {**_topic(topic), "subscription": subscription}


def _segment(segment_topic: str) -> dict[str, str]:
    segment = SegmentName.parse(segment_topic)
    return {**_topic(str(segment.topic)), "descriptor": segment.descriptor}


async def _on_background_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the loop that owns the session, from whichever loop awaits it."""
    loop = background_loop().loop
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
