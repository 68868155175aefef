"""The controller's replica keeper and fleet around replicated segments, without Ray (the
parts they call are stand-ins; ``tests/test_replicated_topic.py`` runs them on a cluster):

- a leader whose data plane refuses connections is lost at once (an election), a follower
  whose does is waited for (Ray restarts its host) until its grace;
- a replicated segment put to sleep closes its followers with its leader (left open, each
  would keep asking its closed leader for entries), and a reader or a new subscription
  wakes it even when its leader's node went meanwhile (its replicas elect a leader among
  the live ones);
- a segment moved to the tier loses its followers' copies, then its replica record.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

import runtime.remote as remote
from actors.control import replica_keeper, segment_calls
from actors.control.replica_asks import Asked
from actors.control.replica_keeper import ReplicaKeeper
from actors.control.segment_fleet import SegmentFleet
from runtime.errors import UnavailableError
from runtime.layout import HashRange, SegmentInfo
from runtime.names import MAX_HASH, TopicName
from runtime.replication import Replication
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.placements import SegmentPlacements
from storage.replica_sets import ReplicaSet

TOPIC = TopicName.parse("topic://tenant/ns/orders")
ONE = TOPIC.segment(1, 0, MAX_HASH)


@pytest.fixture(autouse=True)
def quick_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "REACH_PAUSE_S", 0.01)
    # the system's own credential is kept in the GCS: none here
    monkeypatch.setattr(segment_calls, "guard", lambda: SimpleNamespace(internal_token=str))


class Sleeping:
    """The fleet's ``SleepingSegments``: which segments sleep, and what was asked."""

    def __init__(self, *asleep: int) -> None:
        self.asleep = set(asleep)

    def get(self, segment_id: int) -> dict | None:
        return {"hibernating": True} if segment_id in self.asleep else None

    def put_to_sleep(self, segment_id: int, stats: dict) -> None:
        self.asleep.add(segment_id)

    def woken(self, segment_id: int) -> None:
        self.asleep.discard(segment_id)


def fleet(
    replicated: bool, leader_live: bool | list[bool], sleeping: Sleeping
) -> tuple[Any, list[str]]:
    """A ``SegmentFleet`` on disks per node whose segment 1 sleeps: its leader's disk has
    a live node or not (at each start in turn, the last answer kept); ``calls`` records
    what the fleet asked of its parts."""
    live = leader_live if isinstance(leader_live, list) else [leader_live]
    calls: list[str] = []
    f = object.__new__(SegmentFleet)
    f.node_local = True
    f.sleeping = lambda: sleeping
    f.storage = lambda: SimpleNamespace(
        tiered=lambda _i: None, records=SimpleNamespace(add_cursor=lambda *_a: False)
    )
    f.running = lambda _name: None
    f.hibernate = lambda name: calls.append(f"hibernate {name.segment_id}")

    async def rest(name: Any) -> None:
        calls.append(f"rest {name.segment_id}")

    f.replicas = SimpleNamespace(
        sets=lambda: SimpleNamespace(get=lambda i: ("set", 1) if replicated else None),
        rest=rest,
    )

    def handle(name: Any) -> Any:
        calls.append(f"start {name.segment_id}")
        if not live[min(calls.count(f"start {name.segment_id}"), len(live)) - 1]:
            raise UnavailableError(f"{name}: its files are on node disk d0, which no live node has")
        return SimpleNamespace(
            create_subscription=SimpleNamespace(remote=lambda *a, **k: subscribed(a))
        )

    async def subscribed(args: tuple) -> int:
        calls.append(f"subscribed {args[0]}")
        return 0

    f.handle = handle
    return f, calls


def test_a_replicated_segment_put_to_sleep_closes_its_followers_too() -> None:
    sleeping = Sleeping()
    f, calls = fleet(replicated=True, leader_live=True, sleeping=sleeping)
    asyncio.run(f.put_to_sleep(ONE, {"terminated": True}))
    assert calls == ["hibernate 1", "rest 1"] and sleeping.asleep == {1}
    f, calls = fleet(replicated=False, leader_live=True, sleeping=Sleeping())
    asyncio.run(f.put_to_sleep(ONE, {"terminated": True}))
    assert calls == ["hibernate 1"]  # one copy: its actor is all there is


def test_a_sleeping_replicated_segment_wakes_though_its_leaders_node_is_gone() -> None:
    """Woken for the replica rounds, which start its followers and elect one; the reader
    retries meanwhile. One copy on a lost disk stays refused, as before."""
    sleeping = Sleeping(1)
    f, calls = fleet(replicated=True, leader_live=False, sleeping=sleeping)
    assert f.wake(ONE) is True
    assert sleeping.asleep == set() and calls == ["start 1"]
    f, _ = fleet(replicated=False, leader_live=False, sleeping=Sleeping(1))
    with pytest.raises(UnavailableError, match="no live node"):
        f.wake(ONE)
    assert f.wake(TOPIC.segment(2, 0, MAX_HASH)) is False  # not asleep


