"""Namespace isolation: which Ray nodes may hold a tenant's or a namespace's actors.

Pulsar's namespace isolation policies in Ray terms. An operator gives some nodes
a custom resource (``ray start --resources='{"orders_nodes": 100}'``) and maps
namespaces to it in ``RAYTOPICS_PLACEMENT``, a JSON object such as
``{"acme/orders": {"orders_nodes": 0.01}, "acme/*": {"acme_nodes": 0.01}}``.
Every controller, segment and subscription coordinator of a matching topic then
asks Ray for that resource, so Ray starts it, and restarts it after a fault,
only on those nodes. An exact ``tenant/namespace`` entry wins over ``tenant/*``.
Actors of other topics, and the shared DAG watch and gateway, go anywhere.
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache

from runtime.errors import InvalidArgumentError
from runtime.names import TopicName, is_valid_part

PLACEMENT_ENV = "RAYTOPICS_PLACEMENT"
Placement = dict[str, dict[str, float]]
_EXAMPLE = '{"acme/orders": {"orders_nodes": 0.01}}'


@lru_cache(maxsize=8)
def parse_placement(raw: str) -> Placement:
    """``RAYTOPICS_PLACEMENT``'s value, checked whole: a bad entry is an error, not ignored."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise InvalidArgumentError(
            f"{PLACEMENT_ENV} is not JSON ({err}); e.g. {_EXAMPLE}"
        ) from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{PLACEMENT_ENV} must be a JSON object, e.g. {_EXAMPLE}")
    return {_checked_key(key): _checked_resources(key, res) for key, res in value.items()}


def _checked_key(key: str) -> str:
    tenant, slash, namespace = key.partition("/")
    if not (slash and is_valid_part(tenant) and (namespace == "*" or is_valid_part(namespace))):
        raise InvalidArgumentError(
            f"{PLACEMENT_ENV}: key {key!r} must be 'tenant/namespace' or 'tenant/*'"
        )
    return key


def _checked_resources(key: str, resources: object) -> dict[str, float]:
    def amount_ok(amount: object) -> bool:
        number = isinstance(amount, int | float) and not isinstance(amount, bool)
        # Ray takes fractions of one unit or whole numbers of units
        return number and amount > 0 and math.isfinite(amount) and (amount <= 1 or amount % 1 == 0)

    if (
        not isinstance(resources, dict)
        or not resources
        or not all(isinstance(name, str) and name and amount_ok(n) for name, n in resources.items())
    ):
        raise InvalidArgumentError(
            f"{PLACEMENT_ENV}[{key!r}] must map Ray custom resource names to amounts in "
            f'(0, 1] or whole numbers, e.g. {{"orders_nodes": 0.01}}; got {resources!r}'
        )
    return {name: float(amount) for name, amount in resources.items()}


def actor_resources(topic: TopicName | None, placement: Placement) -> dict[str, float] | None:
    """The custom resources an actor of ``topic`` must ask for, if any (``None``: an
    actor of no topic, such as the DAG watch)."""
    if topic is None:
        return None
    return namespace_resources(topic.namespace_path, placement)


def namespace_resources(namespace_path: str, placement: Placement) -> dict[str, float] | None:
    """The custom resources the actors of namespace ``tenant/namespace`` ask for, if any."""
    tenant = namespace_path.split("/", 1)[0]
    return placement.get(namespace_path) or placement.get(f"{tenant}/*")


def placement_from_env() -> Placement:
    return parse_placement(os.environ.get(PLACEMENT_ENV, ""))


def choose_disk(load: dict[str, int], avoid: set[str] | frozenset[str] = frozenset()) -> str:
    """The node disk a new segment is laid out on when every node keeps its own (storage
    scope ``node``). ``load``: each live candidate disk → how many of the topic's local
    segments it holds. A disk holding none of the segment's parents (``avoid``) comes
    first, so a split moves load off the node that grew hot, then the least loaded; ties
    go to the first in ``load``'s order, so the choice is repeatable."""
    if not load:
        raise InvalidArgumentError("no node disk to lay a segment out on")
    candidates = [disk for disk in load if disk not in avoid] or list(load)
    return min(candidates, key=lambda disk: load[disk])


def choose_disks(
    load: dict[str, int], count: int, avoid: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """The node disks of a replicated segment's ``count`` replicas, each on a node of its
    own, the leader's first: chosen one after another as ``choose_disk`` chooses, each
    taking one more segment before the next is chosen, so replicas spread. Refused
    (``runtime.replication.Replication.check_nodes`` says it first, at the policy) when
    fewer disks than replicas are live."""
    if count > len(load):
        raise InvalidArgumentError(
            f"{count} replicas need {count} node disks, one each; {len(load)} are live"
        )
    left, chosen = dict(load), []
    for _ in range(count):
        disk = choose_disk(left, avoid)
        chosen.append(disk)
        del left[disk]
    return chosen
