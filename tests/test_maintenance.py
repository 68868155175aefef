"""A topic's maintenance rounds as state logic, without Ray (``actors.control.maintenance``):
the catalog in memory, and a fleet stand-in that answers each round with the stats a
test sets and records what the round asks of the segments.

A round observes every segment once, then acts on the topic's policy: retention
prunes sealed, drained roots older than its time and trims the active segments;
tiering moves sealed segments (and ends the actors of moved or idle ones); hibernation
ends the actors of drained, idle sealed ones; autoscaling splits what is busy. A
segment that does not answer is left alone, and the autoscaler's refusals for want of
room are kept for stats. On real Ray: test_retention, test_tiering, test_hibernation,
test_autoscale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from controller_parts import EPOCH, TOPIC, Coordinators  # tests/ is on sys.path under pytest

from actors.control.maintenance import TopicMaintenance
from actors.control.topic_parts import LayoutCommands, TopicParts
from runtime.errors import InsufficientCapacityError
from runtime.layout import SegmentInfo, SegmentLayout
from runtime.names import SegmentName
from runtime.operations import OperationKind, PendingOperation, plan_split
from runtime.policy import TopicPolicy
from runtime.replication import Replication
from storage.catalog import Catalog
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.records import TopicRecord
from storage.segment_store import SealedBy
from storage.topic_storage import new_incarnation

NOW_MS = 1_800_000_000_000
HOUR_MS = 3_600_000


def segment(*, sealed: bool = False, backlog: int = 0, **extra: Any) -> dict[str, Any]:
    """A segment's stats as its actor reports them (``SegmentStore.stats``)."""
    return {
        "terminated": sealed,
        "subscriptions": {"s": {"backlog": backlog, "markDelete": 100 - backlog}},
        "lastPublishTimeMs": NOW_MS - 2 * HOUR_MS,
        "endOffset": 100,
        "sizeBytes": 10_000,
        "tiered": False,
        "idleS": 0.0,
        **({"sealedAtMs": NOW_MS - HOUR_MS} if sealed else {}),
        **extra,
    }


@dataclass
class Empty:
    """No tiered or sleeping segments, or those of ``ids``."""

    ids: list[int] = field(default_factory=list)
    records = property(lambda self: self)

    def segment_ids(self) -> list[int]:
        return self.ids

    def tiered(self, segment_id: int) -> None:
        return None

    def get(self, segment_id: int) -> None:
        return None


@dataclass
class Replicas:
    """The fleet's replica keeper: the rounds it was asked for."""

    rounds: list[tuple[list[int], list[int], Replication]] = field(default_factory=list)
    retired: list[list[int]] = field(default_factory=list)
    due: asyncio.Event = field(default_factory=asyncio.Event)

    async def retire(self, tiered: Mapping[int, SegmentInfo]) -> None:
        self.retired.append(sorted(tiered))

    async def round(
        self,
        segments: Mapping[int, SegmentInfo],
        replication: Replication,
        sealed: Mapping[int, SegmentInfo],
    ) -> None:
        self.rounds.append((sorted(segments), sorted(sealed), replication))


@dataclass
class Segments:
    """The fleet as a round sees it: ``stats`` is what each running segment answers."""

    stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    records_changed: int = 0
    node_local: bool = False
    replicas: Replicas = field(default_factory=lambda: Replicas())
    tiered: list[int] = field(default_factory=list)
    asleep: list[int] = field(default_factory=list)

    async def observe(
        self, names: dict[int, SegmentName], on_demand: set[int], wait_s: float
    ) -> dict[int, dict[str, Any]]:
        return {i: st for i, st in self.stats.items() if i in names}

    async def terminate(self, name: SegmentName, epoch: int, sealed: SealedBy) -> int:
        self.calls.append(f"seal {name.segment_id} {sealed.children} at {sealed.epoch} ({epoch})")
        return 0

    async def retain(self, names: list[SegmentName], oldest: int | None, size: int | None):
        self.calls.append(f"retain {sorted(n.segment_id for n in names)} size={size}")

    async def offload(self, handle: int, uri: str) -> None:
        self.calls.append(f"offload {handle} to {uri}")

    def watched(self, name: SegmentName) -> int | None:
        return name.segment_id if name.segment_id in self.stats else None

    def hibernate(self, name: SegmentName) -> None:
        self.calls.append(f"hibernate {name.segment_id}")

    async def put_to_sleep(self, name: SegmentName, stats: dict[str, Any]) -> None:
        self.calls.append(f"sleep {name.segment_id}")

    def hibernating(self, name: SegmentName) -> bool:
        return name.segment_id in self.tiered + self.asleep and name.segment_id not in self.stats

    def storage(self) -> Empty:
        return Empty(self.tiered)

    def sleeping(self) -> Empty:
        return Empty(self.asleep)