def test_a_subscription_created_on_a_sleeping_replicated_segment_waits_for_its_leader() -> None:
    """Its leader's node gone: asked again (``_reach``) until a replica leads it."""
    sleeping = Sleeping(1)
    f, calls = fleet(replicated=True, leader_live=[False, False, False, True], sleeping=sleeping)
    asyncio.run(f.create_subscription(ONE, "again", "earliest", 3))
    assert sleeping.asleep == set()
    assert calls == ["start 1"] * 4 + ["subscribed again"]
    sleeping = Sleeping(1)  # with one copy, its disk's node gone: refused at once
    f, calls = fleet(replicated=False, leader_live=[False, True], sleeping=sleeping)
    with pytest.raises(UnavailableError):
        asyncio.run(f.create_subscription(ONE, "again", "earliest", 3))
    assert calls == ["start 1"] and sleeping.asleep == {1}


def test_resting_closes_every_replica_but_the_leader_and_keeps_the_record() -> None:
    record = ReplicaSet(4, ("d0", "d1", "d2"))
    closed: list[str] = []
    keeper = object.__new__(ReplicaKeeper)
    keeper._watches = {1: "watch", 2: "watch"}
    keeper.sets = lambda: SimpleNamespace(get=lambda i: (record, 9) if i == 1 else None)

    async def close(name: Any, disk: str) -> str:
        closed.append(disk)
        return "node"

    keeper._close_replica = close
    asyncio.run(keeper.rest(ONE))
    assert closed == ["d1", "d2"] and keeper._watches == {2: "watch"}
    asyncio.run(keeper.rest(TOPIC.segment(3, 0, MAX_HASH)))  # not replicated: nothing
    assert closed == ["d1", "d2"]


def test_a_segment_moved_to_the_tier_loses_its_followers_copies_then_its_record() -> None:
    """The tier keeps it from now on; the leader's copy is the mover's to drop."""
    records = {1: ReplicaSet(4, ("d0", "d1", "d2")), 2: ReplicaSet(2, ("d3", "d4", "d5"))}
    steps: list[str] = []
    keeper = object.__new__(ReplicaKeeper)
    keeper.topic = TOPIC
    keeper._watches = {1: "watch", 2: "watch"}
    keeper.sets = lambda: SimpleNamespace(
        all=lambda: dict(records),
        delete=lambda i: steps.append(f"record {i}") or records.pop(i),
    )

    async def remove(name: Any, disk: str) -> None:
        steps.append(f"remove {name.segment_id} {disk}")

    keeper._remove_replica = remove
    tiered = {1: SegmentInfo.active(1, HashRange(start=0, end=MAX_HASH), 1)}
    asyncio.run(keeper.retire(tiered))
    assert steps == ["remove 1 d1", "remove 1 d2", "record 1"]
    assert set(records) == {2} and keeper._watches == {2: "watch"}


def keep(
    refused: set[tuple[int, str]],
    silent: set[str],
    started: list[str] | None = None,
    own: frozenset[str] = frozenset(),
) -> list[Any]:
    """One round's steps for segment 1 (d0 leads epoch 4, d1 and d2 follow) whose replicas
    in ``silent`` did not answer and whose data planes in ``refused`` refused the probe;
    ``started``: the silent replicas whose hosts were asked to open them; ``own``: the
    disks of the controller's node."""
    record = ReplicaSet(4, ("d0", "d1", "d2"))
    keeper = object.__new__(ReplicaKeeper)
    keeper.topic, keeper._watches, keeper.metrics = TOPIC, {}, None
    keeper._disks = SimpleNamespace(own_disks=lambda: set(own))
    opened = [] if started is None else started
    keeper._start = lambda name, node, leads: opened.append(node)
    steps: list[Any] = []

    async def carry_out(step: Any, *args: Any) -> None:
        steps.append(step)

    keeper._carry_out = carry_out
    roles = {"d0": ("leader", 4), "d1": ("follower", 4), "d2": ("follower", 4)}
    asked = Asked(
        {(1, d): {"role": role, "epoch": epoch, "highWatermark": 0, "endOffset": 0}
         for d, (role, epoch) in roles.items() if d not in silent},
        refused,
    )  # fmt: skip
    info = SegmentInfo.active(1, HashRange(start=0, end=MAX_HASH), 1)
    nodes = {"d0": "n0", "d1": "n1", "d2": "n2", "d3": "n3"}
    replication = Replication.of(3, 2)
    asyncio.run(keeper._keep(None, info, record, replication, nodes, asked))
    return steps


