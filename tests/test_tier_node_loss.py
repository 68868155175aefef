"""A tiered topic on a three-node cluster whose nodes each keep segments on their own disk
(``RAYTOPICS_STORAGE_SCOPE=node``, a separate storage root per node) loses the node that
held its sealed, offloaded segments: nothing of them is lost and their reads work,
because nothing of them is on any node any more (their records are in the tier, their
state in the metadata store).

The cluster runs in a subprocess (this file as a script), since this session's tests
share another Ray. Each node's raylet gets its own ``RAYTOPICS_NODE_STORAGE_ROOT``. The
topic's history is made while node A is its only node, so every segment is laid out on
A's disk; node B then joins, and a merge and a split move the active segments to B
(children go to a disk that holds none of their parents). A is removed, not gracefully.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from waiting import wait_for

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPIC = "topic://tier/nodes/events"
PLACEMENT = {"tier/nodes": {"topics": 1}}
KEYS = 23
RESULT = "node-loss result: "


@pytest.mark.timeout(540)
def test_a_tiered_segment_outlives_the_node_whose_disk_held_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {
        "RAYTOPICS_STORAGE_ROOT": str(tmp_path / "cluster"),
        "RAYTOPICS_STORAGE_SCOPE": "node",
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
        timeout=520,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # Ray's raylets may print warnings to stdout after the result: take the marked line.
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    result = json.loads(line.removeprefix(RESULT))
    assert len(set(result["disks"].values())) == 3, result  # one disk per node
    # while A was the only node, everything was laid out on its disk, and nowhere else
    assert result["placed_with_a_only"] == ["a"], result
    assert result["segment_dirs_off_a_with_a_only"] == [], result
    # after B joined, the merge's and split's children went to B: A held only sealed ones
    assert result["active_placed"] == ["b"], result
    assert result["sealed"] == 7 and result["sealed_tiered"] == 7, result
    assert result["segment_dirs_on_a_at_removal"] == [], result
    assert result["local_files_of_sealed"] == [], result
    assert result["before"] == result["after"] == result["sent"] == 1500, result
    assert result["order_violations"] == 0
    assert result["woken_restarted_elsewhere"], result
    assert result["recover_refused"], result
    assert result["crashed_active_back_on_b"], result


def _produce(topic: str, count: dict[str, int], n: int) -> None:
    from clients import Producer

    with Producer(topic) as producer:
        for i in range(n):
            key = f"k{i % KEYS}"
            producer.send(f"{key}:{count[key]}".encode(), key=key)
            count[key] += 1


def _order_violations(received: list[tuple[str, int]]) -> int:
    last: dict[str, int] = {}
    bad = 0
    for key, seq in received:
        bad += last.get(key, -1) != seq - 1
        last[key] = seq
    return bad


def _segment_dirs(disk: Path, descriptors: set[str] | None = None) -> list[str]:
    """Segment directories under a node's storage root (those named in ``descriptors``)."""
    found = [p for p in disk.rglob("segment.json")]
    return sorted(
        str(p.parent) for p in found if descriptors is None or p.parent.name in descriptors
    )


def _adjacent(admin, topic: str) -> list:  # noqa: ANN001
    return sorted(
        admin.get_layout(topic).active_segments.values(), key=lambda s: s.hash_range.start
    )


