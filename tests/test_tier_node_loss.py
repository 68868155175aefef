"""A tiered topic on a three-node cluster loses the node that runs a sealed, offloaded
segment's actor: nothing of the segment is lost and its reads work, because nothing of
it is on any node (its records are in the tier, its state in the metadata store).

The cluster runs in a subprocess (this file as a script), since this session's tests
share another Ray. The topic's actors are pinned to two worker nodes; every node of
this machine sees the same storage root, so the test also checks that the sealed
segments have no local files anywhere under it: what serves them after the node is
gone cannot have come from a disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPIC = "topic://tier/nodes/events"
PLACEMENT = {"tier/nodes": {"topics": 1}}
KEYS = 23


@pytest.mark.timeout(420)
def test_a_tiered_segment_outlives_the_node_that_ran_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {
        "RAYTOPICS_STORAGE_ROOT": str(tmp_path / "root"),
        "RAYTOPICS_TIER_URIS": f"file://{tmp_path / 'tier'}/",
        "RAYTOPICS_PLACEMENT": json.dumps(PLACEMENT),
        "RAY_AUTH_MODE": "disabled",
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sealed"] == 4 and result["local_files_of_sealed"] == []
    assert result["removed_node_ran"], result  # a woken tiered segment ran there
    assert result["before"] == result["after"] == result["sent"] == 1200
    assert result["order_violations"] == 0
    assert result["restarted_elsewhere"], result


def _produce(topic: str, count: dict[str, int], n: int) -> None:
    from clients import Producer

    with Producer(topic) as producer:
        for i in range(n):
            key = f"k{i % KEYS}"
            producer.send(f"{key}:{count[key]}".encode(), key=key)
            count[key] += 1


def _read_all(topic: str, subscription: str, expected: int) -> list[tuple[str, int]]:
    from clients import StreamConsumer

    consumer = StreamConsumer(topic, subscription, "c")
    received: list[tuple[str, int]] = []
    deadline = time.monotonic() + 120
    while len(received) < expected and time.monotonic() < deadline:
        batch = consumer.receive_batch(500, timeout=2)
        for message in batch:
            key, seq = message.value.decode().split(":")
            received.append((key, int(seq)))
        if batch:
            consumer.acknowledge_cumulative(batch)
    consumer.close()
    return received


def _order_violations(received: list[tuple[str, int]]) -> int:
    last: dict[str, int] = {}
    bad = 0
    for key, seq in received:
        bad += last.get(key, -1) != seq - 1
        last[key] = seq
    return bad


def _segment_nodes(prefix: str) -> dict[str, str]:
    """Alive actors whose name starts with ``prefix``: name → node id."""
    import ray._private.state as state

    return {
        a["Name"]: a["Address"]["NodeID"]
        for a in state.actors().values()
        if a["State"] == "ALIVE" and a["Name"].startswith(prefix)
    }


def _wait_for(condition, timeout_s: float = 90):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)
    return value


def main(scratch: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from clients import ScalableTopicsAdmin
    from runtime import connect
    from runtime.names import TopicName

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [cluster.add_node(num_cpus=1, resources={"topics": 100}) for _ in range(2)]
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="tiernodes", log_to_driver=False)
    try:
        admin = ScalableTopicsAdmin()
        admin.create_scalable_topic(TOPIC, 2)
        uri = f"file://{scratch / 'tier'}/events"
        admin.set_policy(TOPIC, {"tiering": {"uri": uri, "afterS": 0, "idleS": 600}})
        count: dict[str, int] = defaultdict(int)
        _produce(TOPIC, count, 300)
        admin.split_segment(TOPIC, 0)
        _produce(TOPIC, count, 300)
        admin.split_segment(TOPIC, 1)
        _produce(TOPIC, count, 300)
        active = sorted(
            admin.get_layout(TOPIC).active_segments.values(), key=lambda s: s.hash_range.start
        )
        admin.merge_segments(TOPIC, active[0].segment_id, active[1].segment_id)
        _produce(TOPIC, count, 300)
        sent = sum(count.values())
        expected = sorted((key, seq) for key, n in count.items() for seq in range(n))

        def all_hibernating() -> bool:
            segments = admin.get_stats(TOPIC)["segments"].values()
            sealed = [s for s in segments if s["state"] == "SEALED"]
            return bool(sealed) and all(s["hibernating"] for s in sealed)

        _wait_for(all_hibernating)
        name, layout = TopicName.parse(TOPIC), admin.get_layout(TOPIC)
        sealed = {
            i: info.name(name) for i, info in layout.all_segments.items() if not info.is_active
        }
        descriptors = {n.descriptor for n in sealed.values()}
        local_files = [str(p) for p in (scratch / "root").rglob("*") if set(p.parts) & descriptors]

        admin.create_subscription(TOPIC, "before", "earliest")
        before = _read_all(TOPIC, "before", sent)  # wakes every sealed segment
        running = _segment_nodes(f"segment:{name.short}/")
        woken = {
            n.actor_name: running[n.actor_name] for n in sealed.values() if n.actor_name in running
        }
        victim = next(node for node in nodes if node.node_id in woken.values())
        on_victim = sorted(a for a, node_id in woken.items() if node_id == victim.node_id)
        cluster.remove_node(victim, allow_graceful=False)
        cluster.add_node(num_cpus=1, resources={"topics": 100})
        cluster.wait_for_nodes()

        admin.create_subscription(TOPIC, "after", "earliest")
        after = _read_all(TOPIC, "after", sent)
        moved = _segment_nodes(f"segment:{name.short}/")
        restarted = all(moved.get(a) not in (None, victim.node_id) for a in on_victim)
        print(
            json.dumps(
                {
                    "sent": sent,
                    "sealed": len(sealed),
                    "local_files_of_sealed": local_files,
                    "removed_node_ran": on_victim,
                    "before": len(before) if sorted(before) == expected else -1,
                    "after": len(after) if sorted(after) == expected else -1,
                    "order_violations": _order_violations(before) + _order_violations(after),
                    "restarted_elsewhere": restarted,
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
