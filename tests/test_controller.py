"""Controller acceptance: crash-safe split/merge, concurrency, fencing, lifecycle."""

from __future__ import annotations

import asyncio
import os
import random

import pytest
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from actors.control.controller import ScalableTopicController
from actors.control.controller_host import controller_actor
from clients import ScalableTopicsAdmin
from runtime.config import ray_namespace
from runtime.errors import (
    ConflictError,
    InvalidArgumentError,
    ScalableTopicsError,
    SegmentNotActiveError,
    SegmentNotFoundError,
    StaleEpochError,
    SubscriptionAlreadyExistsError,
    SubscriptionNotFoundError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from runtime.remote import call
from storage.catalog import Catalog
from storage.topic_storage import incarnation_directory, segment_directory
from tests.segments import segment_actor


@pytest.fixture(scope="module")
def admin(ray_cluster) -> ScalableTopicsAdmin:
    return ScalableTopicsAdmin()


def segment_stats(topic: str, layout: SegmentLayout, segment_id: int) -> dict:
    info = layout.all_segments[segment_id]
    name = TopicName.parse(topic).segment(segment_id, info.hash_range.start, info.hash_range.end)
    return ray.get(segment_actor(name).stats.remote())


def assert_operation_complete(admin, topic, parents, subscriptions) -> SegmentLayout:
    layout = admin.get_layout(topic)
    layout.check_invariants()
    assert layout.to_dict().get("pendingOperation") is None
    for parent in parents:
        info = layout.all_segments[parent]
        assert not info.is_active, f"segment {parent} should be sealed"
        assert segment_stats(topic, layout, parent)["terminated"], f"{parent} still writable"
        for child in info.child_ids:
            assert layout.all_segments[child].is_active
            subs = set(segment_stats(topic, layout, child)["subscriptions"])
            assert subs == set(subscriptions), f"child {child} lost a subscription"
    return layout


@pytest.mark.parametrize("kind", ["split", "merge"])
@pytest.mark.parametrize("step", [1, 2, 3, 4])
def test_controller_crash_after_each_protocol_step_rolls_forward(admin, unique, kind, step):
    topic = f"topic://ctl/ns/crash-{kind}{step}-{unique}"
    admin.create_scalable_topic(topic, 2)
    for sub in ("alpha", "beta"):
        admin.create_subscription(topic, sub)
    handle = controller_actor(TopicName.parse(topic))
    pid_before = ray.get(handle.ready.remote())["pid"]
    ray.get(handle.inject_fault_after_step.remote(step))

    if kind == "split":
        result = admin.split_segment(topic, 0)
        parents = [0]
    else:
        result = admin.merge_segments(topic, 0, 1)
        parents = [0, 1]

    assert ray.get(handle.ready.remote())["pid"] != pid_before, "the controller did not crash"
    assert tuple(result["parents"]) == tuple(parents)
    layout = assert_operation_complete(admin, topic, parents, ["alpha", "beta"])
    assert layout.epoch == 1, "the operation must be applied exactly once"
    admin.delete_scalable_topic(topic)


def test_concurrent_split_merge_requests_are_serialized(admin, unique):
    topic = f"topic://ctl/ns/conc-{unique}"
    admin.create_scalable_topic(topic, 8)
    rnd = random.Random(7)
    requests = []
    for _ in range(20):
        if rnd.random() < 0.5:
            requests.append(("split", (rnd.randrange(12),)))
        else:
            first = rnd.randrange(11)
            requests.append(("merge", (first, first + 1)))

    async def run_all():
        calls = [
            admin.split_segment_async(topic, *a)
            if k == "split"
            else admin.merge_segments_async(topic, *a)
            for k, a in requests
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(run_all())
    successes = [r for r in results if isinstance(r, dict)]
    failures = [r for r in results if not isinstance(r, dict)]
    for failure in failures:
        assert isinstance(failure, ScalableTopicsError), repr(failure)
        assert failure.message and str(failure.http_status).startswith("4")
    assert successes, "at least one request must succeed"
    layout = admin.get_layout(topic)
    layout.check_invariants()
    assert layout.epoch == len(successes)
    admin.delete_scalable_topic(topic)


async def wait_until_ready(name: TopicName, above_epoch: int = 0, timeout_s: float = 30.0) -> dict:
    """The controller's ``ready()`` once it leads at an epoch above ``above_epoch``
    (``ray.kill`` is asynchronous: the old process may still answer a first call)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            ready = await call(controller_actor(name).ready.remote())
            if ready["leaderEpoch"] > above_epoch:
                return ready
        except (ActorUnavailableError, ActorDiedError):
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no controller of {name} above epoch {above_epoch} in time")
        await asyncio.sleep(0.2)


def test_stale_controller_cannot_change_metadata_or_segments(admin, unique):
    topic = f"topic://ctl/ns/stale-{unique}"
    admin.create_scalable_topic(topic, 2)
    name = TopicName.parse(topic)
    root = os.environ["RAYTOPICS_STORAGE_ROOT"]

    async def scenario():
        old = ScalableTopicController(topic, root, {"policy": "interval", "interval_s": 0.2})
        await old.ready()
        ray.kill(controller_actor(name).host, no_restart=False)  # Ray restarts it: newer epoch
        await wait_until_ready(name, above_epoch=old.epoch)  # Ray restarted it: newer epoch
        before = admin.get_metadata(topic)
        with pytest.raises(StaleEpochError):
            await old.split_segment(0)
        with pytest.raises(StaleEpochError):
            await old.terminate_segment(str(name.segment(1, 0x8000, 0xFFFF)), force=True)
        assert admin.get_metadata(topic) == before
        layout = admin.get_layout(topic)
        assert not segment_stats(topic, layout, 1)["terminated"]

    asyncio.run(scenario())
    admin.split_segment(topic, 1)  # the current leader still works
    admin.delete_scalable_topic(topic)


def test_topic_lifecycle_and_errors_leave_nothing_half_created(admin, unique):
    ns = f"life{unique}/ns"
    topic = f"topic://{ns}/orders"
    catalog = Catalog(ray_namespace())
    for bad in (0, -1, 65537, 2.5, "4", True):
        with pytest.raises(InvalidArgumentError):
            admin.create_scalable_topic(topic, bad)
    assert catalog.topics(ns) == [] and catalog.store.list(f"/topics/{ns}") == []
    with pytest.raises(ValueError):
        controller_actor(TopicName.parse(topic))  # no controller was started either

    created = admin.create_scalable_topic(topic, 3)
    assert created["epoch"] == 0 and len(created["segments"]) == 3
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_scalable_topic(topic, 3)
    assert admin.list_scalable_topics(ns) == [topic]

    admin.create_subscription(topic, "s1")
    with pytest.raises(SubscriptionAlreadyExistsError):
        admin.create_subscription(topic, "s1")
    admin.split_segment(topic, 0)
    layout = admin.get_layout(topic)
    for seg in layout.all_segments:
        assert "s1" in segment_stats(topic, layout, seg)["subscriptions"]
    admin.create_subscription(topic, "late", position="latest")
    for seg in layout.all_segments:  # active and sealed segments both get it
        assert "late" in segment_stats(topic, layout, seg)["subscriptions"]
    admin.delete_subscription(topic, "s1")
    for seg in layout.all_segments:
        assert "s1" not in segment_stats(topic, layout, seg)["subscriptions"]
    with pytest.raises(SubscriptionNotFoundError):
        admin.delete_subscription(topic, "s1")
    assert admin.list_subscriptions(topic) == ["late"]

    with pytest.raises(SegmentNotActiveError):
        admin.split_segment(topic, 0)
    root, incarnation = os.environ["RAYTOPICS_STORAGE_ROOT"], admin.get_stats(topic)["incarnation"]
    directories = [
        segment_directory(
            root,
            TopicName.parse(topic).segment(s.segment_id, s.hash_range.start, s.hash_range.end),
            incarnation,
        )
        for s in layout.all_segments.values()
    ]
    assert all(d.exists() for d in directories)
    admin.delete_scalable_topic(topic)
    assert admin.list_scalable_topics(ns) == []
    assert catalog.topics(ns) == [] and catalog.store.list(f"/topics/{ns}") == []
    assert not any(d.exists() for d in directories)
    assert not incarnation_directory(root, TopicName.parse(topic), incarnation).exists()
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    assert not any(topic[len("topic://") :] in n for n in names)
    with pytest.raises(TopicNotFoundError):
        admin.delete_scalable_topic(topic)
    with pytest.raises(TopicNotFoundError):
        admin.split_segment(topic, 0)


def test_segments_api_through_the_controller(admin, unique):
    topic = f"topic://ctl/ns/segapi-{unique}"
    admin.create_scalable_topic(topic, 2)
    name = TopicName.parse(topic)
    extra = str(name.segment(50, 0, 0xFF))
    admin.create_segment(extra, ["x", "y"])
    handle = segment_actor(name.segment(50, 0, 0xFF))
    assert ray.get(handle.subscriptions.remote()) == ["x", "y"]
    with pytest.raises(SegmentNotFoundError, match="not in the layout"):
        admin.terminate_segment(extra)
    admin.delete_segment(extra)
    with pytest.raises(SegmentNotFoundError):
        admin.delete_segment(extra)
    active = str(name.segment(0, 0, 0x7FFF))
    with pytest.raises(ConflictError, match="ACTIVE"):
        admin.delete_segment(active)
    with pytest.raises(ConflictError, match="ACTIVE"):
        admin.terminate_segment(active)
    # segment 0 exists with another range: this name is no segment of the layout
    with pytest.raises(SegmentNotFoundError, match="is not in the layout"):
        admin.terminate_segment(str(name.segment(0, 0, 0x3FFF)))
    with pytest.raises(SegmentNotFoundError, match="is not in the layout"):
        admin.create_segment(str(name.segment(1, 0, 0x3FFF)))
    with pytest.raises(TopicNotFoundError):
        admin.terminate_segment("segment://other/ns/t/0000-ffff-0")
    layout = admin.get_layout(topic)
    assert admin.terminate_segment(active, force=True) == 0
    assert segment_stats(topic, layout, 0)["terminated"]
    admin.delete_scalable_topic(topic)
