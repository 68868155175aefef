"""Where each kind of metadata lives in the store: the one module that spells its paths,
so no caller builds ``f"{...}/subscriptions"`` by hand. Where a scalable topic's
metadata lives is a public layout:

==================================================================  =======================
path                                                                record
==================================================================  =======================
``/topics/{tenant}/{namespace}/{topic}``                            ``TopicRecord``
``/topics/{t}/{ns}/{topic}/controller``                             ``LeaderRecord``
``/topics/{t}/{ns}/{topic}/subscriptions/{sub}``                    ``SubscriptionMetadata``
``/topics/{t}/{ns}/{topic}/subscriptions/{sub}/consumers/{name}``   ``ConsumerRegistration``
``/topics/{t}/{ns}/{topic}/tiered/{incarnation}/{segmentId}``       ``TieredRecord``
``/topics/{t}/{ns}/{topic}/placed/{incarnation}/{segmentId}``       the node disk holding it
``/topics/{t}/{ns}/{topic}/asleep/{incarnation}/{segmentId}``       a sleeping segment's stats
``/topics/{t}/{ns}/{topic}/sinks/{query}/{partition}/{chunk}``      ``SinkWrite``
``/limits/{tenant}/{namespace}``                                    limit overrides (object)
``/policies/{tenant}/{namespace}``                                  default ``TopicPolicy``
``/transactions/open/{txnId}``                                      ``TxnRecord``
``/transactions/owners/{owner}``                                    the owner's epoch
``/auth/policy``                                                    ``AuthRecord``
``/auth/internal``                                                  the cluster's own token
==================================================================  =======================

Everything a topic owns (its record, leadership, subscriptions and their consumers,
tiered segments' records, placements, sleeping segments' stats, the records of Spark's
idempotent writes) lives under the topic's path, so deleting the topic's tree removes
all of it at once and a grant on the topic covers it. What belongs to a namespace
(default policy, limit overrides) or to the cluster (the auth policy, the internal
token) lives under roots of its own, and so do transactions, which span topics.
"""

from __future__ import annotations

import hashlib

from runtime.names import TopicName, parse_namespace, validate_part

_TOPICS = "/topics"
_LIMITS = "/limits"
_POLICIES = "/policies"
_TRANSACTIONS = "/transactions"
TRANSACTIONS_ROOT = f"{_TRANSACTIONS}/open/"  # every transaction's record is under it
AUTH_POLICY_PATH = "/auth/policy"
INTERNAL_TOKEN_PATH = "/auth/internal"


def topic_path(topic: TopicName) -> str:
    return f"{_TOPICS}/{topic.short}"


TOPICS_ROOT = f"{_TOPICS}/"  # every topic's tree is under it


def topic_of_path(path: str) -> TopicName | None:
    """The topic whose record ``topic_path`` puts at ``path``; None for any other path
    (a namespace, or something a topic owns)."""
    parts = path.split("/")
    if len(parts) != 5 or f"/{parts[1]}" != _TOPICS:
        return None
    return TopicName.parse(f"topic://{parts[2]}/{parts[3]}/{parts[4]}")


def namespace_path(namespace: str) -> str:
    tenant, name = parse_namespace(namespace)
    return f"{_TOPICS}/{tenant}/{name}"


def controller_path(topic: TopicName) -> str:
    return f"{topic_path(topic)}/controller"


def subscriptions_path(topic: TopicName) -> str:
    return f"{topic_path(topic)}/subscriptions"


def subscription_path(topic: TopicName, subscription: str) -> str:
    return f"{subscriptions_path(topic)}/{validate_part('subscription', subscription)}"


def consumers_path(topic: TopicName, subscription: str) -> str:
    return f"{subscription_path(topic, subscription)}/consumers"


def consumer_path(topic: TopicName, subscription: str, consumer: str) -> str:
    return f"{consumers_path(topic, subscription)}/{validate_part('consumer name', consumer)}"


def tiered_segments_path(topic: TopicName, incarnation: str) -> str:
    """Where the records of a topic incarnation's tiered segments live (one per segment
    id, ``storage.tier_records``), under the topic so they go with it."""
    return f"{topic_path(topic)}/tiered/{incarnation}"


def placements_path(topic: TopicName, incarnation: str) -> str:
    """Which node disk holds each local segment of a topic incarnation when every node
    keeps its own (``storage.placements``), under the topic so it goes with it."""
    return f"{topic_path(topic)}/placed/{incarnation}"


def replica_sets_path(topic: TopicName, incarnation: str) -> str:
    """Each replicated segment's replicas and leader epoch (``storage.replica_sets``),
    under the topic so they go with it."""
    return f"{topic_path(topic)}/replicas/{incarnation}"


def asleep_path(topic: TopicName, incarnation: str) -> str:
    """The last stats of a topic incarnation's drained sealed segments whose actors exited
    (``storage.asleep``), under the topic so they go with it."""
    return f"{topic_path(topic)}/asleep/{incarnation}"


def policy_path(namespace: str) -> str:
    tenant, name = parse_namespace(namespace)
    return f"{_POLICIES}/{tenant}/{name}"


def limits_path(namespace: str) -> str:
    tenant, name = parse_namespace(namespace)
    return f"{_LIMITS}/{tenant}/{name}"


def sink_path(
    topic: TopicName, query: str, partition: int | None = None, chunk: int | None = None
) -> str:
    """Under the topic, so a deleted topic's writes go with it; without ``partition`` and
    ``chunk``, the root of one query's (or batch write's) records."""
    base = f"{topic_path(topic)}/sinks/{query}"
    return base if partition is None else f"{base}/{partition}/{chunk}"


def transaction_path(txn_id: str) -> str:
    """A transaction's record (``runtime.transactions.TxnRecord``)."""
    return f"{TRANSACTIONS_ROOT}{validate_part('transaction id', txn_id)}"


def transaction_owner_path(owner: str, principal: str | None = None) -> str:
    """An owner's epoch and its open transaction: starting a transaction fences the one
    before it. Owners are named per principal (by its name's digest: a principal may be
    any string), so one tenant's owner never fences another's of the same name."""
    owner = validate_part("transaction owner", owner)
    if principal is None:
        return f"{_TRANSACTIONS}/owners/{owner}"
    digest = hashlib.sha256(principal.encode()).hexdigest()[:32]
    return f"{_TRANSACTIONS}/principals/{digest}/owners/{owner}"
