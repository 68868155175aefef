"""Admission by capacity on a real local Ray: what does not fit is refused up front.

Every segment actor declares its memory to Ray, so Ray's scheduler accounts for
it. To make the cluster "full" without filling the machine, a ballast actor
declares (without using) all but a little of the free memory: from then on
Ray's books say there is room for a few segments only, exactly as if real
segments held the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray
from test_clients import wait_for

from actors.capacity import free_memory_per_node, node_rooms
from actors.control.controller_host import controller_actor
from actors.registry import named_actors
from actors.segment.directory import SegmentDirectory
from clients import Producer, StreamConsumer
from runtime.capacity import SegmentFootprint
from runtime.errors import InsufficientCapacityError
from runtime.names import TopicName
from runtime.segment_hosts import (
    controller_host_name,
    coordinator_host_name,
    host_prefix,
    idle_exit_s,
)
from storage.durability import default_storage_root

SEGMENT = SegmentFootprint.from_env()


@ray.remote(num_cpus=0)
class Ballast:
    def ready(self) -> bool:
        return True


def fitting(topic: str) -> int:
    return SEGMENT.fitting(*node_rooms(TopicName.parse(topic)))


@pytest.fixture
def room_for(ray_cluster) -> Iterator:
    """``room_for(n, topic)``: leave room for ``n`` more segments (and less than n + 1)."""
    ballast: list[ray.actor.ActorHandle] = []

    def leave(segments: int, topic: str) -> None:
        settled(TopicName.parse(topic))
        # Memory that earlier tests' segments give back arrives late: top up until
        # exactly ``segments`` fit, each ballast waited for until Ray's books show it.
        deadline = time.monotonic() + 60
        while (room := fitting(topic)) != segments:
            assert time.monotonic() < deadline, f"room for {room} segments, not {segments}"
            if room < segments:  # something took room after the ballast was sized
                if ballast:
                    ray.kill(ballast.pop())
                    wait_for(lambda: fitting(topic) > room, 30, "Ray to see the ballast go")
                else:  # an earlier release not in Ray's books yet
                    time.sleep(0.2)
                continue
            free = max(free_memory_per_node(TopicName.parse(topic)))
            held = int(free - (segments + 0.5) * SEGMENT.memory_bytes)
            actor = Ballast.options(memory=held).remote()
            ray.get(actor.ready.remote())
            ballast.append(actor)
            wait_for(lambda: fitting(topic) < room, 30, "Ray to see the ballast")

    def most_free() -> float:
        return max(free_memory_per_node(TopicName.parse("topic://capacity/ns/any")))

    free_before = most_free()
    yield leave
    for actor in ballast:
        ray.kill(actor)
    # Ray's books lag a kill by a resource report; the next test must see the room back.
    wait_for(lambda: most_free() > free_before - 8 * SEGMENT.memory_bytes, 30, "the room back")


def settled(topic: TopicName) -> None:
    """Waits until Ray's books of free memory stay put for longer than a host's idle
    exit: the hosts of the tests before this one exit ``idle_exit_s()`` after their
    topics were deleted, and the memory one gives back after the ballast was sized
    would leave room for more segments than the test asked for."""
    window = idle_exit_s() + 1.0
    last, since = free_memory_per_node(topic), time.monotonic()
    deadline = since + 60
    while time.monotonic() - since < window:
        assert time.monotonic() < deadline, "Ray's books of free memory kept moving"
        time.sleep(0.2)
        if (now := free_memory_per_node(topic)) != last:
            last, since = now, time.monotonic()


def produce_and_consume(topic: str, count: int) -> None:
    """Every one of ``count`` keyed messages comes back through subscription ``s``."""
    values = [f"v{i}".encode() for i in range(count)]
    with Producer(topic) as producer:
        producer.send_batch(values, keys=[f"k{i}" for i in range(count)]).result(30)
    consumer = StreamConsumer(topic, "s", "c")
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.receive_batch(count, timeout=1):
            got.append(message.value)
            consumer.acknowledge_cumulative(message)
    consumer.close()
    assert sorted(got) == sorted(values)


def topic_actors(topic: str) -> list[str]:
    """What serves ``topic``: the segments its namespace's hosts serve of it, and its
    namespace's hosts (of controllers, coordinators and segments)."""
    name = TopicName.parse(topic)
    hosts = [controller_host_name(name), coordinator_host_name(name), host_prefix(name)]
    return sorted(SegmentDirectory().of_topic(name)) + [
        found for prefix in hosts for found in named_actors(prefix)
    ]


def test_a_topic_larger_than_the_cluster_is_refused_and_changes_nothing(
    admin, unique, kv_snapshot
) -> None:
    topic = f"topic://capacity/ns/big-{unique}"
    asked = fitting(topic) + 1
    before, used_before = kv_snapshot(), psutil.virtual_memory().used
    actors_before = topic_actors(topic)  # its namespace's hosts, if another test left one
    started = time.monotonic()
    with pytest.raises(InsufficientCapacityError) as refused:
        admin.create_scalable_topic(topic, asked)
    assert time.monotonic() - started < 5, "refused at once"
    message = refused.value.message
    for said in (f"creating {topic}", f"{asked} new segment actors", "more fit"):
        assert said in message, message
    assert kv_snapshot() == before, "no metadata"
    # Nothing new (a host another test left may have exited meanwhile, idle).
    assert set(topic_actors(topic)) <= set(actors_before), "no actors, no segments served"
    assert not (Path(default_storage_root()) / "capacity" / "ns" / f"big-{unique}").exists()
    assert psutil.virtual_memory().used - used_before < 500 << 20, "memory did not move"


