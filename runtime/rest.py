"""The REST contract: the Admin API's path templates (aiohttp and OpenAPI syntax).

Both sides speak them, the gateway (``actors.gateway.server``) and ``AdminHttpClient``
(``clients.http``), and neither may import the other: the gateway must not
depend on the clients above it, and a client must stay importable without the
server's machinery. So the wire contract lives below both, here.
"""

from __future__ import annotations

import math
import os

from runtime.errors import InvalidArgumentError

SCALABLE = "/admin/v2/scalable"
SEGMENTS = "/admin/v2/segments"
LIMITS = "/admin/v2/limits"
# A mutation sent again with the same key (a client's retry) is applied once; without
# one, the gateway makes one per request, kept across its own retries.
IDEMPOTENCY_KEY = "Idempotency-Key"

NAMESPACE_PATH = SCALABLE + "/{tenant}/{namespace}"
TOPIC_PATH = NAMESPACE_PATH + "/{topic}"
STATS_PATH = TOPIC_PATH + "/stats"
STATUS_PATH = TOPIC_PATH + "/status"
LAYOUT_PATH = TOPIC_PATH + "/layout"  # a long poll for its next change
STREAM_INITIAL_PATH = TOPIC_PATH + "/stream/initial"
STREAM_LATEST_PATH = TOPIC_PATH + "/stream/latest"
STREAM_RANGES_PATH = TOPIC_PATH + "/stream/ranges"
STREAM_ENDPOINT_PATH = TOPIC_PATH + "/stream/endpoint/{segmentId}"
STREAM_WRITE_PATH = TOPIC_PATH + "/stream/write"
STREAM_SINK_OPEN_PATH = TOPIC_PATH + "/stream/sink/open"
STREAM_SINK_REROUTE_PATH = TOPIC_PATH + "/stream/sink/reroute"
STREAM_SINK_FINISH_PATH = TOPIC_PATH + "/stream/sink/finish"
SUBSCRIPTIONS_PATH = TOPIC_PATH + "/subscriptions"
SUBSCRIPTION_PATH = SUBSCRIPTIONS_PATH + "/{subscription}"
RESET_PATH = SUBSCRIPTION_PATH + "/reset"
CLEAR_BACKLOG_PATH = SUBSCRIPTION_PATH + "/clear-backlog"
# A stream consumer outside Ray: its membership, and its subscription's cursor per segment
CONSUMER_PATH = SUBSCRIPTION_PATH + "/consumers/{consumer}"
ASSIGNMENT_PATH = CONSUMER_PATH + "/assignment"  # a long poll, and the consumer's heartbeat
RELEASE_PATH = CONSUMER_PATH + "/release/{segmentId}"
FINISHED_PATH = CONSUMER_PATH + "/finished/{segmentId}"
CURSOR_PATH = SUBSCRIPTION_PATH + "/cursors/{segmentId}"
# A checkpoint group (its consumers join as a stream consumer's do, above)
CHECKPOINT_GROUP_PATH = TOPIC_PATH + "/checkpoint-groups/{subscription}"
CHECKPOINT_GROUP_RESET_PATH = CHECKPOINT_GROUP_PATH + "/reset"
SPLIT_PATH = TOPIC_PATH + "/split/{segmentId}"
MERGE_PATH = TOPIC_PATH + "/merge/{segmentId1}/{segmentId2}"
SEGMENT_PATH = SEGMENTS + "/{tenant}/{namespace}/{topic}/{descriptor}"
TERMINATE_PATH = SEGMENT_PATH + "/terminate"
# not under NAMESPACE_PATH, where "limits" would be read as a topic name
LIMITS_PATH = LIMITS + "/{tenant}/{namespace}"
# the policy a namespace's topics follow where their own sets nothing
NAMESPACE_POLICY_PATH = "/admin/v2/namespace-policies/{tenant}/{namespace}"
POLICY_PATH = TOPIC_PATH + "/policy"
RECOVER_PATH = TOPIC_PATH + "/recover"
STORAGE_PATH = "/admin/v2/storage"
ORPHANED_STORAGE_PATH = STORAGE_PATH + "/orphaned"
AUTH_PATH = "/admin/v2/auth"  # the cluster's authentication policy
TRANSACTIONS_PATH = "/admin/v2/transactions"
TRANSACTION_PATH = TRANSACTIONS_PATH + "/{txnId}"
COMMIT_PATH = TRANSACTION_PATH + "/commit"
ABORT_PATH = TRANSACTION_PATH + "/abort"
# a consumer's acknowledgement that applies when the transaction commits
TXN_ACK_PATH = SEGMENT_PATH + "/transactions/{txnId}/acknowledgements"

# How long the gateway works on one request before it answers 504 ``timeout``
# (a change asked for may still complete; the resource says). Status long polls
# wait at most half of it, so their answer always arrives.
REST_TIMEOUT_ENV = "RAYTOPICS_REST_TIMEOUT_S"
DEFAULT_REST_TIMEOUT_S = 30.0
MIN_REST_TIMEOUT_S = 0.01


def rest_timeout_s() -> float:
    """The gateway's per-request time-out: ``RAYTOPICS_REST_TIMEOUT_S`` or 30 s."""
    raw = os.environ.get(REST_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_REST_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= MIN_REST_TIMEOUT_S or math.isinf(value):
        raise InvalidArgumentError(
            f"{REST_TIMEOUT_ENV}={raw!r}: must be a number of seconds ≥ {MIN_REST_TIMEOUT_S}"
        )
    return value
