"""Finding and starting the system's named, detached actors, all in one namespace."""

from __future__ import annotations

import inspect
from typing import Any

import ray
from ray._private import state as ray_state
from ray.core.generated import gcs_pb2
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.config import actor_settings, ray_namespace
from runtime.names import TopicName
from runtime.placement import actor_resources, placement_from_env

# The admin service's name (``actors.admin.service``): below it, a segment finds it by
# name (``actors.segment.txn_joins``) rather than import it.
ADMIN_SERVICE = "admin"


def lookup(name: str) -> ray.actor.ActorHandle:
    """The running actor called ``name``; ``ValueError`` if there is none."""
    return ray.get_actor(name, namespace=ray_namespace())


def get_or_start(
    actor_class: Any,
    name: str,
    *args: Any,
    topic: TopicName | None = None,
    memory: int | None = None,
    settings: dict[str, str] | None = None,
    node: str | None = None,
) -> ray.actor.ActorHandle:
    """The actor called ``name``, started detached with ``args`` if it is not running.

    Detached, so it outlives the driver that started it; Ray restarts it on
    failure per its class options (with the same arguments, this process's
    settings among them), on a node that has the resources the placement of
    ``topic``'s namespace (``runtime.placement``) asks for, and the ``memory``
    (bytes) it declares, so Ray's scheduler counts it against the node's.
    ``settings`` replace this process's (``runtime.config.actor_settings``). ``node``:
    that Ray node only, restarts included (hard node affinity).
    """
    resources = actor_resources(topic, placement_from_env())
    return actor_class.options(
        name=name,
        namespace=ray_namespace(),
        lifetime="detached",
        get_if_exists=True,
        **({"resources": resources} if resources else {}),
        **({"memory": memory} if memory else {}),
        **({"scheduling_strategy": on_node(node)} if node else {}),
    ).remote(*args, settings=actor_settings() if settings is None else settings)


def public_coroutines(cls: type, *excluded: str) -> frozenset[str]:
    """The names of ``cls``'s public coroutine methods (its mixins' included) but
    ``excluded``: what a host actor (of segments, of coordinators) lets its callers reach
    through its ``call``."""
    return frozenset(
        name
        for name, _ in inspect.getmembers(cls, inspect.iscoroutinefunction)
        if not name.startswith("_") and name not in excluded
    )


def named_actors(prefix: str) -> list[str]:
    """Names of the running actors of our namespace that start with ``prefix``."""
    namespace = ray_namespace()
    return sorted(
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == namespace and entry["name"].startswith(prefix)
    )


def alive_actor_names(prefix: str) -> set[str]:
    """Names of our namespace's actors starting with ``prefix`` whose process is up and
    constructed (Ray's ``ALIVE``): an actor that is registered but still waiting for a
    node, booting, or restarting is not among them. One read of Ray's actor table."""
    return {name for name, state in _actor_table(prefix, "ALIVE") if state == _ALIVE}


def gone_for_good(name: str) -> bool:
    """Whether Ray's actor table has our actor ``name`` dead and none of that name alive,
    starting or restarting: killed without restart, or out of restarts. A name that was
    never registered yet is not gone (its actor may be about to start)."""
    states = {state for found, state in _actor_table(name, None) if found == name}
    return bool(states) and states <= {_DEAD}


_ALIVE = gcs_pb2.ActorTableData.ActorState.Value("ALIVE")
_DEAD = gcs_pb2.ActorTableData.ActorState.Value("DEAD")


def _actor_table(prefix: str, state: str | None) -> list[tuple[str, int]]:
    """(name, state) of our namespace's actors whose name starts with ``prefix``."""
    namespace = ray_namespace()
    accessor = ray_state.state._connect_and_get_accessor()
    return [
        (entry.name, entry.state)
        for entry in map(gcs_pb2.ActorTableData.FromString, accessor.get_actor_table(None, state))
        if entry.ray_namespace == namespace and entry.name.startswith(prefix)
    ]


def on_node(node: str) -> NodeAffinitySchedulingStrategy:
    """Run there or not at all: a segment's files are on that node's disk only."""
    return NodeAffinitySchedulingStrategy(node_id=node, soft=False)


def on_each_node(
    nodes: list[str], task: Any, *args: Any, wait_s: float
) -> tuple[dict[str, Any], dict[str, str]]:
    """``task(*args)`` run on each of ``nodes`` (hard affinity): each node's answer, and
    why each other node gave none within ``wait_s`` (an error, or no answer). A node's
    disk is seen only from that node, so a caller must say which nodes it did not see,
    never leave them out silently. Blocking."""
    asked = {task.options(scheduling_strategy=on_node(node)).remote(*args): node
             for node in nodes}  # fmt: skip
    ready, waiting = ray.wait(list(asked), num_returns=len(asked), timeout=wait_s)
    answers: dict[str, Any] = {}
    missing = {asked[ref]: f"no answer within {wait_s:.0f} s" for ref in waiting}
    for ref in ready:
        try:
            answers[asked[ref]] = ray.get(ref)
        except RayError as err:
            missing[asked[ref]] = f"{type(err).__name__}: {err}"
    return answers, missing


def live_nodes() -> list[str]:
    """Every live node's id, sorted."""
    return sorted(node["NodeID"] for node in ray.nodes() if node.get("Alive"))