def test_the_controller_refuses_too_even_when_asked_directly(admin, unique, room_for) -> None:
    """The admin client's early check only saves starting a controller: the controller
    is the authority, so a caller that skips the client is refused as well."""
    topic = f"topic://capacity/ns/direct-{unique}"
    room_for(2, topic)
    hosts_before = named_actors(host_prefix(TopicName.parse(topic)))
    controller = controller_actor(TopicName.parse(topic), create=True)
    with pytest.raises(InsufficientCapacityError, match="3 new segment actors"):
        ray.get(controller.create.remote(3))
    assert topic not in admin.list_scalable_topics("capacity/ns")
    assert SegmentDirectory().of_topic(TopicName.parse(topic)) == {}, "no segment served"
    assert named_actors(host_prefix(TopicName.parse(topic))) == hosts_before, "no host started"
    ray.get(controller.close(None))  # the topic was never made: its controller stops


def test_a_split_past_capacity_is_refused_and_the_topic_keeps_working(
    admin, unique, room_for
) -> None:
    topic = f"topic://capacity/ns/split-{unique}"
    admin.create_scalable_topic(topic, 1)
    admin.create_subscription(topic, "s")
    room_for(1, topic)
    (only,) = admin.get_layout(topic).active_segments
    with pytest.raises(InsufficientCapacityError, match=f"splitting segment {only} of {topic}"):
        admin.split_segment(topic, only)
    layout = admin.get_layout(topic)
    assert list(layout.active_segments) == [only] and layout.epoch == 0, "nothing half-done"
    produce_and_consume(topic, 100)
    admin.delete_scalable_topic(topic)


def test_the_largest_topic_that_fits_is_created_and_works(admin, unique, room_for) -> None:
    topic = f"topic://capacity/ns/fits-{unique}"
    room_for(4, topic)
    with pytest.raises(InsufficientCapacityError):
        admin.create_scalable_topic(topic, 5)
    admin.create_scalable_topic(topic, 4)
    admin.create_subscription(topic, "s")
    produce_and_consume(topic, 400)
    admin.delete_scalable_topic(topic)


def test_the_autoscaler_is_held_back_by_capacity_and_says_so(admin, unique, room_for) -> None:
    from test_autoscale_load import produce
    from test_metrics import scrape, total

    topic = f"topic://capacity/ns/auto-{unique}"
    admin.create_scalable_topic(topic, 1)
    policy = {"targetMsgsPerS": 50, "maxSegments": 8, "cooldownS": 1, "windowS": 1}
    admin.set_policy(topic, {"autoscale": policy})
    room_for(1, topic)  # a split starts two children
    sent: list = []
    with Producer(topic) as producer:
        deadline = time.monotonic() + 30
        while admin.get_stats(topic)["autoscale"]["heldBack"] is None:
            assert time.monotonic() < deadline, "the autoscaler never wanted to split"
            produce(producer, 300, 0.5, sent)
    held = admin.get_stats(topic)["autoscale"]["heldBack"]
    assert held["kind"] == "split" and held["code"] == "insufficient_capacity", held
    assert "new segment actors" in held["message"]
    layout = admin.get_layout(topic)
    assert len(layout.active_segments) == 1 and layout.epoch == 0, "the topic stays as it is"
    wait_for(
        lambda: (total(scrape(), "autoscale_held_back_total", topic=topic, kind="split") or 0) >= 1,
        60,
        "the held-back split in the metrics",
    )
    admin.delete_scalable_topic(topic)


@pytest.mark.integration  # a Ray of its own, with the default settings
def test_a_machine_filled_over_rest_still_serves(tmp_path: Path) -> None:
    """Topics are created over REST until admission refuses one (by CPU on this
    machine: 16 segments per core); a minute later the cluster keeps at most half the
    cores busy, a producer's sends are acknowledged quickly and stats answer. The
    cluster's own CPU is held, not the machine's load average, which counts the other
    worker's tests too. The bounds are generous (the suite runs beside);
    bench/README.md has the figures against the goal of load <= 2x the cores, send
    p99 <= 100 ms and stats <= 200 ms."""
    out = tmp_path / "fill.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYTOPICS_SEGMENT")}
    env.pop("RAY_ADDRESS", None)
    bench = Path(__file__).resolve().parents[1] / "bench" / "capacity.py"
    subprocess.run(
        [sys.executable, str(bench), "--fill", "--out", str(out)],
        env=env, check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    cores = result["cores"]
    assert result["refusal"]["status"] == 409, result
    assert result["refusal"]["error"] == "insufficient_capacity", result
    assert "per CPU" in result["refusal"]["message"], result
    assert 0 < result["segments_admitted"] <= cores * 16, result
    assert result["cluster_processes"] >= 3, result  # GCS, raylet, segment hosts at least
    assert result["cluster_cpu_cores"] <= cores / 2, result
    assert result["send_ack_ms"]["p99"] <= 500, result
    assert result["get_stats_ms_max"] <= 1000, result
