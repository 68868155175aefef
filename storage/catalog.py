"""The metadata catalog: the record kept at each path of the metadata store.

The paths are ``storage.metadata_paths`` (the table of paths and records is there),
the records' shapes ``storage.records``, so a path or a record's shape changes in
exactly one file. Everything else asks the catalog in domain terms
(``catalog.subscriptions(topic)``, ``catalog.update_topic(topic, change)``).

Writes go through ``MetadataStore``'s compare-and-swap; a lost race is retried
from a fresh read, never overwritten blindly.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from runtime.auth import AuthPolicy
from runtime.config import ray_namespace
from runtime.errors import (
    AlreadyExistsError,
    BadVersion,
    ConflictError,
    KeyNotFoundError,
    StaleEpochError,
    SubscriptionAlreadyExistsError,
    SubscriptionNotFoundError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from runtime.names import TopicName, parse_namespace
from runtime.policy import TopicPolicy
from runtime.sink_parts import SinkWrite
from storage.metadata import MetadataStore, Version
from storage.metadata_paths import (
    AUTH_POLICY_PATH,
    INTERNAL_TOKEN_PATH,
    TOPICS_ROOT,
    consumer_path,
    consumers_path,
    controller_path,
    limits_path,
    namespace_path,
    policy_path,
    sink_path,
    subscription_path,
    subscriptions_path,
    topic_of_path,
    topic_path,
)
from storage.records import (
    AuthRecord,
    ConsumerRegistration,
    LeaderRecord,
    SubscriptionKind,
    SubscriptionMetadata,
    SubscriptionState,
    TopicRecord,
)

# --- the catalog ---------------------------------------------------------------------------


class Catalog:
    """Typed access to every record of the metadata store (one Ray namespace's)."""

    def __init__(self, namespace: str | None = None, store: MetadataStore | None = None) -> None:
        self.store = store or MetadataStore(namespace or ray_namespace())

    # --- topics --------------------------------------------------------------------------

    def topic(self, topic: TopicName) -> TopicRecord | None:
        found = self.store.get(topic_path(topic))
        return TopicRecord.from_bytes(found.value) if found is not None else None

    def topic_if_changed(
        self, topic: TopicName, known: Version | None
    ) -> tuple[TopicRecord | None, Version | None] | None:
        """``None`` while the record is still at version ``known``; else the record (``None``
        once deleted) and its version. A watcher polls this, so an unchanged record is
        never parsed again."""
        found = self.store.get(topic_path(topic))
        version = found.version if found is not None else None
        if version is not None and version == known:
            return None
        return (TopicRecord.from_bytes(found.value) if found else None), version

    def require_topic(self, topic: TopicName) -> TopicRecord:
        record = self.topic(topic)
        if record is None:
            raise TopicNotFoundError(f"topic {topic} does not exist")
        return record

    def topic_exists(self, topic: TopicName) -> bool:
        return self.store.exists(topic_path(topic))

    def topics(self, namespace: str) -> list[str]:
        """Short names (``orders``) of the topics of ``tenant/namespace``, sorted."""
        return self.store.children(namespace_path(namespace))

    def all_topics(self) -> list[TopicName]:
        """Every topic of every namespace, in one listing of the store."""
        found = (topic_of_path(path) for path in self.store.list(TOPICS_ROOT))
        return sorted((topic for topic in found if topic is not None), key=str)

    def create_topic(self, topic: TopicName, record: TopicRecord) -> None:
        try:
            self.store.put_if_absent(topic_path(topic), record.to_bytes())
        except AlreadyExistsError:
            raise TopicAlreadyExistsError(f"topic {topic} already exists") from None

    def update_topic(
        self, topic: TopicName, change: Callable[[TopicRecord], TopicRecord]
    ) -> TopicRecord:
        """Read-modify-CAS of the record; ``change`` may raise to abort (nothing written)."""
        result: list[TopicRecord] = []

        def mutate(raw: bytes) -> bytes:
            result[:] = [change(TopicRecord.from_bytes(raw))]
            return result[0].to_bytes()

        try:
            self.store.update(topic_path(topic), mutate)
        except KeyNotFoundError:
            raise TopicNotFoundError(f"topic {topic} does not exist") from None
        return result[0]

    def delete_topic(self, topic: TopicName) -> None:
        """The record and everything below it: leader, subscriptions, consumers."""
        self.store.delete_tree(topic_path(topic))

    def active_segments(self, namespace: str) -> dict[str, int]:
        """Active segment count of every topic of ``tenant/namespace`` (for limits)."""
        counts = {}
        for name in self.topics(namespace):
            tenant, ns = parse_namespace(namespace)
            record = self.topic(TopicName(tenant, ns, name))
            if record is not None:
                counts[name] = len(record.layout.active_segments)
        return counts

    # --- leadership ----------------------------------------------------------------------

    def elect(self, topic: TopicName, at_least: int = 1) -> int:
        """CAS-increment the topic's leader epoch (to ``at_least`` or more) and record
        this process as the leader; returns the new epoch."""
        path = controller_path(topic)
        identity = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}

        def bumped(raw: bytes) -> bytes:
            epoch = max(LeaderRecord.model_validate_json(raw).leader_epoch + 1, at_least)
            return LeaderRecord(leader_epoch=epoch, **identity).model_dump_json(by_alias=True)

        for _ in range(100):
            first = LeaderRecord(leader_epoch=max(1, at_least), **identity)
            try:
                self.store.put_if_absent(path, first.model_dump_json(by_alias=True).encode())
                return first.leader_epoch
            except AlreadyExistsError:
                pass
            try:
                updated = self.store.update(path, lambda raw: bumped(raw).encode())
                return LeaderRecord.model_validate_json(updated.value).leader_epoch
            except KeyNotFoundError:
                continue  # deleted between the two calls: try to create it again
        raise ConflictError(f"could not win leadership of {topic}: constant contention")

    def leader(self, topic: TopicName) -> LeaderRecord | None:
        found = self.store.get(controller_path(topic))
        return LeaderRecord.model_validate_json(found.value) if found is not None else None

    # --- subscriptions -------------------------------------------------------------------

    def subscriptions(self, topic: TopicName) -> list[str]:
        return self.store.children(subscriptions_path(topic))

    def subscription(self, topic: TopicName, name: str) -> SubscriptionMetadata | None:
        found = self.store.get(subscription_path(topic, name))
        return SubscriptionMetadata.from_bytes(found.value) if found is not None else None

    def require_subscription(self, topic: TopicName, name: str) -> SubscriptionMetadata:
        meta = self.subscription(topic, name)
        if meta is None:
            raise SubscriptionNotFoundError(f"subscription {name!r} does not exist on {topic}")
        return meta

    def create_subscription(self, topic: TopicName, meta: SubscriptionMetadata) -> None:
        try:
            self.store.put_if_absent(subscription_path(topic, meta.name), meta.to_bytes())
        except AlreadyExistsError:
            raise SubscriptionAlreadyExistsError(
                f"subscription {meta.name!r} already exists on {topic}"
            ) from None

    def update_subscription(
        self,
        topic: TopicName,
        name: str,
        change: Callable[[SubscriptionMetadata], SubscriptionMetadata],
    ) -> SubscriptionMetadata:
        try:
            updated = self.store.update(
                subscription_path(topic, name),
                lambda raw: change(SubscriptionMetadata.from_bytes(raw)).to_bytes(),
            )
        except KeyNotFoundError:
            raise SubscriptionNotFoundError(
                f"subscription {name!r} does not exist on {topic}"
            ) from None
        return SubscriptionMetadata.from_bytes(updated.value)

    def delete_subscription(self, topic: TopicName, name: str) -> None:
        """The subscription and its consumers' registrations."""
        self.store.delete_tree(subscription_path(topic, name))

    def ensure_group(self, topic: TopicName, group: str, grace_s: float) -> None:
        """Create a checkpoint group's metadata on first use; refuse a name clash."""
        meta = SubscriptionMetadata(
            name=group,
            state=SubscriptionState.ACTIVE,
            kind=SubscriptionKind.CHECKPOINT_GROUP,
            session_grace_s=grace_s,
        )
        with contextlib.suppress(SubscriptionAlreadyExistsError):
            self.create_subscription(topic, meta)
        found = self.subscription(topic, group)
        if found is None or found.kind != SubscriptionKind.CHECKPOINT_GROUP:
            raise ConflictError(
                f"{group!r} is a subscription of {topic}, not a checkpoint group: pick another name"
            )

    # --- consumer registrations ----------------------------------------------------------

    def consumers(self, topic: TopicName, subscription: str) -> list[str]:
        return self.store.children(consumers_path(topic, subscription))

    def registrations(self, topic: TopicName, subscription: str) -> list[ConsumerRegistration]:
        found = []
        for name in self.consumers(topic, subscription):
            entry = self.store.get(consumer_path(topic, subscription, name))
            if entry is not None:
                found.append(ConsumerRegistration.model_validate_json(entry.value))
        return found

    def put_registration(
        self, topic: TopicName, subscription: str, registration: ConsumerRegistration
    ) -> None:
        """Create or replace (the coordinator is the only writer of its subscription's)."""
        path = consumer_path(topic, subscription, registration.consumer_name)
        if not self._replace(path, registration.model_dump_json(by_alias=True).encode()):
            raise ConflictError(f"could not store the registration at {path}: constant contention")

    def delete_registration(self, topic: TopicName, subscription: str, consumer: str) -> None:
        with contextlib.suppress(KeyNotFoundError):
            self.store.delete(consumer_path(topic, subscription, consumer))

    # --- namespace default policy ---------------------------------------------------------

    def namespace_policy(self, namespace: str) -> TopicPolicy | None:
        """What a namespace's topics follow where their own policy says nothing."""
        found = self.store.get(policy_path(namespace))
        return TopicPolicy.model_validate_json(found.value) if found is not None else None

    def set_namespace_policy(self, namespace: str, policy: TopicPolicy) -> None:
        path = policy_path(namespace)
        if not self._replace(path, policy.model_dump_json(by_alias=True).encode()):
            raise ConflictError(f"could not store the policy at {path}: constant contention")

    # --- namespace limits ----------------------------------------------------------------

    def limit_overrides(self, namespace: str) -> dict[str, Any]:
        found = self.store.get(limits_path(namespace))
        return json.loads(found.value) if found is not None else {}

    def update_limit_overrides(
        self, namespace: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Apply ``change`` to the stored overrides (``{}`` when none); it may raise to abort."""
        path = limits_path(namespace)

        def mutate(raw: bytes) -> bytes:
            return json.dumps(change(json.loads(raw)), sort_keys=True).encode()

        for _ in range(100):  # the change sees what is stored, never a blank it would replace
            with contextlib.suppress(KeyNotFoundError):
                self.store.update(path, mutate)
                break
            try:
                self.store.put_if_absent(path, mutate(b"{}"))
                break
            except AlreadyExistsError:
                pass
        return self.limit_overrides(namespace)

    # --- authentication --------------------------------------------------------------

    def auth(self) -> AuthRecord | None:
        """The stored policy; ``None``: authentication is off."""
        record = self._auth_record()
        return record if record is not None and record.policy is not None else None

    def auth_version(self) -> int:
        """The stored policy's version (0: none), for a cheap is-my-copy-current check."""
        record = self.auth()
        return record.version if record is not None else 0

    def replace_auth(self, policy: AuthPolicy) -> AuthRecord:
        """Store ``policy`` (enabled: it has tokens) as the next version.

        The internal token is made first, if it is not yet: once a policy is in force
        the system's own calls need it, and making it then, on a caller's request,
        would change the metadata while refusing that request."""
        if not policy.enabled:
            raise ConflictError("an empty policy would turn authentication off: disable it")
        self.internal_token()
        return self._next_auth(policy.to_config())

    def disable_auth(self) -> None:
        """Turn authentication off. The record stays, policy-less, so the next policy's
        version is higher than any before: a process that kept a copy of an earlier
        policy and never saw authentication off still sees the new one as new."""
        record = self._auth_record()
        if record is not None and record.policy is not None:
            self._next_auth(None)

    def _auth_record(self) -> AuthRecord | None:
        found = self.store.get(AUTH_POLICY_PATH)
        return AuthRecord.model_validate_json(found.value) if found is not None else None

    def _next_auth(self, config: dict[str, Any] | None) -> AuthRecord:
        now = int(time.time() * 1000)
        for _ in range(100):
            current = self.store.get(AUTH_POLICY_PATH)
            version = AuthRecord.model_validate_json(current.value).version + 1 if current else 1
            record = AuthRecord(version=version, updated_at_ms=now, policy=config)
            value = record.model_dump_json(by_alias=True).encode()
            try:
                if current is None:
                    self.store.put_if_absent(AUTH_POLICY_PATH, value)
                else:
                    self.store.compare_and_swap(AUTH_POLICY_PATH, current.version, value)
                return record
            except (AlreadyExistsError, BadVersion, KeyNotFoundError):
                continue
        raise ConflictError("could not store the auth policy: constant contention")

    def internal_token(self) -> str:
        """The token the system's own actors present to each other, made on first use.

        No operator file holds it; it lives only in the cluster's metadata, which a
        process needs the cluster's own (Ray) credentials to read."""
        found = self.store.get(INTERNAL_TOKEN_PATH)
        if found is None:
            with contextlib.suppress(AlreadyExistsError):
                self.store.put_if_absent(INTERNAL_TOKEN_PATH, secrets.token_hex(32).encode())
            found = self.store.get_required(INTERNAL_TOKEN_PATH)
        return found.value.decode()

    # --- Spark writes --------------------------------------------------------------------

    def forget_sink_writes(self, topic: TopicName, query: str) -> None:
        """Drop every chunk record of a finished write (a Spark batch write's id)."""
        self.store.delete_tree(sink_path(topic, query))

    def sink_write(
        self, topic: TopicName, query: str, partition: int, chunk: int
    ) -> tuple[SinkWrite, Version] | None:
        """The last write of a streaming query's partition chunk, with its version."""
        found = self.store.get(sink_path(topic, query, partition, chunk))
        if found is None:
            return None
        return SinkWrite.model_validate_json(found.value), found.version

    def put_sink_write(
        self,
        topic: TopicName,
        query: str,
        partition: int,
        chunk: int,
        write: SinkWrite,
        expected: Version | None,
    ) -> Version:
        """Record ``write`` if the stored one is still ``expected`` (``BadVersion`` or
        ``AlreadyExistsError`` if another attempt got there first)."""
        path = sink_path(topic, query, partition, chunk)
        if expected is None:
            return self.store.put_if_absent(path, write.to_bytes())
        return self.store.compare_and_swap(path, expected, write.to_bytes())

    def _replace(self, path: str, value: bytes) -> bool:
        """Create ``path`` or replace whatever version is there with ``value`` (a record
        with one writer, or whose last writer wins); False after constant contention."""
        for _ in range(100):
            found = self.store.get(path)
            try:
                if found is None:
                    self.store.put_if_absent(path, value)
                else:
                    self.store.compare_and_swap(path, found.version, value)
                return True
            except (AlreadyExistsError, BadVersion, KeyNotFoundError):
                continue
        return False


def fenced(
    epoch: int, topic: TopicName, change: Callable[[TopicRecord], TopicRecord]
) -> Callable[[TopicRecord], TopicRecord]:
    """``change`` guarded by the controller's fencing epoch, which it also stamps."""

    def apply(record: TopicRecord) -> TopicRecord:
        if record.controller_epoch > epoch:
            raise StaleEpochError(
                f"controller epoch {epoch} of {topic} is stale: "
                f"epoch {record.controller_epoch} has taken over"
            )
        return change(record.model_copy(update={"controller_epoch": epoch}))

    return apply
