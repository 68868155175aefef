"""A replicated topic survives a restart of all of Ray: every process of a three-node
cluster (a head on Redis and two workers on this machine, each node keeping segments
on its own disk, ``RAYTOPICS_STORAGE_SCOPE=node``) is SIGKILLed, then the same nodes
start again with the same disks and new node ids.

Before: the topic's two segments are three replicas each (ack quorum 2), a producer's
messages are acknowledged and a consumer acknowledged part of them. After: before any
admin call, each segment is three replicas again on the same disks, led at a newer epoch
(a restarted leader leads only through an election: ``runtime.replica_plan``), in sync;
the consumer receives exactly what it had not acknowledged, once each, in key order, and
what is produced after the restart too. Then the storage check, on a disk per node, scans
each node's disk and deletes what is orphaned there. Last, the topic's metadata is lost
(every record under its path deleted) and recovered from the copies on the three disks:
its layout, its subscription's position and every segment's three replicas come back,
and the consumer receives exactly what it had not acknowledged.

The programs run as subprocesses (this file as a script: ``before`` and ``after``), as in
``tests/test_head_restart.py``; ``tests/ray_head.py`` says how the nodes are killed.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration  # Rays of its own (own storage roots and Ray temp dir)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storage.durability import NODE_STORAGE_ROOT_ENV  # noqa: E402
from tests.chaos.invariants import delivery_violations  # noqa: E402
from tests.ray_head import head_on_redis, redis_server_binary, run_phase  # noqa: E402

NAMESPACE = "rr/orders"
TOPIC = f"topic://{NAMESPACE}/events"
POLICY = {"replication": {"factor": 3, "ackQuorum": 2}}
WORKERS = ("a", "b")  # and the head: three nodes, a replica on each
KEYS = 10
BEFORE, ACKED, AFTER = 200, 80, 40  # produced before, acknowledged of them, produced after
LOST = 30  # produced, not acknowledged, when the metadata is lost
DEADLINE_S = 90.0


@pytest.mark.timeout(400)
def test_a_replicated_topic_comes_back_whole_after_all_of_ray_restarts(tmp_path: Path) -> None:
    assert redis_server_binary(), "redis-server is missing: ./dev.sh test installs it"
    disks = {node: tmp_path / "disks" / node for node in ("head", *WORKERS)}
    node_env = {
        "RAYTOPICS_STORAGE_SCOPE": "node",
        "RAYTOPICS_REPLICA_GRACE_S": "2",
        NODE_STORAGE_ROOT_ENV: str(disks["head"]),
    }
    with head_on_redis(tmp_path, num_cpus=1, node_env=node_env) as head:
        for worker in WORKERS:
            head.add_worker({NODE_STORAGE_ROOT_ENV: str(disks[worker])}, {})
        namespace = f"rr-{uuid.uuid4().hex[:8]}"

        def run(phase: str) -> dict[str, Any]:
            out = tmp_path / f"{phase}.json"
            return run_phase(__file__, phase, out, head.env(namespace), timeout_s=240)

        before = run("before")
        assert head.kill() > 0
        head.start()
        head.start_workers()
        after = run("after")

    # before: each segment three replicas on three disks, the files of each on its disk
    for replicas in before["replicas"].values():
        assert len(set(replicas["disks"])) == 3, before
    # after: the same disks, a newer epoch, every replica in sync again
    assert set(after["replicas"]) == set(before["replicas"]), after
    for segment, replicas in after["replicas"].items():
        assert sorted(replicas["disks"]) == sorted(before["replicas"][segment]["disks"]), after
        assert replicas["epoch"] > before["replicas"][segment]["epoch"], after
        assert sorted(replicas["roles"]) == ["follower", "follower", "leader"], after
        assert replicas["nodes"] != before["replicas"][segment]["nodes"], "not restarted?"
    assert after["under_replicated"] == 0, after
    produced = [tuple(m) for m in before["produced"]]
    acked = {tuple(m) for m in before["acked"]}
    owed = [m for m in produced if m not in acked] + [tuple(m) for m in after["produced"]]
    got = [tuple(m) for m in after["received"]]
    assert len(acked) == ACKED and len(owed) == BEFORE - ACKED + AFTER
    assert delivery_violations(owed, got, exactly_once=True) == []
    assert len(got) == len(owed), "something was delivered that was not owed"
    # the storage check scans each node's disk on its node, and deletes there
    storage = after["storage"]
    assert storage["disks"] == storage["expected_disks"] and storage["unscanned"] == [], storage
    assert storage["orphaned"] == storage["expected_orphans"], storage
    assert storage["live"] == 1 and storage["deleted"] == 2, storage
    assert storage["planted_left"] == [] and storage["own_left"], storage
    # recovered from the copies on the disks: the same layout, replicas and position
    recovered = after["recovered"]
    assert recovered["listed"] is False and recovered["report"]["epoch"] > 0, recovered
    assert recovered["layout"] == recovered["layout_before"], recovered
    assert recovered["backlog"] == LOST, recovered
    for segment, replicas in recovered["replicas"].items():
        assert sorted(replicas["disks"]) == sorted(before["replicas"][segment]["disks"])
        assert replicas["epoch"] > after["replicas"][segment]["epoch"], recovered
        assert sorted(replicas["roles"]) == ["follower", "follower", "leader"], recovered
    lost = [tuple(m) for m in recovered["produced"]]
    got = [tuple(m) for m in recovered["received"]]
    assert delivery_violations(lost, got, exactly_once=True) == [] and len(got) == LOST


def _replicas(admin: Any) -> dict[str, dict[str, Any]]:
    """Each active segment's replicas as stats show them: disks, nodes, roles, epoch, and
    whether all are in sync; {} while a segment has no view yet."""
    from ray.exceptions import RayError

    from runtime.errors import ScalableTopicsError

    try:
        segments = admin.get_stats(TOPIC)["segments"]
    except (ScalableTopicsError, RayError) as err:  # a segment without a leader yet
        print("stats:", err, file=sys.stderr, flush=True)
        return {}
    views = {}
    for segment, stats in segments.items():
        if stats["state"] != "ACTIVE":
            continue
        replication = stats.get("replication") or {}
        replicas = replication.get("replicas") or []
        if len(replicas) != 3:
            return {}
        views[segment] = {
            "disks": [r["replica"] for r in replicas],
            "nodes": [r["node"] for r in replicas],
            "roles": [r["role"] for r in replicas],
            "epoch": replicas[0]["epoch"],
            "inSync": all(r["inSync"] for r in replicas),
        }
    return views


def _in_sync(admin: Any) -> dict[str, dict[str, Any]] | None:
    views = _replicas(admin)
    return views if views and all(v["inSync"] for v in views.values()) else None


def _produce(count: int, start: int) -> list[tuple[str, int]]:
    from clients import Producer

    sent = []
    with Producer(TOPIC) as producer:
        futures = []
        for seq in range(start, start + count):
            key = f"k{seq % KEYS}"
            futures.append(producer.send(f"{key}:{seq}".encode(), key=key))
            sent.append((key, seq))
        for future in futures:
            future.result(timeout=60)
    return sent


def _receive(consumer: Any, count: int, quiet_s: float) -> list[tuple[str, int]]:
    """``count`` messages, acknowledged, as ``(key, seq)``; then ``quiet_s`` more, so that
    anything beyond (a duplicate) is received too."""
    got: list[tuple[str, int]] = []

    def take(most: int) -> None:
        batch = consumer.receive_batch(most, timeout=0.5)
        for message in batch:
            key, seq = message.value.decode().split(":")
            got.append((key, int(seq)))
        if batch:
            consumer.acknowledge_cumulative(batch)

    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        take(min(100, count - len(got)))
    quiet_until = time.monotonic() + quiet_s
    while time.monotonic() < quiet_until:
        take(100)
    return got


def before(out: Path) -> None:
    from waiting import wait_for

    from clients import ScalableTopicsAdmin, StreamConsumer
    from runtime import connect

    connect()
    admin = ScalableTopicsAdmin()
    admin.set_namespace_policy(NAMESPACE, POLICY)
    admin.create_scalable_topic(TOPIC, 2)
    admin.wait_until_ready(TOPIC)
    admin.create_subscription(TOPIC, "s")
    wait_for(lambda: _in_sync(admin), DEADLINE_S, step_s=0.5)
    produced = _produce(BEFORE, 0)
    consumer = StreamConsumer(TOPIC, "s", "c1")
    acked = _receive(consumer, ACKED, quiet_s=0)
    consumer.close()
    # the acknowledgements reach the followers (the cursors are replicated) and disks
    wait_for(lambda: admin.get_stats(TOPIC)["subscriptions"]["s"]["backlog"] == BEFORE - ACKED,
             30, step_s=0.2)  # fmt: skip
    wait_for(lambda: _in_sync(admin), DEADLINE_S, step_s=0.5)
    time.sleep(1.5)  # cursors are saved at most a second after they move
    replicas = _in_sync(admin)
    out.write_text(json.dumps({"produced": produced, "acked": acked, "replicas": replicas}))


def after(out: Path) -> None:
    from waiting import wait_for

    from clients import ScalableTopicsAdmin, StreamConsumer
    from runtime import connect

    connect()
    admin = ScalableTopicsAdmin()
    # nothing is asked of the topic but its stats: Ray restarts its controller, whose
    # rounds find the disks on the new nodes and elect each segment's leader
    replicas = wait_for(lambda: _in_sync(admin), 120, step_s=1)
    produced = _produce(AFTER, BEFORE)
    consumer = StreamConsumer(TOPIC, "s", "c1")
    received = _receive(consumer, BEFORE - ACKED + AFTER, quiet_s=1)
    consumer.close()
    under = sum(not v["inSync"] for v in _replicas(admin).values())
    out.write_text(json.dumps({
        "replicas": replicas, "produced": produced, "received": received,
        "under_replicated": under, "storage": _storage_check(admin, out.parent / "disks"),
        "recovered": _recovered(admin),
    }))  # fmt: skip


def _recovered(admin: Any) -> dict[str, Any]:
    """Produce ``LOST`` messages nobody acknowledges, lose the topic's metadata, recover
    it from its copies on the three disks, and read what was owed."""
    from waiting import wait_for

    from clients import StreamConsumer
    from runtime.names import TopicName
    from storage.catalog import Catalog

    produced = _produce(LOST, BEFORE + AFTER)
    layout_before = admin.get_layout(TOPIC).to_dict()["segments"]
    time.sleep(1.5)  # the cursors moved by the last reads are saved on every replica
    Catalog().delete_topic(TopicName.parse(TOPIC))
    listed = TOPIC in admin.list_scalable_topics(NAMESPACE)
    report = admin.recover_topic(TOPIC)
    replicas = wait_for(lambda: _in_sync(admin), 120, step_s=1)
    backlog = admin.get_stats(TOPIC)["subscriptions"]["s"]["backlog"]
    consumer = StreamConsumer(TOPIC, "s", "c2")
    received = _receive(consumer, LOST, quiet_s=1)
    consumer.close()
    return {
        "listed": listed, "report": report, "replicas": replicas, "backlog": backlog,
        "layout_before": layout_before, "layout": admin.get_layout(TOPIC).to_dict()["segments"],
        "produced": produced, "received": received,
    }  # fmt: skip


def _storage_check(admin: Any, disks: Path) -> dict[str, Any]:
    """The storage check on a disk per node: the topic's storage copied under another
    name (whose metadata is "lost") on two of the three disks is found on both, each row
    naming its disk, and deleted there; the topic's own three copies count as one live
    incarnation and stay."""
    import shutil

    from runtime.names import TopicName
    from storage.placements import disk_id
    from storage.topic_storage import topic_directory

    lost = TopicName.parse(f"topic://{NAMESPACE}/lost")
    planted = []
    for node in WORKERS:
        source = topic_directory(disks / node, TopicName.parse(TOPIC))
        for incarnation in source.iterdir():
            target = topic_directory(disks / node, lost) / incarnation.name
            shutil.copytree(incarnation, target)
            planted.append(target)
    report = admin.check_storage()
    deleted = admin.check_storage(delete=True)
    own = topic_directory(disks / "head", TopicName.parse(TOPIC))
    return {
        "disks": sorted(d["disk"] for d in report["disks"]),
        "expected_disks": sorted(disk_id(disks / n) for n in ("head", *WORKERS)),
        "unscanned": report["unscanned"],
        "live": report["live"],
        "orphaned": sorted((r["topic"], r["disk"]) for r in report["orphaned"]),
        "expected_orphans": sorted((str(lost), disk_id(disks / n)) for n in WORKERS),
        "deleted": len(deleted["deleted"]),
        "planted_left": [str(p) for p in planted if p.exists()],
        "own_left": all(any(topic_directory(disks / n, TopicName.parse(TOPIC)).iterdir())
                        for n in ("head", *WORKERS)) and own.is_dir(),
    }  # fmt: skip


if __name__ == "__main__":
    {"before": before, "after": after}[sys.argv[1]](Path(sys.argv[2]))