class Metrics:
    """Every gauge a round sets, by method name."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[Any, ...]]] = {}

    def __getattr__(self, method: str) -> Any:
        return lambda *args: self.calls.setdefault(method, []).append(args)


@dataclass
class Commands:
    calls: list[str] = field(default_factory=list)
    refuse: Exception | None = None

    async def split(self, segment_id: int) -> dict[str, Any]:
        if self.refuse is not None:
            raise self.refuse
        self.calls.append(f"split {segment_id}")
        return {}

    async def merge(self, first: int, second: int) -> dict[str, Any]:
        self.calls.append(f"merge {first} {second}")
        return {}

    async def prune(self, segment_ids: list[int]) -> list[int]:
        self.calls.append(f"prune {segment_ids}")
        return segment_ids


def maintained(
    layout: SegmentLayout, policy: dict[str, Any]
) -> tuple[TopicMaintenance, Segments, Commands, Metrics]:
    catalog = Catalog(store=MetadataStore(kv=MemoryKeyValue()))
    record = TopicRecord.new(layout, new_incarnation(), EPOCH)
    parsed = TopicPolicy.parse(policy)
    catalog.create_topic(TOPIC, record.model_copy(update={"policy": parsed}))
    fleet, commands, metrics = Segments(), Commands(), Metrics()
    parts = TopicParts(
        TOPIC,
        catalog,
        fleet,  # type: ignore[arg-type]
        Coordinators(),  # type: ignore[arg-type]
        metrics,  # type: ignore[arg-type]
        leader_epoch=lambda: EPOCH,
        read_record=lambda: catalog.require_topic(TOPIC),
    )
    lay = LayoutCommands(commands.split, commands.merge, commands.prune)
    return TopicMaintenance(parts, lay), fleet, commands, metrics


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actors.control.maintenance.time.time_ns", lambda: NOW_MS * 1_000_000)


def split_twice() -> SegmentLayout:
    """0 split into 2 and 3, then 2 into 4 and 5: sealed 0 and 2, active 1, 3, 4, 5."""
    return SegmentLayout.initial(2).split_segment(0).split_segment(2)


def test_retention_prunes_drained_roots_first_and_trims_the_active_segments() -> None:
    maintenance, fleet, commands, _ = maintained(
        split_twice(), {"retention": {"timeS": 60, "sizeBytes": 1 << 20}}
    )
    fleet.stats = {i: segment() for i in (1, 3, 4, 5)}
    fleet.stats[0] = segment(sealed=True)
    fleet.stats[2] = segment(sealed=True)
    asyncio.run(maintenance.tick())
    assert commands.calls == ["prune [0, 2]"]  # a parent before its child
    assert fleet.calls == [f"retain [1, 3, 4, 5] size={1 << 20}"]


def test_retention_keeps_what_is_unread_recent_or_not_reported() -> None:
    maintenance, fleet, commands, _ = maintained(split_twice(), {"retention": {"timeS": 60}})
    fleet.stats = {i: segment() for i in (1, 3, 4, 5)}
    fleet.stats[0] = segment(sealed=True, backlog=5)  # a subscription still owes it
    asyncio.run(maintenance.tick())  # 2 did not answer: not knowing is no reason to delete
    assert commands.calls == []
    fleet.stats[0] = segment(sealed=True)
    fleet.stats[2] = segment(sealed=True, lastPublishTimeMs=NOW_MS - 1000)  # newer than 60 s
    asyncio.run(maintenance.tick())
    assert commands.calls == ["prune [0]"]


def test_tiering_moves_sealed_segments_then_ends_their_actors(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("RAYTOPICS_TIER_URIS", f"file://{tmp_path}/")
    uri = f"file://{tmp_path}/t"
    maintenance, fleet, _, _ = maintained(
        split_twice(), {"tiering": {"uri": uri, "afterS": 0, "idleS": 5}}
    )
    fleet.stats = {i: segment() for i in (1, 3, 4, 5)}
    fleet.stats[0] = segment(sealed=True)
    fleet.stats[2] = segment(sealed=True, tiered=True, idleS=7.5)  # moved, unused since

    async def round_and_moves() -> None:
        await maintenance.tick()
        await asyncio.sleep(0.01)  # the moves run in the background

    asyncio.run(round_and_moves())
    assert fleet.calls == ["hibernate 2", f"offload 0 to {uri}", "hibernate 0"]


def test_hibernation_ends_drained_idle_sealed_segments_only() -> None:
    maintenance, fleet, _, _ = maintained(split_twice(), {"hibernation": {"idleS": 30}})
    fleet.stats = {i: segment(idleS=600.0) for i in (1, 3, 4, 5)}  # active: never
    fleet.stats[0] = segment(sealed=True, idleS=31.0)
    fleet.stats[2] = segment(sealed=True, idleS=31.0, backlog=1)  # still owed to a reader
    asyncio.run(maintenance.tick())
    assert fleet.calls == ["sleep 0"]


def test_a_segment_sealed_in_the_layout_but_not_at_its_leader_is_sealed_again() -> None:
    """A replicated segment's leader sealed by a split and lost before its followers
    learned of it: the one that leads now is sealed as the split sealed the old one."""
    maintenance, fleet, _, _ = maintained(split_twice(), {})
    fleet.stats = {i: segment() for i in (1, 3, 4, 5)}
    fleet.stats[0] = segment(sealed=True)
    fleet.stats[2] = segment(sealed=False)  # sealed in the layout (split into 4 and 5)
    asyncio.run(maintenance.tick())
    sealed_at = split_twice().get(2).sealed_at_epoch
    assert fleet.calls == [f"seal 2 (4, 5) at {sealed_at} ({EPOCH})"]


def test_autoscale_splits_a_busy_segment_and_keeps_a_refusal_for_stats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("actors.control.maintenance.time.monotonic", lambda: clock[0])
    policy = {"autoscale": {"windowS": 10, "cooldownS": 0, "targetMsgsPerS": 100, "minSegments": 2}}
    maintenance, fleet, commands, metrics = maintained(SegmentLayout.initial(2), policy)
    refusal = InsufficientCapacityError("no room for 2 more segments")
    commands.refuse = refusal
    for second in range(0, 24, 2):
        clock[0] = 1000.0 + second
        fleet.stats = {
            0: segment(endOffset=1_000 * second, sizeBytes=100 * second),  # 1,000 msgs/s
            1: segment(endOffset=second, sizeBytes=second),
        }
        asyncio.run(maintenance.tick())
    assert commands.calls == []
    held = maintenance.held_back
    assert held is not None and held["kind"] == "split" and held["segmentIds"] == [0]
    assert held["code"] == refusal.code and metrics.calls["held_back"][0] == ("split", refusal.code)
    commands.refuse = None
    clock[0] += 2
    fleet.stats[0] = segment(endOffset=1_000 * 26, sizeBytes=100 * 26)
    asyncio.run(maintenance.tick())
    assert commands.calls == ["split 0"] and maintenance.held_back is None


def test_a_round_publishes_backlogs_and_layout_gauges() -> None:
    maintenance, fleet, _, metrics = maintained(split_twice(), {})
    fleet.stats = {i: segment(backlog=i) for i in (1, 3, 4, 5)}
    asyncio.run(maintenance.tick())
    assert metrics.calls["layout"] == [(4, 2)]
    assert metrics.calls["leader"] == [(EPOCH,)]
    assert metrics.calls["storage"] == [(4, 0)]
    assert metrics.calls["subscription"] == [("s", 1 + 3 + 4 + 5, 0)]  # summed over segments


def test_replicas_are_kept_every_round_with_a_disk_per_node_even_during_an_operation() -> None:
    policy = {"replication": {"factor": 3}}
    maintenance, fleet, _, metrics = maintained(split_twice(), policy)
    fleet.node_local = True
    fleet.stats = {i: segment() for i in (1, 3, 4, 5)}
    assert asyncio.run(maintenance.tick()).replicas == Replication(3, 2)
    catalog = maintenance._ctl.catalog
    pending = plan_split(catalog.require_topic(TOPIC).layout, 1, "r1")
    catalog.update_topic(TOPIC, lambda r: r.model_copy(update={"pending_operation": pending}))
    asyncio.run(maintenance.tick())  # stats wait for the operation; replicas do not
    # the sealed segments' replicas serve their readers: kept too
    assert fleet.replicas.rounds == [([1, 3, 4, 5], [0, 2], Replication(3, 2))] * 2
    assert metrics.calls["layout"] == [(4, 2)]  # published once: the second round had no stats


def test_no_replica_round_runs_while_the_topic_is_being_created() -> None:
    """Its segments' replicas are being laid out: a round would start them early."""
    maintenance, fleet, _, _ = maintained(split_twice(), {"replication": {"factor": 3}})
    fleet.node_local = True
    catalog = maintenance._ctl.catalog
    creating = PendingOperation(kind=OperationKind.CREATE, request_id="r", base_epoch=0)
    catalog.update_topic(TOPIC, lambda r: r.model_copy(update={"pending_operation": creating}))
    asyncio.run(maintenance.tick())
    assert fleet.replicas.rounds == []
    catalog.update_topic(TOPIC, lambda r: r.model_copy(update={"pending_operation": None}))
    asyncio.run(maintenance.tick())
    assert len(fleet.replicas.rounds) == 1