def test_a_leader_whose_data_plane_refuses_is_replaced_at_once_a_follower_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replica_keeper, "guard", lambda: SimpleNamespace(internal_token=str))
    monkeypatch.setattr(replica_keeper.time, "monotonic", lambda: 0.5)  # within the grace
    # silent, nothing refused: slow, not lost, within its grace
    assert keep(set(), {"d0"}) == []
    # the leader's process is gone (its data plane refused): an election among the others
    (step,) = keep({(1, "d0")}, {"d0"})
    assert isinstance(step, replica_keeper.Elect) and step.candidates == ("d1", "d2")
    # a follower's host that crashed: Ray restarts it, so it is not replaced in its grace
    assert keep({(1, "d1")}, {"d1"}) == []
    # another segment's refusal says nothing of this one
    assert keep({(2, "d0")}, {"d0"}) == []


def test_a_replica_silent_in_its_first_round_is_started_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its host may not run yet (a new segment, a restart): the grace counts from the round
    that found it silent, however long that round's asks took, so it is started first."""
    monkeypatch.setattr(replica_keeper, "guard", lambda: SimpleNamespace(internal_token=str))
    monkeypatch.setattr(replica_keeper, "_grace_s", lambda: 2.0)
    monkeypatch.setattr(replica_keeper.time, "monotonic", lambda: 1000.0)
    started: list[str] = []
    assert keep(set(), {"d1", "d2"}, started) == [] and started == ["n1", "n2"]


def test_an_incarnation_starting_forgets_the_replicas_the_rounds_saw() -> None:
    """Recovered or created anew, a topic's replicas were all closed: stats must not show
    the old ones in sync until the next round saw the new ones."""
    published: list[int] = []
    keeper = object.__new__(ReplicaKeeper)
    keeper.metrics = SimpleNamespace(replicas=lambda under, _lag: published.append(under))
    view = [{"replica": "d0", "role": "leader", "inSync": False}]
    keeper._watches = {1: replica_keeper._Watch("0000-ffff-1", view=view)}
    assert keeper.views() == {"1": {"replicas": view, "unavailable": None}}
    keeper.forget()
    assert keeper.views() == {} and published == [0]


def test_a_healthy_lead_on_the_controllers_node_is_handed_to_an_in_sync_follower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replica_keeper, "guard", lambda: SimpleNamespace(internal_token=str))
    assert keep(set(), set(), own=frozenset({"d0"})) == [replica_keeper.HandOver("d1")]
    assert keep(set(), set(), own=frozenset({"d2"})) == []  # a follower there: nothing to do
    assert keep(set(), set()) == []


def carry_out_hand_over(
    monkeypatch: pytest.MonkeyPatch, handed: bool
) -> tuple[list, Any, MetadataStore]:
    """``HandOver("d1")`` carried out for segment 1 (d0 leads epoch 4 on the controller's
    node) whose leader says ``handed``: the elections run, the segment's watch, and the
    metadata store."""
    elected: list[tuple] = []

    async def elect(sets, segment_id, candidates, replication, calls, also_fenced=(), avoid=()):  # noqa: ANN001, ANN202
        elected.append((candidates, avoid))
        return ReplicaSet(5, ("d1", "d0", "d2"))

    async def hand_over(leader: str, to: str, wait_s: float) -> bool:
        return handed

    monkeypatch.setattr(replica_keeper, "elect", elect)
    keeper = object.__new__(ReplicaKeeper)
    keeper.topic, keeper.metrics, keeper._incarnation = TOPIC, None, lambda: "i"
    keeper._store = MetadataStore(kv=MemoryKeyValue())
    keeper._disks = SimpleNamespace(own_disks=lambda: {"d0"})
    watch = replica_keeper._Watch("0000-ffff-1")
    info = SegmentInfo.active(1, HashRange(start=0, end=MAX_HASH), 1)
    record = ReplicaSet(4, ("d0", "d1", "d2"))
    calls = SimpleNamespace(hand_over=hand_over)
    step = replica_keeper.HandOver("d1")
    asyncio.run(keeper._carry_out(step, None, info, record, Replication.of(3, 2), calls, watch))
    return elected, watch, keeper._store


def test_a_lead_handed_over_is_elected_among_all_replicas_off_the_controllers_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    elected, watch, store = carry_out_hand_over(monkeypatch, handed=True)
    assert elected == [(("d0", "d1", "d2"), frozenset({"d0"}))]
    assert SegmentPlacements(store, TOPIC, "i").get(1) == "d1"  # restarts find it there
    assert watch.hand_over_after > replica_keeper.time.monotonic()  # not tried again at once
    elected, _, _ = carry_out_hand_over(monkeypatch, handed=False)
    assert elected == []  # the follower did not catch up: the leader keeps its lead
