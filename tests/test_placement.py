"""Namespace isolation (``RAYTOPICS_PLACEMENT``): the parser, and real placement on a
two-node cluster, where a pinned namespace's actors start, and restart, only on the
node with the resource. The cluster runs in a subprocess (this file as a script),
since this session's tests share another Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from child_output import last_json
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.errors import InvalidArgumentError  # noqa: E402
from runtime.names import TopicName  # noqa: E402
from runtime.placement import actor_resources, parse_placement  # noqa: E402

PINNED = {"iso/pinned": {"pinned_nodes": 0.01}}


def test_exact_namespace_wins_over_tenant_wildcard() -> None:
    placement = parse_placement(json.dumps({"acme/orders": {"a": 0.5}, "acme/*": {"b": 2}}))
    assert actor_resources(TopicName("acme", "orders", "t"), placement) == {"a": 0.5}
    assert actor_resources(TopicName("acme", "billing", "t"), placement) == {"b": 2.0}
    assert actor_resources(TopicName("other", "orders", "t"), placement) is None
    assert actor_resources(None, placement) is None  # the DAG watch, the gateway
    assert parse_placement("") == {} and parse_placement("  ") == {}


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "[1, 2]",
        '{"acme": {"a": 1}}',
        '{"acme/or ders": {"a": 1}}',
        '{"*/orders": {"a": 1}}',
        '{"acme/orders": {}}',
        '{"acme/orders": {"a": 0}}',
        '{"acme/orders": {"a": -1}}',
        '{"acme/orders": {"a": 1.5}}',
        '{"acme/orders": {"a": true}}',
        '{"acme/orders": {"a": "1"}}',
        '{"acme/orders": {"": 1}}',
        '{"acme/orders": 1}',
    ],
)
def test_bad_placement_is_a_clear_error(raw: str) -> None:
    with pytest.raises(InvalidArgumentError, match="RAYTOPICS_PLACEMENT"):
        parse_placement(raw)


def test_connect_refuses_a_bad_placement_before_starting_ray() -> None:
    env = {**os.environ, "RAYTOPICS_PLACEMENT": '{"acme/orders": {"a": 1.5}}'}
    code = "from runtime import connect; connect(); print('connected')"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "connected" not in proc.stdout
    assert "InvalidArgumentError" in proc.stderr and "whole numbers" in proc.stderr


@pytest.mark.integration  # a multi-node cluster of its own
@pytest.mark.timeout(300)
def test_pinned_namespace_starts_and_restarts_on_its_nodes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {"RAYTOPICS_STORAGE_ROOT": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    env["RAYTOPICS_PLACEMENT"] = json.dumps(PINNED)
    proc = subprocess.run(
        [sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    placed = last_json(proc.stdout)
    pinned_node, pinned, restarted = placed["pinned_node"], placed["pinned"], placed["restarted"]
    kinds = {name.split(":")[0] for name in pinned}
    assert kinds == {"controllers", "segment-host", "coordinators"}, pinned
    assert set(pinned.values()) == {pinned_node}, pinned
    assert restarted["node"] == pinned_node and restarted["pid"] != restarted["old_pid"]


def _actors(prefix: str) -> dict[str, dict]:
    import ray._private.state as state

    return {
        a["Name"]: a
        for a in state.actors().values()
        if a["State"] == "ALIVE" and a["Name"].split(":")[-1].startswith(prefix)
    }


def main() -> None:
    """Head (1 CPU) plus one node with the pinned resource; a topic in the pinned
    namespace with a stream consumer; then its controller's process is killed."""
    import ray
    from ray.cluster_utils import Cluster

    from clients import ScalableTopicsAdmin, StreamConsumer
    from runtime import connect

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    node = cluster.add_node(num_cpus=1, resources={"pinned_nodes": 10})
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="placement", log_to_driver=False)
    try:
        admin = ScalableTopicsAdmin()
        topic = "topic://iso/pinned/events"
        admin.create_scalable_topic(topic, 2)
        admin.create_subscription(topic, "sub")
        consumer = StreamConsumer(topic, "sub", "c1")
        pinned = wait_for(lambda: (found := _actors("iso/pinned")) and len(found) == 3 and found)
        controller = pinned["controllers:iso/pinned"]  # the namespace's controller host
        ray.kill(ray.get_actor(controller["Name"], namespace="placement"), no_restart=False)
        restarted = wait_for(
            lambda: (
                (a := _actors("iso/pinned").get(controller["Name"]))
                and a["Pid"] != controller["Pid"]
                and a
            )
        )
        consumer.close()
        print(
            json.dumps(
                {
                    "pinned_node": node.node_id,
                    "pinned": {name: a["Address"]["NodeID"] for name, a in pinned.items()},
                    "restarted": {
                        "node": restarted["Address"]["NodeID"],
                        "pid": restarted["Pid"],
                        "old_pid": controller["Pid"],
                    },
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="raytopics-place-"))
    main()
