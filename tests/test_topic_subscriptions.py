"""A topic's subscriptions as its controller manages them, without Ray
(``actors.control.topic_subscriptions`` and ``subscription_reset``): the catalog in
memory, the fleet and the coordinators as records of calls (``tests/controller_parts.py``).

Creating and deleting reach every segment of the DAG, sealed ones too, and are
recorded first, so a controller that dies half-way (a segment that cannot be reached
is the same thing here) leaves the subscription CREATING or DELETING and the next
incarnation's ``finish_all`` completes it. Checkpoint groups have no cursors: they are
neither given to segments nor counted as live subscriptions. A reset moves every
cursor and then the coordinator's record of finished segments, and is refused, with
nothing moved, for an unknown subscription, a checkpoint group or one with consumers.
On real Ray: test_consumers, test_subscription_reset, test_recovery.
"""

from __future__ import annotations

import asyncio

import pytest
from controller_parts import TOPIC, Down, setup  # tests/ is on sys.path under pytest

from actors.control.subscription_reset import reset_subscription
from actors.control.topic_parts import TopicParts
from actors.control.topic_subscriptions import TopicSubscriptions
from runtime.errors import (
    ConflictError,
    SubscriptionAlreadyExistsError,
    SubscriptionNotFoundError,
    UnauthorizedError,
)
from storage.records import (
    ConsumerRegistration,
    SubscriptionMetadata,
    SubscriptionState,
)
from storage.segment_store import SealedBy


def subscriptions(parts: TopicParts) -> tuple[TopicSubscriptions, list[int]]:
    """The manager, and how often it rewrote the incarnation's ``topic.json``."""
    written: list[int] = []
    return TopicSubscriptions(parts, lambda: written.append(1)), written


def state(parts: TopicParts, name: str) -> str | None:
    meta = parts.catalog.subscription(TOPIC, name)
    return None if meta is None else meta.state


def test_a_subscription_gets_a_cursor_on_every_segment_and_its_coordinator() -> None:
    _, fleet, parts = setup({}, segments=3)
    manager, written = subscriptions(parts)
    asyncio.run(manager.create(SubscriptionMetadata(name="s", position="latest", owner="ann")))
    assert state(parts, "s") == SubscriptionState.ACTIVE
    assert all("s" in fleet.cursors[i] for i in range(3))
    assert parts.coordinators.calls == ["start s"] and written == [1]
    assert list(manager.live()) == ["s"]
    assert manager.settings()["s"].position == "latest"


def test_a_create_cut_half_way_is_finished_by_the_next_incarnation() -> None:
    _, fleet, parts = setup({}, segments=3)
    manager, written = subscriptions(parts)
    fleet.down = {2}
    with pytest.raises(Down):
        asyncio.run(manager.create(SubscriptionMetadata(name="s")))
    assert state(parts, "s") == SubscriptionState.CREATING and written == []
    assert parts.coordinators.calls == []  # no coordinator before every cursor exists
    fleet.down = set()
    asyncio.run(manager.finish_all())  # the next incarnation's recovery
    assert state(parts, "s") == SubscriptionState.ACTIVE
    assert all("s" in fleet.cursors[i] for i in range(3))
    assert parts.coordinators.calls == ["start s"]
    asyncio.run(manager.finish_all())  # nothing left to do: nothing done again
    assert parts.coordinators.calls == ["start s"] and written == [1]


def test_the_create_that_made_a_subscription_sent_again_finishes_it_others_are_refused() -> None:
    """A create cut half-way whose caller retries it (the same request id) is finished by
    the retry and answered as done; a create of the same name with another id, or with
    none, is refused as a duplicate, changing nothing."""
    _, fleet, parts = setup({}, segments=3)
    manager, _ = subscriptions(parts)
    fleet.down = {1}
    with pytest.raises(Down):
        asyncio.run(manager.create(SubscriptionMetadata(name="s", created_by="r1")))
    fleet.down = set()
    for other in ("r2", None):
        with pytest.raises(SubscriptionAlreadyExistsError):
            asyncio.run(manager.create(SubscriptionMetadata(name="s", created_by=other)))
        assert state(parts, "s") == SubscriptionState.CREATING
    asyncio.run(manager.create(SubscriptionMetadata(name="s", created_by="r1")))
    assert state(parts, "s") == SubscriptionState.ACTIVE
    assert all("s" in fleet.cursors[i] for i in range(3))
    asyncio.run(manager.create(SubscriptionMetadata(name="s", created_by="r1")))  # once more
    assert parts.coordinators.calls == ["start s"]
    with pytest.raises(SubscriptionAlreadyExistsError):
        asyncio.run(manager.create(SubscriptionMetadata(name="s", created_by="r3")))


