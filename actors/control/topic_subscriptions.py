"""A topic's subscriptions as its controller manages them: created and deleted across
every segment, crash-safely.

A subscription is created and deleted on many segments; its metadata records how
far that got (``SubscriptionState``: CREATING, ACTIVE, DELETING), and
``finish`` drives one to its end state, so a controller that died half-way has
its next incarnation finish the job. Checkpoint groups (``SubscriptionKind``)
keep their positions themselves: they have no cursors in the segments.

Who calls: the controller, holding its lock, after checking the caller and
recovering; what it affects: the segments' cursors (through the fleet), the
subscription's coordinator, its metadata and the incarnation's ``topic.json``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from actors.control.topic_parts import TopicParts
from runtime.errors import SubscriptionAlreadyExistsError, UnauthorizedError
from storage.records import SubscriptionKind, SubscriptionMetadata, SubscriptionState
from storage.topic_storage import SubscriptionSettings


class TopicSubscriptions:
    def __init__(self, parts: TopicParts, write_identity: Callable[[], None]) -> None:
        self._parts = parts
        self._write_identity = write_identity

    async def create(self, meta: SubscriptionMetadata) -> None:
        """Record ``meta`` (CREATING), then give every segment its cursor. The create that
        made an existing subscription (the same ``created_by`` request id), sent again,
        finishes it instead; any other is ``SubscriptionAlreadyExistsError``."""
        topic, catalog = self._parts.topic, self._parts.catalog
        try:
            catalog.create_subscription(topic, meta)
        except SubscriptionAlreadyExistsError:
            found = catalog.subscription(topic, meta.name)
            retried = found is not None and found.state != SubscriptionState.DELETING
            if not (retried and meta.created_by and found.created_by == meta.created_by):
                raise
        await self.finish(meta.name)

    async def delete(self, name: str, only_of: str | None = None) -> None:
        """Mark ``name`` DELETING, then remove it everywhere. ``only_of``: refused unless
        principal ``only_of`` created it."""
        topic, catalog = self._parts.topic, self._parts.catalog
        if only_of is not None:
            meta = catalog.subscription(topic, name)
            if meta is not None and meta.owner != only_of:
                raise UnauthorizedError(
                    f"principal {only_of!r} may delete only the subscriptions it created; "
                    f"{name!r} needs admin in namespace {topic.namespace_path}"
                )
        catalog.update_subscription(topic, name, _in_state(SubscriptionState.DELETING))
        await self.finish(name)

    async def finish(self, name: str) -> None:
        """Drive a CREATING or DELETING subscription to its end state on every segment."""
        parts = self._parts
        meta = parts.catalog.subscription(parts.topic, name)
        if meta is None or meta.state == SubscriptionState.ACTIVE:
            return
        layout, epoch = parts.read_record().layout, parts.leader_epoch()
        names = [s.name(parts.topic) for s in layout.all_segments.values()]  # sealed ones too
        if meta.state == SubscriptionState.CREATING:
            await asyncio.gather(
                *(parts.fleet.create_subscription(n, name, meta.position, epoch) for n in names)
            )
            parts.catalog.update_subscription(
                parts.topic, name, _in_state(SubscriptionState.ACTIVE)
            )
            parts.coordinators.start(name)
            self._write_identity()
        else:
            await parts.coordinators.stop(name)
            await asyncio.gather(*(parts.fleet.delete_subscription(n, name, epoch) for n in names))
            parts.catalog.delete_subscription(parts.topic, name)
            self._write_identity()

    async def finish_all(self) -> None:
        """Finish whatever a predecessor left half-way (recovery)."""
        for name in self._parts.catalog.subscriptions(self._parts.topic):
            await self.finish(name)

    def live(self) -> dict[str, SubscriptionMetadata]:
        """The subscriptions proper that are not being deleted, by name."""
        return {n: m for n, m in self._cursored().items() if m.state != SubscriptionState.DELETING}

    def with_cursors(self, found: set[str]) -> list[str]:
        """``found`` (names a split's parents hold cursors of) less those being deleted,
        plus every live subscription: what the children get, read in one pass."""
        cursored = self._cursored()
        deleting = {n for n, m in cursored.items() if m.state == SubscriptionState.DELETING}
        return sorted((found - deleting) | (set(cursored) - deleting))

    def _cursored(self) -> dict[str, SubscriptionMetadata]:
        """Every subscription proper (checkpoint groups keep positions themselves, not
        cursors in the segments), whatever its state."""
        topic, catalog = self._parts.topic, self._parts.catalog
        found = {}
        for name in catalog.subscriptions(topic):
            meta = catalog.subscription(topic, name)
            if meta is not None and meta.kind == SubscriptionKind.SUBSCRIPTION:
                found[name] = meta
        return found

    def settings(self) -> dict[str, SubscriptionSettings]:
        """What recovery needs of each live subscription (``topic.json``)."""
        return {
            name: SubscriptionSettings(position=meta.position, session_grace_s=meta.session_grace_s)
            for name, meta in self.live().items()
        }


def _in_state(
    state: SubscriptionState,
) -> Callable[[SubscriptionMetadata], SubscriptionMetadata]:
    return lambda meta: meta.model_copy(update={"state": state})
