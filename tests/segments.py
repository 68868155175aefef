"""What tests do to segments' processes: segments share host processes
(``actors.segment.directory``), so "the segment's actor dies" is either its host
crashing (every segment it serves restarts with it) or its host closing it."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import ray

from actors.guard import guard
from actors.segment import lookup
from actors.segment.handle import SegmentHandle
from actors.segment.host import close_segment
from actors.segment.lookup import served_entries, served_segments
from runtime.names import SegmentName, TopicName
from storage.durability import default_storage_root
from storage.topic_storage import segment_directory

# The system config of a ``cluster_utils.Cluster`` head where a test removes nodes: Ray
# declares a killed node dead after 5 failed checks a second apart instead of 3 s apart.
# A check of a node that is alive but slow still waits Ray's 10 s before it fails, so
# a busy machine does not lose live nodes to it.
NODE_LOSS_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}

__all__ = [
    "crash_host_of",
    "lose_storage",
    "segment_actor",
    "segment_nodes",
    "served_segments",
    "stop_serving",
]


def stop_serving(name: SegmentName) -> None:
    """End ``name``'s service until its controller opens it again: as if its own process
    had died for good (its host and the host's other segments go on)."""
    ray.get(close_segment(lookup.segment_actor(name), guard().internal_token()), timeout=60)


def crash_host_of(name: SegmentName) -> ray.actor.ActorHandle:
    """Kill the process serving ``name``, as a crash would: Ray restarts it (with every
    segment it serves, each opened again on its first call)."""
    host = lookup.segment_actor(name).host
    ray.kill(host, no_restart=False)
    return host


def segment_nodes(topic: TopicName) -> dict[str, str]:
    """The node of each served segment of ``topic`` (by actor name), its host alive."""
    return {name: entry.node for name, entry in served_entries(topic).items()}


def segment_actor(name: SegmentName, timeout_s: float = 60.0) -> SegmentHandle:
    """The segment's handle, waiting while its host has not opened it yet (a topic's
    segments are opened in the background after it is created)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return lookup.segment_actor(name)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def lose_storage(names: list[SegmentName], incarnation: str) -> None:
    """Move the segments' files away (a disk lost) and crash the process serving them:
    opened again after the restart, each finds its storage gone and cannot be served
    (its directory entry says why), while the host's other segments serve on."""
    for name in names:
        directory = segment_directory(Path(default_storage_root()), name, incarnation)
        shutil.move(directory, directory.with_name(directory.name + ".moved"))
    hosts = {lookup.segment_actor(name).host for name in names}
    pids = {host: _pid(host) for host in hosts}
    for host in hosts:
        ray.kill(host, no_restart=False)
    # Back before the caller goes on: a reader given a few seconds must find the host's
    # other segments served, however long a loaded machine takes to restart a process.
    deadline = time.monotonic() + 60
    for host, pid in pids.items():
        while _pid(host) == pid:
            assert time.monotonic() < deadline, "a crashed segment host did not come back"
            time.sleep(0.1)


def _pid(host: ray.actor.ActorHandle) -> int:
    return ray.get(host.__ray_call__.remote(lambda _: os.getpid()), timeout=60)


def read_keyed(
    topic: str, subscription: str, expected: int, settle_s: float = 2.0
) -> list[tuple[str, int]]:
    """What a stream consumer of ``subscription`` receives of messages valued
    ``"{key}:{sequence}"`` (as ``(key, sequence)``), acknowledging as it goes, until
    ``expected`` came (or two minutes passed); then ``settle_s`` more, so that anything
    beyond what was expected (a duplicate) is received too."""
    from clients import StreamConsumer

    consumer = StreamConsumer(topic, subscription, "c")
    received: list[tuple[str, int]] = []

    def take(timeout: float) -> bool:
        batch = consumer.receive_batch(500, timeout=timeout)
        for message in batch:
            key, sequence = message.value.decode().split(":")
            received.append((key, int(sequence)))
        if batch:
            consumer.acknowledge_cumulative(batch)
        return bool(batch)

    deadline = time.monotonic() + 120
    while len(received) < expected and time.monotonic() < deadline:
        take(2)
    extra_until = time.monotonic() + settle_s
    while time.monotonic() < extra_until:
        take(0.5)
    consumer.close()
    return received
