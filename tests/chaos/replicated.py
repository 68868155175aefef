"""The chaos harness with replicated segments (``--replicated``): every worker keeps
segments on a disk of its own (``RAYTOPICS_STORAGE_SCOPE=node``, no shared root), the
topic's namespace asks for three replicas with an ack quorum of two, three keyed
producers write, and the faults are mostly the loss of the node whose segment host leads
a segment (``segment_node``: clients are sent to the leader, so that is whose node goes),
beside the controller's node, splits and merges, and the queue consumer's crash. A node
added in place of a removed one comes with a fresh disk. Nodes go one at a time, as the
guarantee of factor 3 with ack quorum 2 has it: a node is removed only once every
replica lost with the one before is replaced and in sync (``Faults._replicas_restored``).

The invariants are the harness's: every acknowledged message delivered once per stream
subscription in key order, at least once to the queue subscription. The suite runs
seeds 6 and 13 (``tests/chaos/test_chaos.py``); by hand:
``python -m tests.chaos.harness --replicated --seeds 6,13``.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from storage.durability import NODE_STORAGE_ROOT_ENV
from tests.chaos.workload import Shape

FAULTS = ("segment_node", "segment_node", "segment_node", "controller_node", "split", "merge",
          "consumer")  # fmt: skip
POLICY = {"replication": {"factor": 3, "ackQuorum": 2}}
PRODUCERS = 3
NODES = 4  # three replicas and a free node to replace a lost one on
DISK = "disks"  # the resource of the nodes that keep segments (the head keeps none)


def replicated_shape(root: Path) -> Shape:
    """Set this process's environment for replication (the nodes it starts inherit it)
    and give the shape of a replicated run, its disks under ``root``."""
    os.environ["RAYTOPICS_STORAGE_SCOPE"] = "node"
    os.environ["RAYTOPICS_PLACEMENT"] = json.dumps({"chaos/*": {DISK: 1}})
    os.environ.setdefault("RAYTOPICS_REPLICA_GRACE_S", "2")
    numbers = itertools.count()

    def node_args() -> dict[str, Any]:
        disk = root / f"node{next(numbers)}"
        return {"num_cpus": 1, "resources": {DISK: 100},
                "env_vars": {NODE_STORAGE_ROOT_ENV: str(disk)}}  # fmt: skip

    return Shape(node_args=node_args, policy=POLICY, producers=PRODUCERS)
