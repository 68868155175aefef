"""A leader election's steps and their order (``actors.control.replica_election``), with
stand-in replicas: nothing is told before the choice is recorded, and a lost
compare-and-swap tells nothing."""

from __future__ import annotations

import asyncio

import pytest

from actors.control.replica_election import elect
from runtime.errors import BadVersion, NotEnoughReplicasError
from runtime.names import TopicName
from runtime.replication import ReplicaReport, Replication
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.replica_sets import ReplicaSet, ReplicaSets

THREE = Replication.of(3, 2)


class Replicas:
    """Stand-ins that record what they were told, in order."""

    def __init__(self, logs: dict[str, tuple[int, int] | None]) -> None:
        self.logs = logs  # replica -> (last epoch, end), None: does not answer
        self.told: list[tuple] = []
        self.before_told: list = []  # the record as it stood at each call after fencing
        self.records: ReplicaSets | None = None

    async def fence(self, replica: str, epoch: int) -> ReplicaReport | None:
        self.told.append(("fence", replica, epoch))
        log = self.logs[replica]
        return None if log is None else ReplicaReport(replica, *log)

    async def lead(self, replica: str, epoch: int, replication: Replication) -> None:
        self.told.append(("lead", replica, epoch))
        self.before_told.append(self.records.get(7)[0])

    async def follow(self, replica: str, epoch: int, leader: str) -> None:
        self.told.append(("follow", replica, epoch, leader))

    async def route_clients(self, leader: str, followers: tuple[str, ...]) -> None:
        self.told.append(("route", leader, followers))


def setup(logs: dict) -> tuple[ReplicaSets, Replicas]:
    records = ReplicaSets(MetadataStore(kv=MemoryKeyValue()), TopicName("t", "ns", "x"), "i")
    records.create(7, ReplicaSet(3, ("d1", "d2", "d3")))
    replicas = Replicas(logs)
    replicas.records = records
    return records, replicas


def test_the_most_up_to_date_replica_leads_once_the_choice_is_recorded() -> None:
    records, replicas = setup({"d1": None, "d2": (3, 40), "d3": (3, 42)})
    elected = asyncio.run(elect(records, 7, ("d1", "d2", "d3"), THREE, replicas))
    assert elected == ReplicaSet(4, ("d3", "d1", "d2")) == records.get(7)[0]
    assert replicas.before_told == [elected]  # recorded before the leader was told
    assert replicas.told[3:] == [
        ("lead", "d3", 4),
        ("route", "d3", ("d1", "d2")),
        ("follow", "d2", 4, "d3"),
    ]  # fmt: skip  d1 did not answer: the maintenance round tells it when it is back


def test_a_tie_keeps_the_leader_the_record_names() -> None:
    """A new segment's first election (nobody leads yet, every log alike) keeps the leader
    its placement chose, so leaders spread as the placement spread them."""
    records, replicas = setup({"d1": (0, 0), "d2": (0, 0), "d3": (0, 0)})
    elected = asyncio.run(elect(records, 7, ("d1", "d2", "d3"), THREE, replicas))
    assert elected == ReplicaSet(4, ("d1", "d2", "d3"))


def test_a_tie_goes_off_the_controllers_node_before_the_recorded_leader() -> None:
    """The recorded leader's disk is on the controller's node: an equally up-to-date
    replica elsewhere leads, so losing that node would not take both."""
    records, replicas = setup({"d1": (3, 42), "d2": (3, 42), "d3": (3, 40)})
    avoid = frozenset({"d1"})
    elected = asyncio.run(elect(records, 7, ("d1", "d2", "d3"), THREE, replicas, avoid=avoid))
    assert elected == ReplicaSet(4, ("d2", "d1", "d3"))


def test_too_few_answers_elect_nobody_and_change_nothing() -> None:
    records, replicas = setup({"d1": None, "d2": None, "d3": (3, 42)})
    with pytest.raises(NotEnoughReplicasError, match="needs 2 of 3"):
        asyncio.run(elect(records, 7, ("d1", "d2", "d3"), THREE, replicas))
    assert records.get(7)[0] == ReplicaSet(3, ("d1", "d2", "d3"))
    assert [t[0] for t in replicas.told] == ["fence"] * 3


def test_an_election_that_loses_the_compare_and_swap_tells_nobody() -> None:
    """Another controller records its own election while this one is fencing."""
    records, replicas = setup({"d1": (3, 50), "d2": (3, 40), "d3": (3, 42)})

    class Raced(Replicas):
        async def fence(self, replica: str, epoch: int) -> ReplicaReport | None:
            if not self.told:
                current, version = records.get(7)
                records.change(7, version, current.elected("d2"))
            return await super().fence(replica, epoch)

    raced = Raced(replicas.logs)
    raced.records = records
    with pytest.raises(BadVersion):
        asyncio.run(elect(records, 7, ("d1", "d2", "d3"), THREE, raced))
    assert [t[0] for t in raced.told] == ["fence"] * 3
    assert records.get(7)[0] == ReplicaSet(4, ("d2", "d1", "d3"))


def test_a_replica_that_lost_its_files_is_fenced_yet_never_chosen_nor_told() -> None:
    """Its log is the longest (it wrote on to removed files): the lead still goes to a
    replica that has its files, and the lost one is left for the round to rebuild."""
    records, replicas = setup({"d1": (3, 90), "d2": (3, 40), "d3": (3, 42)})
    elected = asyncio.run(elect(records, 7, ("d2", "d3"), THREE, replicas, also_fenced=("d1",)))
    assert elected == ReplicaSet(4, ("d3", "d1", "d2"))
    assert ("fence", "d1", 4) in replicas.told
    assert [t for t in replicas.told if t[0] != "fence"] == [
        ("lead", "d3", 4),
        ("route", "d3", ("d1", "d2")),
        ("follow", "d2", 4, "d3"),
    ]  # fmt: skip