def test_a_delete_cut_half_way_is_finished_and_the_subscription_is_gone_everywhere() -> None:
    _, fleet, parts = setup({"s": {0, 1}, "t": {0, 1}})
    manager, written = subscriptions(parts)
    for name in ("s", "t"):
        parts.catalog.update_subscription(
            TOPIC, name, lambda m: m.model_copy(update={"state": SubscriptionState.ACTIVE})
        )
    fleet.down = {1}
    with pytest.raises(Down):
        asyncio.run(manager.delete("s"))
    assert state(parts, "s") == SubscriptionState.DELETING
    assert "s" not in manager.live() and "s" not in manager.settings()
    # A split meanwhile gives its children the live subscriptions only.
    assert manager.with_cursors({"s", "t", "gone-by"}) == ["gone-by", "t"]
    fleet.down = set()
    asyncio.run(manager.finish_all())
    assert state(parts, "s") is None and state(parts, "t") == SubscriptionState.ACTIVE
    assert fleet.cursors == {0: {"t"}, 1: {"t"}}
    assert parts.coordinators.calls == ["stop s", "stop s"] and written == [1]


def test_a_consumer_may_delete_only_the_subscriptions_it_created() -> None:
    _, fleet, parts = setup({})
    manager, _ = subscriptions(parts)
    asyncio.run(manager.create(SubscriptionMetadata(name="s", owner="ann")))
    with pytest.raises(UnauthorizedError, match="only the subscriptions it created"):
        asyncio.run(manager.delete("s", only_of="bob"))
    assert state(parts, "s") == SubscriptionState.ACTIVE and "s" in fleet.cursors[0]
    asyncio.run(manager.delete("s", only_of="ann"))
    assert state(parts, "s") is None


def test_checkpoint_groups_have_no_cursors_and_are_not_live_subscriptions() -> None:
    catalog, _, parts = setup({"s": {0, 1}})
    catalog.ensure_group(TOPIC, "g", 30.0)
    manager, _ = subscriptions(parts)
    assert "g" not in manager.live() and manager.with_cursors(set()) == ["s"]
    asyncio.run(manager.finish_all())  # a group is ACTIVE from the start: nothing to do
    assert parts.coordinators.calls == ["start s"]


def test_a_reset_moves_every_cursor_then_the_coordinator() -> None:
    _, fleet, parts = setup({"s": {0, 1}}, segments=2)
    fleet.ends = {0: 40, 1: 7}
    fleet.sealed[1] = SealedBy(children=(2,), epoch=1)  # finished once its cursor is at its end
    answer = asyncio.run(reset_subscription(parts, "s", "latest"))
    assert answer["positions"] == {"0": 40, "1": 7} and answer["finishedSegments"] == [1]
    assert parts.coordinators.calls == ["reset s [1]"]
    answer = asyncio.run(reset_subscription(parts, "s", "earliest"))
    assert answer["positions"] == {"0": 0, "1": 0} and answer["finishedSegments"] == []
    assert not answer["inTheFuture"]


def test_a_reset_is_refused_with_nothing_moved() -> None:
    catalog, fleet, parts = setup({"s": {0, 1}})
    catalog.ensure_group(TOPIC, "g", 30.0)
    with pytest.raises(SubscriptionNotFoundError):
        asyncio.run(reset_subscription(parts, "nope", "earliest"))
    with pytest.raises(ConflictError, match="checkpoint group"):
        asyncio.run(reset_subscription(parts, "g", "earliest"))
    registration = ConsumerRegistration(consumer_name="c1", assigned_segments=(0,), layout_epoch=0)
    catalog.put_registration(TOPIC, "s", registration)
    with pytest.raises(ConflictError, match=r"registered consumer\(s\) \(c1\)"):
        asyncio.run(reset_subscription(parts, "s", "earliest"))
    assert not any(call.startswith("seek") for call in fleet.calls)
    assert parts.coordinators.calls == []
