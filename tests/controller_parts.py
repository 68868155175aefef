"""A topic controller's parts without Ray, for tests of its helpers' state logic: the
catalog on the in-memory KV, and stand-ins for the segment fleet and the coordinators
that record the calls the real ones would make (``actors.control.topic_parts``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from actors.control.topic_parts import TopicParts
from runtime.layout import SegmentInfo, SegmentLayout
from runtime.names import SegmentName, TopicName
from runtime.replication import Replication
from runtime.subscription import ResetTarget
from storage.catalog import Catalog
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.records import SubscriptionMetadata, TopicRecord
from storage.segment_store import SealedBy
from storage.topic_storage import new_incarnation

TOPIC = TopicName.parse("topic://ops/ns/t")
EPOCH = 3  # the controller's fencing epoch
ONE_COPY = Replication()


class Down(Exception):
    """A segment that cannot be reached (its node is gone, say)."""


@dataclass
class Keeper:
    """The fleet's replica keeper: whether a round was asked for at once."""

    due: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Fleet:
    """What the segment fleet would do to segments, as a record of calls; ``cursors`` is
    each segment's subscriptions, ``ends`` its end offset (for seeks)."""

    created: dict[int, list[str]] = field(default_factory=dict)  # child -> subscriptions
    sealed: dict[int, SealedBy] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    cursors: dict[int, set[str]] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)
    down: set[int] = field(default_factory=set)  # segments whose calls fail
    copies: dict[int, Replication] = field(default_factory=dict)  # the replication asked
    replicas: Keeper = field(default_factory=lambda: Keeper())

    async def subscriptions_of(self, names: list[SegmentName]) -> set[str]:
        return set().union(*(self.cursors.get(n.segment_id, set()) for n in names))

    async def create(
        self,
        name: SegmentName,
        info: SegmentInfo,
        subscriptions: list[str],
        epoch: int,
        *,
        replication: Replication = ONE_COPY,
    ) -> None:
        assert epoch == EPOCH and info.segment_id == name.segment_id
        self.created[name.segment_id] = subscriptions
        self.copies[name.segment_id] = replication
        self.calls.append(f"create {name.segment_id}")

    async def terminate(self, name: SegmentName, epoch: int, sealed: SealedBy) -> int:
        assert self.sealed.get(name.segment_id, sealed) == sealed, "sealed twice, differently"
        self.sealed[name.segment_id] = sealed
        self.calls.append(f"seal {name.segment_id}")
        return 0

    async def create_subscription(
        self, name: SegmentName, subscription: str, position: str, epoch: int
    ) -> None:
        self._reach(name, epoch)
        self.cursors.setdefault(name.segment_id, set()).add(subscription)

    async def delete_subscription(self, name: SegmentName, subscription: str, epoch: int) -> None:
        self._reach(name, epoch)
        self.cursors.get(name.segment_id, set()).discard(subscription)

    async def seek(
        self, name: SegmentName, subscription: str, to: ResetTarget, epoch: int
    ) -> dict[str, Any]:
        """Earliest: at 0; latest (or a moment to come): at the end, finished if sealed."""
        self._reach(name, epoch)
        end = self.ends.get(name.segment_id, 0)
        position = 0 if to == "earliest" else end
        sealed = name.segment_id in self.sealed
        self.calls.append(f"seek {name.segment_id} {subscription} {to}")
        return {"position": position, "finished": sealed and position == end}

    def announce_layout(self) -> None:
        self.calls.append("announce")

    def start_in_background(self, names: list[SegmentName]) -> None:
        self.calls.append("start " + " ".join(str(n.segment_id) for n in names))

    async def destroy(self, name: SegmentName, epoch: int) -> None:
        """Safe to repeat, as the real one: a segment already gone is gone."""
        self._reach(name, epoch)
        self.cursors.pop(name.segment_id, None)
        self.calls.append(f"destroy {name.segment_id}")

    async def delete_incarnation(self) -> None:
        self.calls.append("delete incarnation")

    def _reach(self, name: SegmentName, epoch: int) -> None:
        assert epoch == EPOCH
        if name.segment_id in self.down:
            raise Down(name.segment_id)


@dataclass
class Coordinators:
    """What the controller would do to subscriptions' coordinators, as a record of calls."""

    calls: list[str] = field(default_factory=list)

    def start(self, subscription: str) -> None:
        self.calls.append(f"start {subscription}")

    async def reset(self, subscription: str, finished: list[int]) -> None:
        self.calls.append(f"reset {subscription} {finished}")

    async def stop(self, subscription: str) -> None:
        self.calls.append(f"stop {subscription}")

    async def stop_all(self) -> None:
        self.calls.append("stop all")


class Metrics:
    def operation(self, kind: str, seconds: float) -> None:
        assert seconds >= 0


def setup(
    subscriptions: dict[str, set[int]], segments: int = 2
) -> tuple[Catalog, Fleet, TopicParts]:
    """A topic of ``segments`` segments whose ``subscriptions`` (name → the segments
    holding its cursor) exist, as the catalog, the fleet and the parts."""
    catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))
    record = TopicRecord.new(SegmentLayout.initial(segments), new_incarnation(), EPOCH)
    catalog.create_topic(TOPIC, record)
    for name in subscriptions:
        catalog.create_subscription(TOPIC, SubscriptionMetadata(name=name))
    cursors = {s: {n for n, on in subscriptions.items() if s in on} for s in range(segments)}
    fleet = Fleet(cursors=cursors)
    parts = TopicParts(
        TOPIC,
        catalog,
        fleet,  # type: ignore[arg-type]
        Coordinators(),  # type: ignore[arg-type]
        Metrics(),  # type: ignore[arg-type]
        leader_epoch=lambda: EPOCH,
        read_record=lambda: catalog.require_topic(TOPIC),
    )
    return catalog, fleet, parts
