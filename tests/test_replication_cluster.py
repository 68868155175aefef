"""A segment's three replicas in segment hosts on three nodes, each node with a disk of its
own (``RAYTOPICS_STORAGE_SCOPE=node``, no shared root): the leader on node A streams to
followers on B and C over the network, an append is acknowledged once two of them hold it,
a follower's host that crashes comes back from its replica entry and catches up, and with
both followers gone an append fails naming the segment while nothing is acknowledged.

What the controller will do (choose the nodes, tell the roles, elect) is done by hand
here; the hosts, the directory, the data plane and the disks are the real ones. The
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
    # both followers gone: the append is stored on A only, refused, and never read
    assert result["without_quorum"].startswith("NotEnoughReplicasError"), result
    assert str(SEGMENT) in result["without_quorum"], result
    assert result["leader_end_without_quorum"] == 62, result
    assert result["readable_without_quorum"] == 60, result


def main(scratch: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from actors.segment.host import start_segment_actor
    from clients._data_plane import SegmentChannel
    from runtime import connect
    from runtime.batch import make_batch, serialize_batch
    from runtime.errors import NotEnoughReplicasError
    from runtime.names import SegmentName
    from storage.durability import NODE_STORAGE_ROOT_ENV, Durability
    from storage.topic_storage import new_incarnation

    disks = {node: scratch / "disks" / node for node in ("head", "a", "b", "c")}

    def node_args(node: str) -> dict:
        return {"num_cpus": 1, "env_vars": {NODE_STORAGE_ROOT_ENV: str(disks[node])}}

    cluster = Cluster(initialize_head=True, head_node_args=node_args("head"))
    nodes = {name: cluster.add_node(**node_args(name)).node_id for name in ("a", "b", "c")}
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

        async def produce(first: int, count: int) -> list[list[int]]:
            channel = SegmentChannel(handles["a"])
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

        for node in ("b", "c"):
            ray.kill(handles[node].host, no_restart=True)
            _dead(lambda node=node: ray.get(handles[node].replica_status.remote()))
        try:
            asyncio.run(produce(30, 1))
            without = "acknowledged"
        except NotEnoughReplicasError as err:
            without = f"{type(err).__name__}: {err}"
        leader_end = ray.get(handles["a"].replica_status.remote())["endOffset"]
        readable = ray.get(handles["a"].position.remote())["endOffset"]
        print(RESULT + json.dumps({
            "answers": answers, "ends": found_ends, "roles": roles,
            "segment_dirs": segment_dirs, "b_after_restart": b_after,
            "ends_after_restart": ends_after, "without_quorum": without,
            "leader_end_without_quorum": leader_end, "readable_without_quorum": readable,
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
