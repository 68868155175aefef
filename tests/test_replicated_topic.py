"""A replicated topic on a cluster of four nodes, each keeping segments on its own disk
(``RAYTOPICS_STORAGE_SCOPE=node``, no shared root), run by its controller alone
(``actors.control.replica_keeper``). The topic is created, written and read with one copy
per segment; then its namespace's default policy asks for three copies with an ack
quorum of two, and within seconds each active segment is a leader and two followers on
three distinct nodes, which copied what the segment held and its cursors, and none is
led from the node its controller runs on (a lead found there is handed over).

Then the node of segment 0's leader is removed, not gracefully, while three keyed
producers keep sending, and then segment 1's leader's process is stopped (SIGSTOP)
until another replica leads, and resumed. Each time the controller elects a follower (it
holds every acknowledged message), clients follow it without an error reaching the
application, the lost replica is replaced on the free node and catches up (every
replica in sync again: what ``under_replicated_segments`` counts), the stale leader
follows; a split afterwards makes replicated children, and a subscription receives every
acknowledged message once, in key order, and none it acknowledged before. A leader whose
files are removed while it runs hands the lead to a replica that kept them and is
rebuilt from it. Last, a fifth node joins, sealed segment 1 is drained and put to sleep
(its followers closed with its leader), and its leader's node is removed while it sleeps:
a new subscription wakes it, another replica leads it at a newer epoch, and the
subscription reads every acknowledged message, the sealed segment's included.

The cluster runs in a subprocess (this file as a script): this session's tests share
another Ray.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a Ray of its own

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPIC = "topic://repl/orders/events"
PLACEMENT = {"repl/*": {"disks": 1}}
RESULT = "replicated topic result: "
NODES = ("a", "b", "c", "d")  # and "e", added for the last phase
KEYS = 12


@pytest.mark.timeout(420)
def test_a_replicated_topic_keeps_every_acknowledged_message_through_a_leader_node_loss(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {
        "RAYTOPICS_STORAGE_ROOT": str(tmp_path / "cluster"),
        "RAYTOPICS_STORAGE_SCOPE": "node",
        "RAYTOPICS_PLACEMENT": json.dumps(PLACEMENT),
        "RAYTOPICS_REPLICA_GRACE_S": "2",
        "RAY_AUTH_MODE": "disabled",
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    result = json.loads(line.removeprefix(RESULT))
    # a factor above the nodes is refused, saying how many there are
    assert result["refused"].startswith("NotEnoughNodesError"), result
    assert "placement allows 4" in result["refused"], result
    # every active segment: three replicas on three nodes, a leader and two followers
    for replicas in result["placed"].values():
        assert len(set(replicas["nodes"])) == 3, result
        assert sorted(replicas["roles"]) == ["follower", "follower", "leader"], result
    assert result["files"] == 6, result  # two segments, three copies each, one per node
    # no segment is led from the controller's node: one node's loss takes one or the other
    for replicas in result["placed"].values():
        leader = replicas["nodes"][replicas["roles"].index("leader")]
        assert leader != result["controller_node"], result
    # the leader's node lost mid-produce: a follower leads a newer epoch, no send failed,
    # and the lost replica was replaced on the free node and caught up
    assert result["failed_sends"] == [], result
    assert result["new_epoch"] > result["old_epoch"], result
    assert result["lost_node"] not in result["after_nodes"], result
    assert len(set(result["after_nodes"])) == 3, result
    assert result["under_replicated_after"] == 0, result
    # a split after the loss: its children are replicated too
    assert all(len(set(nodes)) == 3 for nodes in result["children_nodes"]), result
    # a stale leader, stopped while another replica was elected, then resumed: it follows
    # (nothing it took meanwhile was acknowledged: no send failed, none received twice)
    stale = result["stale"]
    assert stale["new_epoch"] > stale["epoch"] and stale["new_leader"] != stale["leader"], result
    assert (stale["leader"], "follower") in [tuple(r) for r in stale["now"]], result
    # every acknowledged message, once, in key order; what was acknowledged before the
    # failovers is not delivered again (the cursors were replicated)
    assert result["early"] == 100 and result["early_again"] == 0, result
    # a follower's host that crashed is told to follow again, and catches up
    assert result["follower_restarted"], result
    # a leader's files removed while it runs: another leads, and it is rebuilt as a follower
    removed = result["files_removed"]
    new_epoch = removed["leader"]["epoch"][1] > removed["leader"]["epoch"][0]
    assert new_epoch and removed["leader"]["leader"][0] != removed["leader"]["leader"][1], result
    assert removed["received"] == list(range(removed["sent"])), result
    # fewer live replicas than the ack quorum: a typed error naming the segment, within the
    # send time-out (5 s); producing resumes when they are back
    quorum = result["without_quorum"]
    assert quorum["stopped"] == 2 and quorum["resumed"], result
    assert quorum["failure"].startswith("SendTimeoutError"), result
    assert "segment://repl/orders/events/" in quorum["failure"], result
    assert quorum["waited_s"] < 5 + 5, result
    # a sealed segment's leader's node lost: another replica leads it at a newer epoch, and
    # a new subscription reads everything acknowledged, the sealed segment's part included
    sealed = result["sealed"]
    assert sealed["state"] == "SEALED" and sealed["epoch"][1] > sealed["epoch"][0], result
    assert sealed["leader"][0] != sealed["leader"][1] and sealed["missing"] == 0, result
    assert sealed["asleep_followers_open"] == 0, result  # closed with their leader
    assert result["duplicates"] == 0 and result["missing"] == 0, result
    assert result["out_of_order"] == 0, result
    assert result["received"] == result["acknowledged"] > 0, result


def main(scratch: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.exceptions import RayError
    from waiting import wait_for

    from actors.control.controller_host import controller_actor
    from actors.registry import lookup
    from clients import Producer, ScalableTopicsAdmin
    from runtime import connect
    from runtime.config import topic_settings
    from runtime.hashing import key_hash
    from runtime.names import TopicName
    from runtime.segment_hosts import host_name
    from storage.durability import NODE_STORAGE_ROOT_ENV
    from storage.placements import disk_id
    from tests.segments import NODE_LOSS_SYSTEM_CONFIG, read_keyed, segment_actor

    disks = {node: scratch / "disks" / node for node in ("head", *NODES, "e")}

    def node_args(node: str) -> dict:
        resources = {} if node == "head" else {"resources": {"disks": 100}}
        return {"num_cpus": 1, "env_vars": {NODE_STORAGE_ROOT_ENV: str(disks[node])}, **resources}

    head = {**node_args("head"), "_system_config": NODE_LOSS_SYSTEM_CONFIG}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    nodes = {name: cluster.add_node(**node_args(name)) for name in NODES}
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="replicated", log_to_driver=False)
    result: dict = {}
    try:
        admin = ScalableTopicsAdmin()
        try:
            admin.set_namespace_policy("repl/orders", {"replication": {"factor": 5}})
            result["refused"] = "accepted"
        except Exception as err:  # noqa: BLE001 - the refusal is the result
            result["refused"] = f"{type(err).__name__}: {err}"
        # the topic and its first messages come before the policy: one copy each
        admin.create_scalable_topic(TOPIC, 2)
        admin.wait_until_ready(TOPIC)
        admin.create_subscription(TOPIC, "s")
        with Producer(TOPIC) as producer:
            for i in range(100):
                producer.send(f"early-{i % KEYS}:{i}".encode(), key=f"early-{i % KEYS}")
        result["early"] = len(read_keyed(TOPIC, "s", 100, settle_s=0))  # acknowledged, one copy
        admin.set_namespace_policy("repl/orders", {"replication": {"factor": 3, "ackQuorum": 2}})
        node_of_disk = {disk_id(disks[n]): n for n in NODES}
        topic = TopicName.parse(TOPIC)

        def replicas() -> dict[str, dict]:
            """Each active segment's replicas as its controller's last round saw them (what
            stats show; stats wait for every segment, and one whose leader was just lost
            does not answer until a new one leads). None while the controller restarts."""
            try:
                status = controller_actor(topic).autoscale_status.remote()
                return ray.get(status, timeout=10)["replicas"]
            except (RayError, ValueError) as err:
                print("controller:", err, file=sys.stderr, flush=True)
                return {}

        def stats_replicas() -> dict[str, dict]:
            segments = admin.get_stats(TOPIC)["segments"]
            return {i: s.get("replication") for i, s in segments.items() if s["state"] == "ACTIVE"}

        def steady(segment_id: str) -> list[dict]:
            """The segment's replicas once a round saw them all in sync: a round's view
            may lack an answer a moment later (a host slow to answer it), so a test reads
            the view that was in sync, never the next one."""
            found = wait_for(lambda: _in_sync_view(replicas().get(segment_id)), 60, step_s=0.5)
            return found["replicas"]

        def all_in_sync() -> bool:
            """Every active segment's replicas, and every sealed one's that are kept."""
            views = replicas()
            active = {str(i) for i in admin.get_layout(TOPIC).active_segments}
            return active <= set(views) and all(
                v is not None
                and len(v["replicas"]) == 3
                and all(r["inSync"] for r in v["replicas"])
                for v in views.values()
            )

        wait_for(all_in_sync, 90, step_s=0.5)
        # leads move off the controller's node, so that losing a node takes one or the
        # other: segments placed before the policy may have led from there
        host = controller_actor(topic).host
        own = ray.get(host.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))
        controller_node = next((n for n, node in nodes.items() if node.node_id == own), "head")

        def leading_on_controller_node() -> int:
            views = replicas()
            return sum(
                node_of_disk.get(r["replica"]) == controller_node
                for v in views.values() for r in v["replicas"] if r["role"] == "leader"
            ) if all_in_sync() else -1  # fmt: skip

        result["controller_node"] = controller_node
        wait_for(lambda: leading_on_controller_node() == 0, 60, step_s=0.5)
        wait_for(all_in_sync, 90, step_s=0.5)
        placed = {
            i: {"nodes": [node_of_disk[r["replica"]] for r in v["replicas"]],
                "roles": [r["role"] for r in v["replicas"]], "epoch": v["replicas"][0]["epoch"]}
            for i, v in replicas().items()
        }  # fmt: skip
        result["placed"] = placed
        result["files"] = sum(len(list(d.rglob("segment.json"))) for d in disks.values())

        # three keyed producers; the leader of segment 0 goes mid-produce
        acknowledged: dict[str, list[int]] = defaultdict(list)
        failed: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()

        def produce(p: int) -> None:
            with Producer(TOPIC) as producer:
                sequence = 0
                while not stop.is_set():
                    futures = []
                    for _ in range(20):
                        key = f"k{p}-{sequence % KEYS}"
                        value = f"{key}:{sequence}".encode()
                        futures.append((key, sequence, producer.send(value, key=key)))
                        sequence += 1
                    for key, seq, future in futures:
                        try:
                            future.result(timeout=90)
                            with lock:
                                acknowledged[key].append(seq)
                        except Exception as err:  # noqa: BLE001 - counted, then asserted
                            failed.append(f"{type(err).__name__}: {err}")
                    time.sleep(0.2)

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        leader = placed["0"]["nodes"][placed["0"]["roles"].index("leader")]
        result["lost_node"], result["old_epoch"] = leader, placed["0"]["epoch"]
        cluster.remove_node(nodes[leader], allow_graceful=False)

        def failed_over() -> dict | None:
            view = replicas().get("0")
            if view is None or len(view["replicas"]) != 3:
                return None
            leading = view["replicas"][0]
            newer = leading["role"] == "leader" and leading["epoch"] > result["old_epoch"]
            return view if newer and all(r["inSync"] for r in view["replicas"]) else None

        view = wait_for(failed_over, 120, step_s=0.5)
        result["new_epoch"] = view["replicas"][0]["epoch"]
        result["after_nodes"] = [node_of_disk[r["replica"]] for r in view["replicas"]]
        time.sleep(1)  # producing goes on with the new leader

        # a stale leader: segment 1's leader's process stopped until another replica leads
        # a newer epoch, then resumed
        before = steady("1")[0]
        one = admin.get_layout(TOPIC).active_segments[1].name(topic)
        pid = ray.get(segment_actor(one).ready.remote())["pid"]
        os.kill(pid, signal.SIGSTOP)

        def took_over() -> dict | None:
            view = replicas().get("1")
            leading = view["replicas"][0] if view else None
            newer = leading and leading["role"] == "leader" and leading["epoch"] > before["epoch"]
            return leading if newer else None

        try:
            after = wait_for(took_over, 120, step_s=0.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(all_in_sync, 90, step_s=0.5)
        time.sleep(1)
        result["stale"] = {
            "leader": before["replica"], "epoch": before["epoch"],
            "new_leader": after["replica"], "new_epoch": after["epoch"],
            "now": [(r["replica"], r["role"]) for r in replicas()["1"]["replicas"]],
        }  # fmt: skip
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        result["failed_sends"] = failed[:5]
        result["under_replicated_after"] = sum(
            not all(r["inSync"] for r in v["replicas"]) for v in replicas().values()
        )

        admin.split_segment(TOPIC, 1)
        wait_for(all_in_sync, 90, step_s=0.5)
        result["children_nodes"] = [
            [node_of_disk[r["replica"]] for r in v["replicas"]] for v in stats_replicas().values()
        ]

        expected = sum(len(seqs) for seqs in acknowledged.values())
        received = read_keyed(TOPIC, "s", expected)
        per_key: dict[str, list[int]] = defaultdict(list)
        for key, seq in received:
            per_key[key].append(seq)
        result["acknowledged"], result["received"] = expected, len(received)
        result["duplicates"] = len(received) - len(set(received))
        result["missing"] = sum(
            len(set(seqs) - set(per_key[key])) for key, seqs in acknowledged.items()
        )
        result["out_of_order"] = sum(seqs != sorted(seqs) for seqs in per_key.values())
        result["early_again"] = sum(key.startswith("early") for key, _ in received)

        # a follower's host crashes: Ray restarts it, it opens its replicas again without a
        # role, and the controller tells them to follow again; they catch up
        follower = steady("0")[1]
        zero = admin.get_layout(TOPIC).active_segments[0].name(topic)
        crashed = lookup(host_name(zero, follower["node"], 1, topic_settings()))
        ray.kill(crashed, no_restart=False)
        wait_for(lambda: replicas()["0"]["replicas"][1]["role"] != "follower", 30, step_s=0.2)
        wait_for(all_in_sync, 60, step_s=0.5)
        result["follower_restarted"] = follower["replica"]

        # the leader's files removed while it runs: found out, the lead goes to a replica
        # that kept them, and the old leader, a follower now, is rebuilt from the new one
        def segment_files(replica: dict) -> Path:
            (found,) = [
                path.parent
                for path in disks[node_of_disk[replica["replica"]]].rglob("segment.json")
                if path.parent.name == zero.descriptor
            ]
            return found

        def rebuilt(replica: dict, directory: Path) -> bool:
            """Laid out again in place (not replaced elsewhere), and in sync."""
            kept = [r["replica"] for r in replicas()["0"]["replicas"]]
            back = (directory / "segment.json").exists() and replica["replica"] in kept
            return back and all_in_sync()

        assert zero.descriptor.startswith("0000-7fff-"), zero
        keys = [k for k in (f"files-{j}" for j in range(64)) if key_hash(k) <= 0x7FFF][:4]
        removed: dict = {"sent": 0}
        for role in ("leader",):
            view = {"replicas": steady("0")}
            (victim,) = [r for r in view["replicas"] if r["role"] == role][:1]
            directory = segment_files(victim)
            with Producer(TOPIC) as producer:

                def send(i: int, producer: Producer = producer) -> Future:
                    key = keys[i % 4]
                    return producer.send(f"{key}:{removed['sent'] + i}".encode(), key=key)

                sends = [send(i) for i in range(20)]
                shutil.rmtree(directory)
                sends += [send(i) for i in range(20, 40)]
                for future in sends:
                    future.result(timeout=60)
            removed["sent"] += 40
            wait_for(lambda victim=victim, d=directory: rebuilt(victim, d), 60, step_s=0.5)
            now = steady("0")
            leader_was = view["replicas"][0]
            removed[role] = {"epoch": (leader_was["epoch"], now[0]["epoch"]),
                             "leader": (leader_was["replica"], now[0]["replica"])}  # fmt: skip
        got = read_keyed(TOPIC, "s", removed["sent"], settle_s=1)
        removed["received"] = sorted(seq for key, seq in got if key.startswith("files"))
        result["files_removed"] = removed

        # fewer live replicas than the ack quorum: the hosts of two of the three nodes stop
        result["without_quorum"] = _without_quorum(Producer, replicas)

        # a sealed, drained segment put to sleep, its followers closed with its leader;
        # its leader's node lost while it sleeps (with a fresh node to restore the factor
        # on): a new subscription wakes it, another replica leads it, and the subscription
        # reads its backlog whole
        nodes["e"] = cluster.add_node(**node_args("e"))
        node_of_disk[disk_id(disks["e"])] = "e"
        view = steady("1")
        sealed_before = view[0]
        one = admin.get_layout(TOPIC).all_segments[1].name(topic)
        admin.set_policy(TOPIC, {"hibernation": {"idleS": 1}})
        wait_for(lambda: admin.get_stats(TOPIC)["segments"]["1"]["hibernating"], 60, step_s=0.5)
        admin.set_policy(TOPIC, {})  # once woken, it stays up
        asleep_followers_open = sum(_serves(n, one) for n in (r["node"] for r in view[1:]))
        lost = nodes[node_of_disk[sealed_before["replica"]]]
        cluster.remove_node(lost, allow_graceful=False)
        wait_for(lambda: not _alive(lost.node_id), 60, step_s=0.5)

        def sealed_failed_over() -> dict | None:
            view = replicas().get("1")
            newer = _in_sync(view) and view["replicas"][0]["epoch"] > sealed_before["epoch"]
            return view if newer else None

        admin.create_subscription(TOPIC, "again")  # wakes it
        again = set(read_keyed(TOPIC, "again", expected + removed["sent"] + 100, settle_s=1))
        sealed_after = wait_for(sealed_failed_over, 120, step_s=0.5)
        phase_one = {(key, seq) for key, seqs in acknowledged.items() for seq in seqs}
        result["sealed"] = {
            "epoch": (sealed_before["epoch"], sealed_after["replicas"][0]["epoch"]),
            "leader": (sealed_before["replica"], sealed_after["replicas"][0]["replica"]),
            "state": admin.get_layout(TOPIC).all_segments[1].state.value,
            "missing": len(phase_one - again),
            "asleep_followers_open": asleep_followers_open,
        }  # fmt: skip
        print(RESULT + json.dumps(result), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _without_quorum(producer_class, replicas) -> dict:  # noqa: ANN001
    """Stop the segment hosts of two nodes (every segment's replicas are on the three nodes
    left): a send fails within its time-out with a typed error naming its segment; once
    they resume, sending works again."""
    import ray._private.state as state

    # GCS's actor table: the state API would need the dashboard, which may not be up yet.
    hosts = [
        a
        for a in state.actors().values()
        if a["ActorClassName"] == "SegmentHost" and a["State"] == "ALIVE"
    ]
    pids = [h["Pid"] for h in sorted(hosts, key=lambda h: h["Address"]["NodeID"])][:2]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        with producer_class(TOPIC, send_timeout_s=5) as producer:
            started = time.monotonic()
            try:
                producer.send(b"late:0", key="late").result(timeout=60)
                failure = "acknowledged"
            except Exception as err:  # noqa: BLE001 - the failure is the result
                failure = f"{type(err).__name__}: {err}"
            waited = time.monotonic() - started
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    with producer_class(TOPIC) as producer:
        resumed = producer.send(b"late:1", key="late").result(timeout=60) is not None
    return {"failure": failure, "waited_s": waited, "resumed": resumed, "stopped": len(pids)}


def _alive(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def _serves(node: str, segment) -> bool:  # noqa: ANN001 - a SegmentName
    """Whether the segment host of ``node`` has ``segment`` open."""
    import ray

    from actors.registry import lookup
    from runtime.config import topic_settings
    from runtime.segment_hosts import host_name

    host = lookup(host_name(segment, node, 1, topic_settings()))
    return ray.get(host.stats_of.remote([str(segment)]), timeout=30)[str(segment)] is not None


def _in_sync(view: dict | None) -> bool:
    return (
        view is not None
        and len(view["replicas"]) == 3
        and all(replica["inSync"] for replica in view["replicas"])
    )


def _in_sync_view(view: dict | None) -> dict | None:
    return view if _in_sync(view) else None


if __name__ == "__main__":
    main(Path(sys.argv[1]))
