"""The segment fleet's bookkeeping of hibernating segments, without Ray: the actor lookups
and starts are replaced by a fake registry, so interleavings a loaded cluster makes rare
are made on purpose.

A reader wakes a tiered segment (``SegmentFleet.wake`` in a worker thread of the
controller) while a maintenance round observes the fleet; a round that looked the actor
up before it was registered must not mark it hibernating after it started, or no round
would ever observe it again, and it would never end when idle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from actors.control import segment_fleet
from actors.control.segment_fleet import SegmentFleet
from runtime.names import SegmentName, TopicName
from storage.catalog import Catalog
from storage.durability import Durability
from storage.metadata import MemoryKeyValue, MetadataStore

TOPIC = TopicName.parse("topic://t/ns/fleet")
NAME = SegmentName(TOPIC, 3, 0, 16383)


class Registry:
    """Ray's named actors as the fleet sees them: ``during_start`` runs while an actor is
    being started, before its name is registered."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.during_start: Callable[[], None] = lambda: None

    def segment_actor(self, name: SegmentName, *, create: bool = False, **_: object) -> str:
        if name.actor_name not in self.running:
            if not create:
                raise ValueError(f"no actor {name.actor_name}")
            self.during_start()
            self.running.add(name.actor_name)
        return name.actor_name


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    registry = Registry()
    monkeypatch.setattr(segment_fleet, "segment_actor", registry.segment_actor)
    return registry


@pytest.fixture
def fleet(tmp_path: Path) -> SegmentFleet:
    catalog = Catalog(store=MetadataStore("fleet-test", kv=MemoryKeyValue()))
    fleet = SegmentFleet(TOPIC, tmp_path, Durability(), lambda: None, catalog)
    fleet.incarnation = "i1"
    return fleet


def observe(fleet: SegmentFleet) -> None:
    """What a maintenance round does for a tiered segment (``TopicMaintenance._observe``)."""
    if fleet.hibernating(NAME):
        return
    starts = fleet.starts(NAME)
    if fleet.watched(NAME) is None:
        fleet.found_hibernating(NAME, starts)


def test_a_segment_observed_without_an_actor_hibernates(registry: Registry, fleet: SegmentFleet):
    observe(fleet)
    assert fleet.hibernating(NAME)
    fleet.handle(NAME)  # a reader wakes it
    assert not fleet.hibernating(NAME) and NAME.actor_name in registry.running


def test_an_observation_made_while_a_reader_wakes_the_segment_is_undone(
    registry: Registry, fleet: SegmentFleet
):
    registry.during_start = lambda: observe(fleet)  # looked up before it was registered
    fleet.handle(NAME)
    assert not fleet.hibernating(NAME)


def test_an_observation_whose_lookup_preceded_a_finished_start_is_ignored(
    registry: Registry, fleet: SegmentFleet
):
    starts = fleet.starts(NAME)
    assert fleet.watched(NAME) is None  # the round's lookup: no actor yet
    fleet.handle(NAME)  # the reader's start finishes before the round goes on
    fleet.found_hibernating(NAME, starts)
    assert not fleet.hibernating(NAME)
    observe(fleet)  # the next round sees it running
    assert not fleet.hibernating(NAME) and fleet.watched(NAME) == NAME.actor_name


def test_hibernate_marks_the_segment_until_it_is_started_again(
    registry: Registry, fleet: SegmentFleet, monkeypatch: pytest.MonkeyPatch
):
    killed: list[str] = []
    monkeypatch.setattr(segment_fleet.ray, "kill", lambda handle, **_: killed.append(handle))
    fleet.handle(NAME)
    fleet.hibernate(NAME)
    registry.running.discard(NAME.actor_name)
    assert killed == [NAME.actor_name] and fleet.hibernating(NAME)
    fleet.handle(NAME)
    assert not fleet.hibernating(NAME)