def test_sealed_segments_in_the_tier_or_asleep_are_not_kept_by_replicas() -> None:
    """The tier serves a tiered segment, and no replica of a sleeping one runs."""
    maintenance, fleet, _, _ = maintained(split_twice(), {"replication": {"factor": 3}})
    fleet.node_local, fleet.tiered, fleet.asleep = True, [0], [2]
    fleet.stats = {i: segment() for i in (1, 3, 4, 5)}
    asyncio.run(maintenance.tick())
    assert fleet.replicas.rounds == [([1, 3, 4, 5], [], Replication(3, 2))]
    # the tier keeps a tiered one from now on: its followers' copies go
    assert fleet.replicas.retired == [[0]]


def test_without_a_disk_per_node_no_replica_round_runs() -> None:
    maintenance, fleet, _, _ = maintained(split_twice(), {"replication": {"factor": 3}})
    fleet.stats = {i: segment() for i in (1, 3, 4, 5)}
    asyncio.run(maintenance.tick())
    assert fleet.replicas.rounds == []


def test_a_round_due_at_once_cuts_the_pause_short() -> None:
    """Segments created or a policy set: the next round does not wait out the pause."""
    maintenance, fleet, _, _ = maintained(split_twice(), {})

    async def paused() -> float:
        started = asyncio.get_running_loop().time()
        asyncio.get_running_loop().call_later(0.05, fleet.replicas.due.set)
        await maintenance._pause(30)
        return asyncio.get_running_loop().time() - started

    assert asyncio.run(paused()) < 5
    assert not fleet.replicas.due.is_set()  # the next pause is a whole one again
