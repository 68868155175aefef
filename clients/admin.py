"""``ScalableTopicsAdmin``: the spec's Admin Client API over Ray actor handles.

Reads (metadata, listings, stats) go straight to the metadata store and the
segments, so they work while a controller restarts; mutations go to the
topic's controller, which serializes and fences them. A mutation interrupted
by a controller crash is retried with the same request id, and the restarted
controller recognizes it, so a retry never applies an operation twice.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

from actors.capacity import check_capacity
from actors.controller import controller_actor
from actors.segment import segment_actor
from actors.storage_tasks import remove_storage, scan_storage
from clients._ray import with_sync_twins
from runtime.auth import AuthPolicy, Permission, default_token
from runtime.connect import connect, metadata_durability
from runtime.errors import (
    InvalidArgumentError,
    TopicAlreadyExistsError,
    UnavailableError,
    UnavailableSegmentsError,
    is_integer,
)
from runtime.layout import MAX_SEGMENTS, SegmentLayout
from runtime.limits import Limits, check_room, namespace_limits
from runtime.names import SegmentName, TopicName, parse_namespace, validate_part
from runtime.policy import TopicPolicy
from runtime.remote import call
from runtime.subscription import DEFAULT_GRACE_S, StartPosition
from storage.catalog import Catalog, TopicRecord
from storage.segment_log import default_storage_root
from storage.topic_storage import StoredIncarnation, choose_incarnation, is_incarnation

_RESTART_ERRORS = (ActorDiedError, ActorUnavailableError, RayActorError)


@with_sync_twins
class ScalableTopicsAdmin:
    """Administer scalable topics; every method has an ``_async`` twin."""

    def __init__(
        self,
        *,
        address: str | None = None,
        namespace: str | None = None,
        controller_restart_timeout_s: float = 30.0,
        segment_timeout_s: float = 10.0,
        token: str | None = None,
        auth: AuthPolicy | None = None,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) is checked against ``auth`` (default
        the operator's ``RAYTOPICS_AUTH_TOKENS_FILE``; no tokens there = auth off)."""
        self._auth = AuthPolicy.from_env() if auth is None else auth
        self._token = token if token is not None else default_token()
        self._auth.authenticate(self._token)  # a bad token fails here, not at first use
        connect(address, namespace=namespace)
        self._catalog = Catalog(ray.get_runtime_context().namespace)
        self._restart_timeout_s = controller_restart_timeout_s
        self._segment_timeout_s = segment_timeout_s

    # --- reads (no controller involved) --------------------------------------------

    async def list_scalable_topics_async(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` as ``topic://`` names."""
        parse_namespace(namespace)
        self._auth.authorize(self._token, Permission.LOOKUP, namespace)
        return [f"topic://{namespace}/{name}" for name in self._catalog.topics(namespace)]

    async def get_metadata_async(self, topic: str) -> dict[str, Any]:
        """The topic's ``ScalableTopicMetadata`` document (the spec's JSON shape)."""
        return (await self.get_layout_async(topic)).to_dict()

    async def get_layout_async(self, topic: str) -> SegmentLayout:
        return self._record(self._allowed(Permission.LOOKUP, topic)).layout

    async def list_subscriptions_async(self, topic: str) -> list[str]:
        name = self._allowed(Permission.LOOKUP, topic)
        self._record(name)
        return self._catalog.subscriptions(name)

    async def get_stats_async(self, topic: str) -> dict[str, Any]:
        """Segment counts, per-segment size/records, per-subscription backlog and consumers.

        Backlog is a bulk read over the whole DAG: a segment that cannot answer
        makes this raise ``UnavailableSegmentsError`` rather than under-report.
        """
        name = self._allowed(Permission.LOOKUP, topic)
        record = self._record(name)
        layout = record.layout
        segments = list(layout.all_segments.values())
        names = [name.segment(s.segment_id, s.hash_range.start, s.hash_range.end) for s in segments]
        stats = await asyncio.gather(*(self._segment_stats(n) for n in names))
        missing = [s.segment_id for s, st in zip(segments, stats, strict=True) if st is None]
        if missing:
            raise UnavailableSegmentsError(
                f"{topic}: segments {missing} did not answer within {self._segment_timeout_s}s",
                missing,
            )
        subscriptions = self._subscriptions(name)
        return _aggregate(name, record.incarnation, layout, segments, stats, subscriptions)

    # --- topic lifecycle --------------------------------------------------------------

    async def create_scalable_topic_async(
        self, topic: str, num_segments: int, properties: dict[str, str] | None = None
    ) -> dict[str, Any]:
        name = self._allowed(Permission.ADMIN, topic)
        if not is_integer(num_segments, 1, MAX_SEGMENTS):
            raise InvalidArgumentError(
                f"num_segments must be an integer from 1 to {MAX_SEGMENTS}, got {num_segments!r}"
            )
        _check_properties(properties)
        if self._catalog.topic_exists(name):
            raise TopicAlreadyExistsError(f"topic {name} already exists")
        check_room(self._catalog, name, num_segments, new_topic=True)
        check_capacity(f"creating {name}", name, num_segments)
        return await self._control(name, "create", num_segments, properties, create=True)

    async def delete_scalable_topic_async(self, topic: str) -> None:
        name = self._allowed(Permission.ADMIN, topic)
        self._record(name)
        await self._control(name, "delete")
        ray.kill(controller_actor(name), no_restart=True)

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
        name = self._allowed(Permission.CONSUME, topic)
        validate_part("subscription", subscription)
        self._record(name)
        await self._control(name, "create_subscription", subscription, position, session_grace_s)

    async def delete_subscription_async(self, topic: str, subscription: str) -> None:
        name = self._allowed(Permission.ADMIN, topic)
        validate_part("subscription", subscription)
        self._record(name)
        await self._control(name, "delete_subscription", subscription)

    # --- layout changes -----------------------------------------------------------------

    async def split_segment_async(self, topic: str, segment_id: int) -> dict[str, Any]:
        """Split an active segment at its midpoint; returns the completed operation."""
        name = self._allowed(Permission.ADMIN, topic)
        _check_id(segment_id)
        self._record(name)
        return await self._control(name, "split_segment", segment_id, uuid.uuid4().hex)

    async def merge_segments_async(
        self, topic: str, segment_id1: int, segment_id2: int
    ) -> dict[str, Any]:
        """Merge two adjacent active segments; returns the completed operation."""
        name = self._allowed(Permission.ADMIN, topic)
        _check_id(segment_id1)
        _check_id(segment_id2)
        self._record(name)
        return await self._control(
            name, "merge_segments", segment_id1, segment_id2, uuid.uuid4().hex
        )

    # --- operating policy (autoscale, retention; see runtime.policy) --------------------

    async def get_policy_async(self, topic: str) -> dict[str, Any]:
        """The topic's policy; parts that are not set are ``None`` (off)."""
        return (self._record(TopicName.parse(topic)).policy or TopicPolicy()).to_dict()

    async def set_policy_async(self, topic: str, policy: dict[str, Any]) -> dict[str, Any]:
        """Replace the topic's policy (``{"autoscale": {...}, "retention": {...}}``);
        validated here first, stored by the controller; returns it as stored."""
        name = TopicName.parse(topic)
        parsed = TopicPolicy.parse(policy)
        self._record(name)
        return await self._control(name, "set_policy", parsed.to_dict())

    # --- segments (the spec's Segments API; routed through the controller) -------------

    async def create_segment_async(
        self, segment_topic: str, subscriptions: list[str] | None = None
    ) -> None:
        segment = self._allowed_segment(segment_topic)
        for sub in subscriptions or []:
            validate_part("subscription", sub)
        self._record(segment.topic)
        await self._control(
            segment.topic, "create_segment", str(segment), list(subscriptions or [])
        )

    async def terminate_segment_async(self, segment_topic: str, force: bool = False) -> int:
        """Seal a segment of the layout; returns its end offset. An ACTIVE one only with
        ``force``: producers to its range then stall until a split or merge replaces it."""
        segment = self._allowed_segment(segment_topic)
        self._record(segment.topic)
        return await self._control(segment.topic, "terminate_segment", str(segment), force)

    async def delete_segment_async(self, segment_topic: str, force: bool = False) -> None:
        segment = self._allowed_segment(segment_topic)
        self._record(segment.topic)
        await self._control(segment.topic, "delete_segment", str(segment), force)

    # --- limits -------------------------------------------------------------------------

    async def get_namespace_limits_async(self, namespace: str) -> dict[str, int]:
        """The limits in force in ``tenant/namespace`` (defaults plus its overrides)."""
        parse_namespace(namespace)
        self._auth.authorize(self._token, Permission.LOOKUP, namespace)
        return asdict(namespace_limits(self._catalog, namespace))

    async def set_namespace_limits_async(self, namespace: str, **limits: int) -> dict[str, int]:
        """Override limits (``max_message_bytes=...``) for one namespace; returns those in force.

        The whole resulting set is validated before it is stored. Controllers apply
        it at once; segments and producers read size limits when they start.
        """
        parse_namespace(namespace)
        self._auth.authorize(self._token, Permission.ADMIN, namespace)

        def merged(stored: dict[str, Any]) -> dict[str, Any]:
            overrides = {**stored, **limits}
            Limits.from_env().overridden(overrides)  # raises before anything is written
            return overrides

        self._catalog.update_limit_overrides(namespace, merged)
        return await self.get_namespace_limits_async(namespace)

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
        self._auth.authorize(self._token, Permission.ADMIN, "*")
        root = str(default_storage_root())
        stored = await call(scan_storage.remote(root))
        namespace = ray.get_runtime_context().namespace
        orphaned, foreign, live = [], [], 0
        for entry in stored:
            record = self._catalog.topic(entry.topic)
            if entry.ray_namespace not in (None, namespace):
                foreign.append(entry)
            elif record is not None and record.incarnation == entry.incarnation:
                live += 1
            else:
                orphaned.append((entry, _orphan_reason(entry, record)))
        report: dict[str, Any] = {
            "storageRoot": root,
            "live": live,
            "orphaned": [{**e.describe(), "reason": why} for e, why in orphaned],
            "foreign": [e.describe() for e in foreign],
            "deleted": [],
        }
        if delete and orphaned:
            directories = [str(d) for e, _ in orphaned for d in e.removable]
            await call(remove_storage.remote(root, directories))
            report["deleted"] = report["orphaned"]
        return report

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
        name = self._allowed(Permission.ADMIN, topic)
        if incarnation is not None and not is_incarnation(incarnation):
            raise InvalidArgumentError(
                f"invalid incarnation {incarnation!r}: expected an id such as "
                "20261125T130241Z-3f9a1c2b (raytopics storage check lists them)"
            )
        if self._catalog.topic_exists(name):
            raise TopicAlreadyExistsError(
                f"topic {name} has live metadata: recover rebuilds only a topic whose "
                "metadata is lost"
            )
        root = str(default_storage_root())
        stored = await call(scan_storage.remote(root, str(name)))
        chosen = choose_incarnation(stored, name, incarnation)  # refuses before anything starts
        return await self._control(name, "recover", chosen.incarnation, create=True)

    # --- internals ------------------------------------------------------------------------

    def _allowed(self, action: Permission, topic: str) -> TopicName:
        """Parse ``topic`` and check this client's token may ``action`` in its namespace."""
        name = TopicName.parse(topic)
        self._auth.authorize(self._token, action, f"{name.tenant}/{name.namespace}")
        return name

    def _allowed_segment(self, segment_topic: str) -> SegmentName:
        """Segment operations are internal: they need admin on the topic's namespace."""
        segment = SegmentName.parse(segment_topic)
        self._allowed(Permission.ADMIN, str(segment.topic))
        return segment

    def _record(self, name: TopicName) -> TopicRecord:
        return self._catalog.require_topic(name)

    def _subscriptions(self, name: TopicName) -> dict[str, dict[str, Any]]:
        result = {}
        for sub in self._catalog.subscriptions(name):
            meta = self._catalog.subscription(name, sub)
            if meta is not None:
                consumers = self._catalog.consumers(name, sub)
                result[sub] = {"state": meta.state, "consumers": len(consumers)}
        return result

    async def _segment_stats(self, name: SegmentName) -> dict[str, Any] | None:
        try:
            handle = segment_actor(name)
            return await asyncio.wait_for(
                call(handle.stats.remote()), timeout=self._segment_timeout_s
            )
        except (ValueError, TimeoutError, GetTimeoutError, *_RESTART_ERRORS):
            return None

    async def _control(self, name: TopicName, method: str, *args: Any, create: bool = False) -> Any:
        """Call the topic's controller, riding out a controller restart."""
        deadline = time.monotonic() + self._restart_timeout_s
        while True:
            handle = controller_actor(name, create=True)
            try:
                if not create:
                    await call(handle.ready.remote())
                return await call(getattr(handle, method).remote(*args))
            except _RESTART_ERRORS as err:
                if time.monotonic() > deadline:
                    raise UnavailableError(
                        f"controller of {name} did not come back within "
                        f"{self._restart_timeout_s}s: {err}"
                    ) from None
                await asyncio.sleep(0.05)  # a restart takes ~1-2 s: look often


def _orphan_reason(entry: StoredIncarnation, record: TopicRecord | None) -> str:
    if entry.incarnation is None:
        return "written before topic incarnations existed: it cannot be recovered"
    if record is None:
        return "no metadata names this topic: deleted, or its metadata was lost (recover)"
    return f"the topic's live metadata names incarnation {record.incarnation}"


def _check_id(segment_id: Any) -> None:
    if not is_integer(segment_id, 0):
        raise InvalidArgumentError(f"segment id must be a non-negative integer, got {segment_id!r}")


def _check_properties(properties: Any) -> None:
    if properties is None:
        return
    if not isinstance(properties, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
    ):
        raise InvalidArgumentError("properties must be a mapping of strings to strings")
    if len(json.dumps(properties)) > 64 * 1024:
        raise InvalidArgumentError("properties must serialize to at most 64 KiB")


def _aggregate(
    name: TopicName,
    incarnation: str,
    layout: SegmentLayout,
    segments: list,
    stats: list[dict[str, Any]],
    subscriptions: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    per_segment, backlog = {}, {sub: 0 for sub in subscriptions}
    for info, st in zip(segments, stats, strict=True):
        per_segment[str(info.segment_id)] = {
            "state": info.state.value,
            "hashRange": {"start": info.hash_range.start, "end": info.hash_range.end},
            **{k: st[k] for k in ("records", "sizeBytes", "endOffset", "terminated")},
            "subscriptions": st["subscriptions"],
        }
        for sub, cursor in st["subscriptions"].items():
            backlog[sub] = backlog.get(sub, 0) + cursor["backlog"]
    return {
        "topic": str(name),
        "incarnation": incarnation,
        "metadata": metadata_durability(),
        "epoch": layout.epoch,
        "activeSegments": len(layout.active_segments),
        "sealedSegments": len(layout.all_segments) - len(layout.active_segments),
        "records": sum(s["records"] for s in stats),
        "sizeBytes": sum(s["sizeBytes"] for s in stats),
        "segments": per_segment,
        "subscriptions": {
            sub: {**subscriptions.get(sub, {"state": "UNKNOWN", "consumers": 0}), "backlog": total}
            for sub, total in backlog.items()
        },
    }
