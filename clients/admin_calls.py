"""The Admin Client API as Python declares it, once for both ways of reaching the cluster.

``ScalableTopicsAdmin`` (through Ray, ``clients.admin``) and ``AdminHttpClient``
(through the REST gateway, ``clients.http``) are this class with a transport: each
public method here turns its arguments into one ``AdminCall`` (an operation of the
table in ``runtime.admin_api`` and its arguments by the admin service's parameter
names) and hands it to ``_run``, which the transport implements. So a method's name,
signature, docstring, client-side checks and answer shaping exist once, and the two
clients cannot drift apart; ``tests/test_admin_api.py`` checks that every call made
here binds to the service's handler and reaches a REST endpoint.

Adding an operation: its ``Operation`` (and ``Endpoint``) in ``runtime.admin_api``,
its handler on the admin service, and one method here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clients._loop import with_sync_twins
from clients.transaction import Transaction
from runtime.admin_api import merged_ids, split_hashes
from runtime.auth import AuthPolicy
from runtime.layout import SegmentLayout
from runtime.policy import TopicPolicy
from runtime.readiness import DEFAULT_READY_TIMEOUT_S, MAX_WAIT_S, wait_until_ready
from runtime.subscription import DEFAULT_GRACE_S, ResetTo, StartPosition, reset_ms, time_ms
from runtime.transactions import DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class AdminCall:
    """One call of the admin service's ``operation`` with ``args`` by parameter name
    (``None`` values included: the service's defaults are the same)."""

    operation: str
    args: Mapping[str, Any] = field(default_factory=dict)


@with_sync_twins
class AdminCalls(ABC):
    """The Admin Client API; a transport implements ``_run``. Every method has a
    blocking twin without ``_async`` (``clients._loop.with_sync_twins``)."""

    @abstractmethod
    async def _run(self, call: AdminCall) -> Any:
        """Carry out ``call`` as this client's caller; typed errors come back as
        themselves (``runtime.errors``)."""

    async def _op(self, operation: str, /, **args: Any) -> Any:
        return await self._run(AdminCall(operation, args))

    # --- reads ---------------------------------------------------------------------

    async def list_scalable_topics_async(self, namespace: str) -> list[str]:
        """Topics of ``tenant/namespace`` as ``topic://`` names."""
        return await self._op("list_scalable_topics", namespace=namespace)

    async def get_metadata_async(self, topic: str) -> dict[str, Any]:
        """The topic's ``ScalableTopicMetadata`` document (its public JSON shape)."""
        return await self._op("get_metadata", name=topic)

    async def get_layout_async(self, topic: str) -> SegmentLayout:
        """The topic's segment DAG as a ``SegmentLayout``."""
        return SegmentLayout.from_dict(await self.get_metadata_async(topic))

    async def watch_layout_async(
        self, topic: str, known_epoch: int, wait_s: float = MAX_WAIT_S
    ) -> SegmentLayout | None:
        """The topic's layout once its epoch is not ``known_epoch`` any more (a split, a
        merge), waiting in the cluster up to ``wait_s`` seconds (at most
        ``runtime.readiness.MAX_WAIT_S``, and half the gateway's time-out); ``None`` when
        none came. Raises ``TopicNotFoundError`` once the topic is deleted."""
        found = await self._op("watch_layout", name=topic, known_epoch=known_epoch, wait_s=wait_s)
        return None if found["layout"] is None else SegmentLayout.from_dict(found["layout"])

    async def list_subscriptions_async(self, topic: str) -> list[str]:
        """The names of the topic's subscriptions."""
        return await self._op("list_subscriptions", name=topic)

    async def get_stats_async(self, topic: str) -> dict[str, Any]:
        """Segment counts, per-segment size/records, per-subscription backlog and consumers.

        Backlog is a bulk read over the whole DAG: a segment that cannot answer in time
        makes this raise ``UnavailableSegmentsError`` rather than under-report.
        """
        return await self._op("get_stats", name=topic)

    async def get_status_async(self, topic: str) -> dict[str, Any]:
        """Whether every segment of the topic has a running actor: ``{"state": "ready" |
        "starting", "segments", "running", "notRunning": [segment ids]}``. A created
        topic's segments start in the background; a client using one early waits for it."""
        return await self._op("topic_status", name=topic)

    async def wait_until_ready_async(
        self, topic: str, timeout_s: float = DEFAULT_READY_TIMEOUT_S
    ) -> dict[str, Any]:
        """Wait until every segment of the topic runs; returns ``get_status``'s answer, or
        raises ``TopicNotReadyError`` naming the segments still down after ``timeout_s``.
        Each request waits in the cluster for at most ``runtime.readiness.MAX_WAIT_S``."""
        return await wait_until_ready(
            lambda wait_s: self._op("topic_status", name=topic, wait_s=wait_s), timeout_s
        )

    # --- topic lifecycle --------------------------------------------------------------

    async def create_scalable_topic_async(
        self, topic: str, num_segments: int, properties: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Create a topic of ``num_segments`` near-equal segments; returns its metadata.
        Its segments start in the background (``wait_until_ready``)."""
        return await self._op(
            "create_scalable_topic", name=topic, num_segments=num_segments, properties=properties
        )

    async def delete_scalable_topic_async(self, topic: str) -> None:
        """Delete the topic, its segments and their storage."""
        await self._op("delete_scalable_topic", name=topic)

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
        await self._op(
            "create_subscription", name=topic, subscription=subscription, position=position,
            session_grace_s=session_grace_s,
        )  # fmt: skip

    async def delete_subscription_async(self, topic: str, subscription: str) -> None:
        """Delete the subscription from every segment (admin, or consume for one the
        caller's principal created)."""
        await self._op("delete_subscription", name=topic, subscription=subscription)

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
        return await self._op(
            "reset_subscription", name=topic, subscription=subscription, to=reset_ms(to)
        )

    async def position_at_time_async(self, topic: str, when: datetime | int) -> dict[str, Any]:
        """Where a reader starts to get every message published at or after ``when`` (a
        timezone-aware ``datetime`` or epoch milliseconds) and none before:
        ``{"next": {segment id: offset}, "finished": [segment ids]}``, the first such
        offset of each segment (a binary search of its publish times) and the segments
        that end before it. ``Checkpoint.at_timestamp`` builds on it. Needs ``consume``."""
        answer = await self._op("stream_initial", name=topic, starting_time_ms=time_ms(when))
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
        into ``parts`` near-equal children; returns the completed operation. Sent again
        after a restart under the same request id, it is applied once."""
        return await self._op(
            "split_segment", name=topic, segment_id=segment_id, at=split_hashes(at), parts=parts
        )

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
        return await self._op(
            "merge_segments", name=topic, segment_id1=first, segment_id2=second,
            more_segment_ids=more or None,
        )  # fmt: skip

    # --- operating policy (autoscale, retention, tiering; see runtime.policy) -----------

    async def get_policy_async(self, topic: str) -> dict[str, Any]:
        """The topic's policy; parts that are not set are ``None`` (off)."""
        return await self._op("get_policy", name=topic)

    async def set_policy_async(self, topic: str, policy: dict[str, Any]) -> dict[str, Any]:
        """Replace the topic's policy (``{"autoscale": {...}, "retention": {...}}``);
        validated first (here, then in the cluster), stored by the controller; returns it
        as stored (defaults filled in)."""
        TopicPolicy.parse(policy)  # the typed error before any I/O
        return await self._op("set_policy", name=topic, policy=policy)

    # --- segments (low level, routed through the controller) ----------------------------

    async def create_segment_async(
        self, segment_topic: str, subscriptions: list[str] | None = None
    ) -> None:
        """Create a segment topic (``segment://...``) with ``subscriptions``."""
        await self._op(
            "create_segment", segment=segment_topic, subscriptions=list(subscriptions or [])
        )

    async def terminate_segment_async(self, segment_topic: str, force: bool = False) -> int:
        """Seal a segment of the layout; returns its end offset. An ACTIVE one only with
        ``force``: producers to its range then stall until a split or merge replaces it."""
        return await self._op("terminate_segment", segment=segment_topic, force=force)

    async def delete_segment_async(self, segment_topic: str, force: bool = False) -> None:
        """Delete a segment topic (an ACTIVE one only with ``force``)."""
        await self._op("delete_segment", segment=segment_topic, force=force)

    # --- namespace default policy ---------------------------------------------------------

    async def get_namespace_policy_async(self, namespace: str) -> dict[str, Any]:
        """The policy ``tenant/namespace``'s topics follow where their own sets nothing."""
        return await self._op("get_namespace_policy", namespace=namespace)

    async def set_namespace_policy_async(
        self, namespace: str, policy: dict[str, Any]
    ) -> dict[str, Any]:
        """Replace the namespace's default policy; each of its parts (``autoscale``,
        ``retention``, ``tiering``) applies to every topic of the namespace whose own
        policy leaves that part unset. Returns it as stored."""
        TopicPolicy.parse(policy)
        return await self._op("set_namespace_policy", namespace=namespace, policy=policy)

    # --- limits -------------------------------------------------------------------------

    async def get_namespace_limits_async(self, namespace: str) -> dict[str, int]:
        """The limits in force in ``tenant/namespace`` (defaults plus its overrides)."""
        return await self._op("get_namespace_limits", namespace=namespace)

    async def set_namespace_limits_async(self, namespace: str, **limits: int) -> dict[str, int]:
        """Override limits (``max_message_bytes=...``) for one namespace; returns those in force.

        The whole resulting set is validated before it is stored. Controllers apply
        it at once; running segments and producers within 2 s (segments re-read limits at
        most that often, ``runtime.limits.LiveLimits``; producers ask the cluster again,
        ``clients._limits.ClusterLimits``).
        """
        return await self._op("set_namespace_limits", namespace=namespace, limits=limits)

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
        return await self._op("check_storage", delete=delete)

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
        return await self._op("recover_topic", name=topic, incarnation=incarnation)

    # --- the cluster's authentication policy (admin on every namespace, "*") -----------

    async def load_auth_async(self, document: dict[str, Any]) -> dict[str, Any]:
        """Make ``document`` (the token document, see ``runtime.auth``) the cluster's
        policy; returns ``auth_status()``. A malformed document is refused whole. Plain
        tokens are hashed here: only their digests leave this process.

        While authentication is off anyone inside the cluster may load the first policy
        (over REST that is refused: the first policy is the operator's); after that it
        takes admin on ``*``. A token left out of the document is refused everywhere
        within seconds (revocation); a new token for a principal works as soon."""
        config = AuthPolicy.from_config(document).to_config()
        return await self._op("load_auth", document=config)

    async def disable_auth_async(self) -> dict[str, Any]:
        """Turn authentication off (anyone who reaches the cluster may do anything)."""
        return await self._op("disable_auth")

    async def auth_status_async(self) -> dict[str, Any]:
        """``{"enabled", "version", "updatedAtMs", "principals": [{"principal",
        "sha256Prefix", "grants"}]}``: never a token, only 8 hex digits of its digest."""
        return await self._op("auth_status")

    # --- transactions (the cluster's transaction coordinator; see clients.transaction) ---

    async def new_transaction_async(
        self, timeout_s: float = DEFAULT_TIMEOUT_S, owner: str | None = None
    ) -> Transaction:
        """Begin a transaction that aborts unless committed within ``timeout_s`` seconds.
        ``owner`` (Kafka's ``transactional.id``): the owner's transaction before this
        one is fenced, and can no longer commit (a restarted producer's stale one)."""
        shown = await self._op("new_transaction", timeout_s=timeout_s, owner=owner)
        return Transaction(self, shown["txnId"], shown["deadlineMs"])

    async def get_transaction_async(self, txn_id: str) -> dict[str, Any]:
        """``{"txnId", "status", "startedMs", "deadlineMs", "owner", "principal",
        "segments", "acknowledgements", "reason"}``; status is open, committing, aborting,
        committed or aborted; principal: who began it (only they, or an admin of every
        namespace, may see, commit or abort it)."""
        return await self._op("get_transaction", txn_id=txn_id)

    async def list_transactions_async(self) -> list[dict[str, Any]]:
        """Every transaction not yet forgotten, as ``get_transaction`` shows it."""
        return await self._op("list_transactions")

    async def commit_transaction_async(self, txn_id: str) -> dict[str, Any]:
        """Commit; once it returns, all of the transaction's messages are readable and
        its acknowledgements applied. ``TransactionNotOpenError`` if it aborted (asked
        to, fenced or timed out)."""
        return await self._op("commit_transaction", txn_id=txn_id)

    async def abort_transaction_async(self, txn_id: str) -> dict[str, Any]:
        """Abort: none of its messages will ever be read, no acknowledgement applies."""
        return await self._op("abort_transaction", txn_id=txn_id)

    async def transaction_acknowledge_async(
        self,
        txn_id: str,
        segment_topic: str,
        subscription: str,
        offset: int,
        cumulative: bool = False,
    ) -> dict[str, Any]:
        """Acknowledge ``offset`` of ``segment_topic`` for ``subscription`` (with
        ``cumulative``, everything up to it) when ``txn_id`` commits."""
        return await self._op(
            "transaction_acknowledge", segment=segment_topic, txn_id=txn_id,
            subscription=subscription, offset=offset, cumulative=cumulative,
        )  # fmt: skip
