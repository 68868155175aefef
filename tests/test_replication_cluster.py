"""A segment's three replicas in segment hosts on three nodes, each node with a disk of its
own (``RAYTOPICS_STORAGE_SCOPE=node``, no shared root): the leader on node A streams to
followers on B and C over the network, an append is acknowledged once two of them hold it,
a follower's host that crashes comes back from its replica entry and catches up; the
leader's node is lost and an election (``actors.control.replica_election``) makes a
follower the leader that clients then reach, holding every acknowledged message; and with
no follower left an append fails naming the segment while nothing is acknowledged.

What the controller will do (choose the nodes, tell the roles, decide to elect) is done
by hand here; the hosts, the directory, the data plane and the disks are the real ones. The
cluster runs in a subprocess (this file as a script): this session's tests share another
Ray.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a Ray of its own

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = "replication result: "
NODES = ("a", "b", "c")
SEGMENT = "segment://repl/cluster/orders/0000-ffff-0"


@pytest.mark.timeout(300)
def test_replicas_on_three_nodes_each_with_its_own_disk(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {
        "RAYTOPICS_STORAGE_ROOT": str(tmp_path / "cluster"),
        "RAYTOPICS_STORAGE_SCOPE": "node",
        "RAY_AUTH_MODE": "disabled",
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    result = json.loads(line.removeprefix(RESULT))
    assert result["answers"] == [[2 * i, 2] for i in range(20)], result
    # every replica's own disk holds the same log; no other disk holds any of it
    assert result["ends"] == {"a": 40, "b": 40, "c": 40}, result
    assert result["segment_dirs"] == {"a": 1, "b": 1, "c": 1, "head": 0}, result
    assert result["roles"] == ["leader", "follower", "follower"], result
    # B's host crashed: Ray restarted it, it reopened the replica from its entry with no
    # role, was told to follow again, and caught up with what came meanwhile
    assert result["b_after_restart"] == "none", result
    assert result["ends_after_restart"] == {"a": 60, "b": 60, "c": 60}, result
    # A lost: B or C elected at epoch 2, clients reach it through the directory, and it
    # holds every acknowledged message, in order, with what came after
    epoch, leader = result["elected"]
    assert epoch == 2 and leader in ("b", "c"), result
    assert result["after_failover"] == [[60 + 2 * i, 2] for i in range(10)], result
    assert result["values_after_failover"] == [f"m{i}" for i in range(40) for _ in (0, 1)]
    assert result["roles_after_failover"] == [["leader", 2], ["follower", 2]], result
    assert result["cursor_after_failover"] == 30, result  # acknowledged before, kept
    # the other follower gone too: the append is stored on the leader only, refused
    # naming the segment, and never read
    assert result["without_quorum"].startswith("NotEnoughReplicasError"), result
    assert str(SEGMENT) in result["without_quorum"], result
    assert result["leader_end_without_quorum"] == 82, result
    assert result["readable_without_quorum"] == 80, result


def main(scratch: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from waiting import wait_for

    from actors.control.replica_election import HostReplicaCalls, elect
    from actors.segment.host import start_segment_actor
    from actors.segment.lookup import segment_actor
    from clients._data_plane import SegmentChannel
    from runtime import connect
    from runtime.batch import make_batch, serialize_batch
    from runtime.errors import NotEnoughReplicasError
    from runtime.names import SegmentName
    from runtime.replication import Replication
    from storage.catalog import Catalog
    from storage.durability import NODE_STORAGE_ROOT_ENV, Durability
    from storage.placements import disk_id
    from storage.replica_sets import ReplicaSet, ReplicaSets
    from storage.topic_storage import new_incarnation

    disks = {node: scratch / "disks" / node for node in ("head", "a", "b", "c")}

    def node_args(node: str) -> dict:
        return {"num_cpus": 1, "env_vars": {NODE_STORAGE_ROOT_ENV: str(disks[node])}}

    cluster = Cluster(initialize_head=True, head_node_args=node_args("head"))
    node_objects = {name: cluster.add_node(**node_args(name)) for name in NODES}
    nodes = {name: node.node_id for name, node in node_objects.items()}
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="replication", log_to_driver=False)
    try:
        name, incarnation = SegmentName.parse(SEGMENT), new_incarnation()
        durability = Durability("fsync")

        def replica(node: str, follower: bool = True):  # noqa: ANN202
            return start_segment_actor(
                name, durability=durability, initialize=True, incarnation=incarnation,
                node=nodes[node], replica=follower,
            )  # fmt: skip

        handles = {"a": replica("a", follower=False), "b": replica("b"), "c": replica("c")}
        ray.get(handles["a"].lead.remote(1, 3, 2, 3.0))
        endpoint = ray.get(handles["a"].data_endpoint.remote())
        for node in ("b", "c"):
            ray.get(handles[node].follow.remote(1, endpoint))

        leading = {"handle": handles["a"]}

        async def produce(first: int, count: int) -> list[list[int]]:
            channel = SegmentChannel(leading["handle"])
            answers = []
            for sequence in range(first, first + count):
                payload = serialize_batch(make_batch([f"m{sequence}".encode()] * 2))
                answers.append(list(await channel.append("p", sequence, payload)))
            await channel.close()
            return answers

        def ends() -> dict[str, int]:
            statuses = {n: ray.get(h.replica_status.remote()) for n, h in handles.items()}
            return {n: status["endOffset"] for n, status in statuses.items()}

        def caught_up(end: int) -> dict[str, int]:
            deadline = time.monotonic() + 30
            while (found := ends()) != {n: end for n in handles} and time.monotonic() < deadline:
                time.sleep(0.1)
            return found

        answers = asyncio.run(produce(0, 20))
        found_ends = caught_up(40)
        roles = [ray.get(handles[n].replica_status.remote())["role"] for n in ("a", "b", "c")]
        segment_dirs = {n: len(list(d.rglob("segment.json"))) for n, d in disks.items()}

        ray.kill(handles["b"].host, no_restart=False)  # a crash: Ray restarts the host
        asyncio.run(produce(20, 10))
        b_after = _retry(lambda: ray.get(handles["b"].replica_status.remote()))["role"]
        ray.get(handles["b"].follow.remote(1, endpoint))
        ends_after = caught_up(60)

        # A subscription acknowledged on the leader: its cursor rides to the followers
        ray.get(handles["a"].create_subscription.remote("s"))
        ray.get(handles["a"].ack_cumulative.remote("s", 29))

        def cursors_held() -> bool:
            versions = {
                ray.get(h.replica_status.remote())["cursorVersion"] for h in handles.values()
            }
            return len(versions) == 1

        wait_for(cursors_held, 30)

        # Node A, the leader's, is lost: an election among B and C, recorded first
        disk = {n: disk_id(disks[n]) for n in NODES}
        records = ReplicaSets(Catalog().store, name.topic, incarnation)
        records.create(name.segment_id, ReplicaSet(1, (disk["a"], disk["b"], disk["c"])))
        cluster.remove_node(node_objects["a"])
        live = {disk["b"]: nodes["b"], disk["c"]: nodes["c"]}
        calls = HostReplicaCalls(name, live.get, None)
        elected = asyncio.run(elect(records, name.segment_id, (disk["b"], disk["c"]),
                                    Replication.of(3, 2), calls))  # fmt: skip
        leader = next(n for n in ("b", "c") if disk[n] == elected.leader)
        other = "c" if leader == "b" else "b"
        new_leader = leading["handle"] = segment_actor(name)  # as clients look it up
        assert new_leader.host == handles[leader].host
        after_failover = asyncio.run(produce(30, 10))
        values = ray.get(new_leader.read.remote(0, 1000)).column("value").to_pylist()
        cursor = ray.get(new_leader.position.remote("s"))["position"]
        statuses = [ray.get(handles[n].replica_status.remote()) for n in (leader, other)]

        ray.kill(handles[other].host, no_restart=True)
        _dead(lambda: ray.get(handles[other].replica_status.remote()))
        try:
            asyncio.run(produce(40, 1))
            without = "acknowledged"
        except NotEnoughReplicasError as err:
            without = f"{type(err).__name__}: {err}"
        leader_end = ray.get(new_leader.replica_status.remote())["endOffset"]
        readable = ray.get(new_leader.position.remote())["endOffset"]
        print(RESULT + json.dumps({
            "answers": answers, "ends": found_ends, "roles": roles,
            "segment_dirs": segment_dirs, "b_after_restart": b_after,
            "ends_after_restart": ends_after, "without_quorum": without,
            "leader_end_without_quorum": leader_end, "readable_without_quorum": readable,
            "elected": [elected.epoch, leader], "after_failover": after_failover,
            "values_after_failover": [v.decode() for v in values],
            "roles_after_failover": [(st["role"], st["epoch"]) for st in statuses],
            "cursor_after_failover": cursor,
        }), flush=True)  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()


def _retry(call):  # noqa: ANN001, ANN202
    """A call to a host that is restarting: Ray retries it once the host is back."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return call()
        except Exception:  # noqa: BLE001 - the host is not back yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _dead(call) -> None:  # noqa: ANN001
    """Wait until ``call`` fails: a kill takes effect after ``ray.kill`` returns."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            call()
        except Exception:  # noqa: BLE001 - the process is gone
            return
        time.sleep(0.1)
    raise AssertionError("the process was not killed")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