def main(scratch: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from clients import ScalableTopicsAdmin
    from runtime import connect
    from runtime.errors import TopicAlreadyExistsError
    from runtime.names import TopicName
    from storage.catalog import Catalog
    from storage.durability import NODE_STORAGE_ROOT_ENV
    from storage.placements import SegmentPlacements, disk_id
    from tests.segments import NODE_LOSS_SYSTEM_CONFIG, crash_host_of, read_keyed, segment_nodes

    disks = {node: scratch / "disks" / node for node in ("head", "a", "b", "c")}

    def node_args(node: str, topics: bool = True) -> dict:
        resources = {"resources": {"topics": 100}} if topics else {}
        return {"num_cpus": 1, "env_vars": {NODE_STORAGE_ROOT_ENV: str(disks[node])}, **resources}

    head = {**node_args("head", topics=False), "_system_config": NODE_LOSS_SYSTEM_CONFIG}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    node_a = cluster.add_node(**node_args("a"))
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="tiernodes", log_to_driver=False)
    try:
        admin = ScalableTopicsAdmin()
        name = TopicName.parse(TOPIC)
        admin.create_scalable_topic(TOPIC, 2)
        admin.wait_until_ready(TOPIC)  # its segments start in the background: stats wait for none
        uri = f"file://{scratch / 'tier'}/events"
        admin.set_policy(TOPIC, {"tiering": {"uri": uri, "afterS": 0, "idleS": 600}})
        incarnation = admin.get_stats(TOPIC)["incarnation"]
        placements = SegmentPlacements(Catalog().store, name, incarnation)
        count: dict[str, int] = defaultdict(int)
        _produce(TOPIC, count, 300)
        admin.split_segment(TOPIC, 0)
        _produce(TOPIC, count, 300)
        admin.split_segment(TOPIC, 1)
        _produce(TOPIC, count, 300)
        first, second, *_ = _adjacent(admin, TOPIC)
        admin.merge_segments(TOPIC, first.segment_id, second.segment_id)
        _produce(TOPIC, count, 300)

        def all_hibernating(sealed_count: int) -> bool:
            segments = admin.get_stats(TOPIC)["segments"]
            sealed = {i: s for i, s in segments.items() if s["state"] == "SEALED"}
            print("sealed:", {i: (s["tiered"], s["hibernating"], s.get("tierError"))
                              for i, s in sealed.items()}, file=sys.stderr)  # fmt: skip
            return len(sealed) == sealed_count and all(s["hibernating"] for s in sealed.values())

        wait_for(lambda: all_hibernating(4), 180)
        ids = {node: disk_id(disk) for node, disk in disks.items() if node != "c"}
        by_disk = {disk: node for node, disk in ids.items()}
        placed_with_a_only = sorted({by_disk[d] for d in placements.all().values()})
        off_a = [d for node in ("head", "b") for d in _segment_dirs(disks[node])]

        node_b = cluster.add_node(**node_args("b"))
        cluster.wait_for_nodes()
        left, middle, right = _adjacent(admin, TOPIC)
        admin.merge_segments(TOPIC, left.segment_id, middle.segment_id)
        admin.split_segment(TOPIC, right.segment_id)
        _produce(TOPIC, count, 300)
        sent = sum(count.values())
        expected = sorted((key, seq) for key, n in count.items() for seq in range(n))
        wait_for(lambda: all_hibernating(7), 180)
        layout = admin.get_layout(TOPIC)
        active_placed = sorted({by_disk[placements.get(i)] for i in layout.active_segments})
        sealed = {
            i: info.name(name) for i, info in layout.all_segments.items() if not info.is_active
        }
        stats = admin.get_stats(TOPIC)["segments"]
        tiered = [i for i in sealed if stats[str(i)]["tiered"]]
        descriptors = {n.descriptor for n in sealed.values()}
        local_files = [d for disk in disks.values() for d in _segment_dirs(disk, descriptors)]

        admin.create_subscription(TOPIC, "before", "earliest")
        before = read_keyed(TOPIC, "before", sent)  # wakes every sealed segment
        running = segment_nodes(name)
        on_a = sorted(
            n.actor_name for n in sealed.values() if running.get(n.actor_name) == node_a.node_id
        )
        at_removal = _segment_dirs(disks["a"])
        cluster.remove_node(node_a, allow_graceful=False)
        cluster.add_node(**node_args("c"))
        cluster.wait_for_nodes()

        # an active segment's process dies: Ray restarts it on B, the node with its disk
        crashed_segment = layout.active_segments[min(layout.active_segments)].name(name)
        crash_host_of(crashed_segment)
        crashed = crashed_segment.actor_name
        admin.create_subscription(TOPIC, "after", "earliest")
        after = read_keyed(TOPIC, "after", sent)
        moved = segment_nodes(name)
        restarted = all(moved.get(a) not in (None, node_a.node_id) for a in on_a)
        crashed_on_b = moved.get(crashed) == node_b.node_id
        try:
            admin.recover_topic(TOPIC)
            refused = False
        except TopicAlreadyExistsError as err:  # a live topic is never rebuilt over
            refused = "live metadata" in str(err)
        print(
            RESULT
            + json.dumps(
                {
                    "sent": sent,
                    "disks": ids,
                    "placed_with_a_only": placed_with_a_only,
                    "segment_dirs_off_a_with_a_only": off_a,
                    "active_placed": active_placed,
                    "sealed": len(sealed),
                    "sealed_tiered": len(tiered),
                    "segment_dirs_on_a_at_removal": at_removal,
                    "local_files_of_sealed": local_files,
                    "woken_on_a": on_a,
                    "before": len(before) if sorted(before) == expected else -1,
                    "after": len(after) if sorted(after) == expected else -1,
                    "order_violations": _order_violations(before) + _order_violations(after),
                    "woken_restarted_elsewhere": restarted,
                    "recover_refused": refused,
                    "crashed_active_back_on_b": crashed_on_b,
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
