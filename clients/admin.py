"""``ScalableTopicsAdmin``: the Admin Client API, carried out by the cluster.

The client decides nothing: each call goes, with the caller's token, to the
cluster's admin service (``actors.admin.service``), which checks it against the
policy stored in the cluster and then reads the metadata or asks the topic's
controller. So a process without the operator's policy, or with a policy of
its own, gets exactly what its token allows there, and the same typed errors
as every other way in (REST, the CLI).

Calls ride out a restart of the service and of a topic's controller for
``controller_restart_timeout_s``; a split or merge is sent again under the same
request id, which the controller recognizes, so a retry never applies it twice.
No call waits forever: each waits as long as the REST gateway would for the same
operation (``runtime.admin_api``), then raises ``RequestTimeoutError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from actors.admin.caller import AdminServiceCaller
from actors.admin.service import DEFAULT_RESTART_TIMEOUT_S, DEFAULT_SEGMENT_TIMEOUT_S
from clients._ray import with_sync_twins
from runtime.admin_api import merged_ids, operation, split_hashes
from runtime.auth import AuthPolicy, default_token
from runtime.config import topic_settings
from runtime.connect import connect
from runtime.errors import RequestTimeoutError
from runtime.layout import SegmentLayout
from runtime.operations import new_request_id
from runtime.readiness import DEFAULT_READY_TIMEOUT_S, wait_until_ready
from runtime.rest import DEFAULT_REST_TIMEOUT_S
from runtime.subscription import DEFAULT_GRACE_S, ResetTo, StartPosition, reset_ms, time_ms


@with_sync_twins
class ScalableTopicsAdmin:
    """Administer scalable topics; every method has an ``_async`` twin."""

    def __init__(
        self,
        *,
        address: str | None = None,
        namespace: str | None = None,
        controller_restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        segment_timeout_s: float = DEFAULT_SEGMENT_TIMEOUT_S,
        token: str | None = None,
        request_timeout_s: float = DEFAULT_REST_TIMEOUT_S,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) is presented with every call; one the
        cluster does not know fails here (``UnauthenticatedError``), not at first use.
        While the cluster has no policy, no token is needed. ``request_timeout_s``: how
        long a call waits for its answer, as the REST gateway's time-out does (an
        operation with a longer time-out of its own, such as a split, waits that long);
        then ``RequestTimeoutError``, and a change asked for may still complete."""
        self._token = token if token is not None else default_token()
        connect(address, namespace=namespace)
        self._restart_timeout_s = controller_restart_timeout_s
        self._segment_timeout_s = segment_timeout_s
        self._request_timeout_s = request_timeout_s
        self._service = AdminServiceCaller(controller_restart_timeout_s)
        self._service.call_blocking("whoami", credential=self._token)

    # --- reads ---------------------------------------------------------------------

    async def list_scalable_topics_async(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` as ``topic://`` names."""
        return await self._call("list_scalable_topics", namespace)

    async def get_metadata_async(self, topic: str) -> dict[str, Any]:
        """The topic's ``ScalableTopicMetadata`` document (its public JSON shape)."""
        return await self._call("get_metadata", topic)

    async def get_layout_async(self, topic: str) -> SegmentLayout:
        return SegmentLayout.from_dict(await self.get_metadata_async(topic))

    async def list_subscriptions_async(self, topic: str) -> list[str]:
        return await self._call("list_subscriptions", topic)

    async def get_stats_async(self, topic: str) -> dict[str, Any]:
        """Segment counts, per-segment size/records, per-subscription backlog and consumers.

        Backlog is a bulk read over the whole DAG: a segment that cannot answer
        within ``segment_timeout_s`` makes this raise ``UnavailableSegmentsError``
        rather than under-report.
        """
        return await self._call("get_stats", topic, segment_timeout_s=self._segment_timeout_s)

    async def get_status_async(self, topic: str) -> dict[str, Any]:
        """Whether every segment of the topic has a running actor: ``{"state": "ready" |
        "starting", "segments", "running", "notRunning": [segment ids]}``. A created
        topic's segments start in the background; a client using one early waits for it."""
        return await self._call("topic_status", topic)

    async def wait_until_ready_async(
        self, topic: str, timeout_s: float = DEFAULT_READY_TIMEOUT_S
    ) -> dict[str, Any]:
        """Wait until every segment of the topic runs; returns ``get_status``'s answer, or
        raises ``TopicNotReadyError`` naming the segments still down after ``timeout_s``."""
        return await wait_until_ready(
            lambda wait_s: self._call("topic_status", topic, wait_s), timeout_s
        )

    # --- topic lifecycle --------------------------------------------------------------

    async def create_scalable_topic_async(
        self, topic: str, num_segments: int, properties: dict[str, str] | None = None
    ) -> dict[str, Any]:
        return await self._control(
            "create_scalable_topic", topic, num_segments, properties, settings=topic_settings()
        )

    async def delete_scalable_topic_async(self, topic: str) -> None:
        await self._control("delete_scalable_topic", topic)

    # --- subscriptions ------------------------------------------------------------------

    async def create_subscription_async(
        self,
        topic: str,
        subscription: str,
        position: StartPosition = "earliest",
        session_grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        """Create on every segment (active and sealed) with its cursors at ``position``.

        ``session_grace_s``: how long a disconnected stream consumer keeps its
        segments before they move to the others.
        """
        await self._control("create_subscription", topic, subscription, position, session_grace_s)

    async def delete_subscription_async(self, topic: str, subscription: str) -> None:
        await self._control("delete_subscription", topic, subscription)

    async def reset_subscription_async(
        self, topic: str, subscription: str, to: ResetTo
    ) -> dict[str, Any]:
        """Move ``subscription`` to ``to`` on every segment of the DAG: ``"earliest"``,
        ``"latest"``, or the first message published at or after a time (a timezone-aware
        ``datetime``, or epoch milliseconds). Segments that end before the time count as
        finished; parents still come before children. Refused (``ConflictError``, 409)
        while stream consumers of the subscription are registered. Returns each
        segment's new position, the finished segments, and ``inTheFuture`` when the time
        is still to come (every cursor then at its segment's end)."""
        return await self._control("reset_subscription", topic, subscription, reset_ms(to))

    async def position_at_time_async(self, topic: str, when: ResetTo) -> dict[str, Any]:
        """Where a reader starts to get every message published at or after ``when`` (a
        timezone-aware ``datetime`` or epoch milliseconds) and none before:
        ``{"next": {segment id: offset}, "finished": [segment ids]}``, the first such
        offset of each segment (a binary search of its publish times) and the segments
        that end before it. ``Checkpoint.at_timestamp`` builds on it. Needs ``consume``."""
        answer = await self._call("stream_initial", topic, None, time_ms(when))
        position = answer["position"]
        return {"next": dict(position["next"]), "finished": list(position["finished"])}

    async def clear_backlog_async(self, topic: str, subscription: str) -> dict[str, Any]:
        """Acknowledge everything the subscription has not yet: nothing is left to
        receive (a reset to ``"latest"``)."""
        return await self.reset_subscription_async(topic, subscription, "latest")

    # --- layout changes -----------------------------------------------------------------

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
        return await self._control("split_segment", topic, segment_id, split_hashes(at), parts)

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
        return await self._control("merge_segments", topic, first, second, more or None)

    # --- operating policy (autoscale, retention; see runtime.policy) --------------------

    async def get_policy_async(self, topic: str) -> dict[str, Any]:
        """The topic's policy; parts that are not set are ``None`` (off)."""
        return await self._call("get_policy", topic)

    async def set_policy_async(self, topic: str, policy: dict[str, Any]) -> dict[str, Any]:
        """Replace the topic's policy (``{"autoscale": {...}, "retention": {...}}``);
        validated first, stored by the controller; returns it as stored."""
        return await self._control("set_policy", topic, policy)

    # --- segments (routed through the controller) -------------

    async def create_segment_async(
        self, segment_topic: str, subscriptions: list[str] | None = None
    ) -> None:
        await self._control("create_segment", segment_topic, subscriptions)

    async def terminate_segment_async(self, segment_topic: str, force: bool = False) -> int:
        """Seal a segment of the layout; returns its end offset. An ACTIVE one only with
        ``force``: producers to its range then stall until a split or merge replaces it."""
        return await self._control("terminate_segment", segment_topic, force)

    async def delete_segment_async(self, segment_topic: str, force: bool = False) -> None:
        await self._control("delete_segment", segment_topic, force)

    # --- namespace default policy ---------------------------------------------------------

    async def get_namespace_policy_async(self, namespace: str) -> dict[str, Any]:
        """The policy ``tenant/namespace``'s topics follow where their own sets nothing."""
        return await self._call("get_namespace_policy", namespace)

    async def set_namespace_policy_async(
        self, namespace: str, policy: dict[str, Any]
    ) -> dict[str, Any]:
        """Replace the namespace's default policy; each of its parts (``autoscale``,
        ``retention``, ``tiering``) applies to every topic of the namespace whose own
        policy leaves that part unset. Returns it as stored."""
        return await self._call("set_namespace_policy", namespace, policy)

    # --- limits -------------------------------------------------------------------------

    async def get_namespace_limits_async(self, namespace: str) -> dict[str, int]:
        """The limits in force in ``tenant/namespace`` (defaults plus its overrides)."""
        return await self._call("get_namespace_limits", namespace)

    async def set_namespace_limits_async(self, namespace: str, **limits: int) -> dict[str, int]:
        """Override limits (``max_message_bytes=...``) for one namespace; returns those in force.

        The whole resulting set is validated before it is stored. Controllers apply
        it at once; running segments and producers within 2 s (segments re-read limits at
        most that often, ``runtime.limits.LiveLimits``; producers ask the cluster again,
        ``clients._limits.ClusterLimits``).
        """
        return await self._call("set_namespace_limits", namespace, limits)

    # --- storage: what outlives metadata (storage.topic_storage) ----------------------

    async def check_storage_async(self, delete: bool = False) -> dict[str, Any]:
        """Storage under the storage root that no live metadata names, and with
        ``delete`` that storage removed.

        Each orphaned incarnation is listed with its topic, incarnation, segments,
        bytes and last write: a deleted topic's leftovers, or a topic whose
        metadata was lost (``recover_topic`` can bring it back). Storage written
        by another deployment (another Ray namespace) sharing the root is listed
        apart and never deleted. Needs ``admin`` on every namespace (``*``).
        """
        return await self._call("check_storage", delete)

    async def recover_topic_async(
        self, topic: str, incarnation: str | None = None
    ) -> dict[str, Any]:
        """Rebuild a topic whose metadata is lost from its storage: the DAG (finishing
        a split or merge the loss interrupted), its subscriptions and their cursors,
        its policy and properties.

        Refused, with nothing changed, while the topic has live metadata, and when
        storage of several incarnations exists for the name and ``incarnation``
        does not say which (the error lists them).
        """
        return await self._control("recover_topic", topic, incarnation, settings=topic_settings())

    # --- the cluster's authentication policy (admin on every namespace, "*") -----------

    async def load_auth_async(self, document: dict[str, Any]) -> dict[str, Any]:
        """Make ``document`` (the token document, see ``runtime.auth``) the cluster's
        policy; returns ``auth_status()``. A malformed document is refused whole. Plain
        tokens are hashed here: only their digests leave this process.

        While authentication is off anyone may load the first policy; after that it
        takes admin on ``*``. A token left out of the document is refused everywhere
        within seconds (revocation); a new token for a principal works as soon."""
        config = AuthPolicy.from_config(document).to_config()
        return await self._call("load_auth", config)

    async def disable_auth_async(self) -> dict[str, Any]:
        """Turn authentication off (anyone who reaches the cluster may do anything)."""
        return await self._call("disable_auth")

    async def auth_status_async(self) -> dict[str, Any]:
        """``{"enabled", "version", "updatedAtMs", "principals": [{"principal",
        "sha256Prefix", "grants"}]}``: never a token, only 8 hex digits of its digest."""
        return await self._call("auth_status")

    # --- internals ------------------------------------------------------------------------

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The admin service's ``method`` with this client's token, and a fresh request id
        when the operation takes one (``runtime.admin_api``): the service's retries
        after a restart send the same id, so the operation is applied once."""
        op = operation(method)
        if op.request_id:
            kwargs.setdefault("request_id", new_request_id())
        wait_s = op.rest_timeout_s(self._request_timeout_s)
        try:
            async with asyncio.timeout(wait_s) as deadline:
                return await self._service.call(method, *args, credential=self._token, **kwargs)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise RequestTimeoutError(
                f"{method}: no answer from the cluster's admin service within {wait_s:g}s; "
                "what it asked for may still complete: read the resource to see its state"
            ) from None

    async def _control(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A call that goes on to the topic's controller, which may be restarting."""
        return await self._call(method, *args, restart_timeout_s=self._restart_timeout_s, **kwargs)
