"""What a maintenance round asks every replica of a topic's replicated segments, and how
it tells a dead leader from a slow one.

One call per segment host (``SegmentHost.replica_statuses``) asks all the replicas it
serves. A host that does not answer may be slow (a pause, a busy machine) or gone, and
Ray cannot say which until it declares the node dead, which takes its health checks
(seconds to tens of seconds). The controller counts a silent replica as lost only after a
grace period (``actors.control.replica_keeper``), so that a pause never costs a failover.

One case is certain sooner: a host that has not answered within ``PROBE_AFTER_S`` is
probed at the address of each of its replicas' data planes (each replica reports its own
in its status). A refused connection means nothing listens there: the process is gone,
killed or crashed, and its node's kernel said so. A paused or busy process still accepts
connections (its kernel completes them), so it is never refused; nor is a machine that
went silent (no answer at all), which only the grace or Ray's node table can tell. Only a
refusal shortens the wait: no answer within ``PROBE_WAIT_S`` proves nothing.

Who calls: ``ReplicaKeeper.round``. What it affects: which replicas the round counts as
answering, and which leaders as lost at once (``Asked.refused``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import RayError

from actors.guard import guard
from actors.registry import lookup
from runtime.config import topic_settings
from runtime.errors import ScalableTopicsError
from runtime.layout import SegmentInfo
from runtime.names import TopicName
from runtime.segment_hosts import host_name
from storage.replica_sets import ReplicaSet

# How long a round waits for a segment host's answer.
STATUS_WAIT_S = 2.0
# A host silent this long has its replicas' data planes probed.
PROBE_AFTER_S = 0.1
# How long a probe waits for its connection: longer proves nothing.
PROBE_WAIT_S = 0.5

Key = tuple[int, str]  # (segment id, the replica's disk)


@dataclass
class Asked:
    """A round's answers: each replica's ``replica_status`` by (segment id, disk), ``None``
    when it did not answer; ``refused``: replicas whose data plane refused a connection
    (their process is gone)."""

    statuses: dict[Key, dict[str, Any] | None] = field(default_factory=dict)
    refused: set[Key] = field(default_factory=set)


async def ask_replicas(
    topic: TopicName,
    records: Mapping[int, tuple[SegmentInfo, ReplicaSet]],
    nodes: Mapping[str, str],
    endpoints: Mapping[Key, tuple[str, int]],
) -> Asked:
    """Every replica of ``records`` whose disk has a live node (``nodes``: disk → node)
    asked, one call per host; ``endpoints``: the data-plane addresses the replicas last
    reported, probed when their host is silent."""
    by_host: dict[str, list[tuple[Key, str]]] = {}
    for info, record in records.values():
        name = info.name(topic)
        for disk in record.replicas:
            if disk in nodes:
                host = host_name(name, nodes[disk], 1, topic_settings())
                by_host.setdefault(host, []).append(((info.segment_id, disk), str(name)))
    token = guard().internal_token()
    asked = Asked()
    parts = await asyncio.gather(
        *(_ask_host(host, replicas, token, endpoints) for host, replicas in by_host.items())
    )
    for part in parts:
        asked.statuses.update(part.statuses)
        asked.refused |= part.refused
    return asked


async def _ask_host(
    host: str,
    replicas: list[tuple[Key, str]],
    token: str | None,
    endpoints: Mapping[Key, tuple[str, int]],
) -> Asked:
    try:
        actor = await asyncio.to_thread(lookup, host)
        call = asyncio.ensure_future(
            actor.replica_statuses.remote([segment for _, segment in replicas], credential=token)
        )
    except (RayError, ScalableTopicsError, ValueError):
        return Asked()
    done, _ = await asyncio.wait({call}, timeout=PROBE_AFTER_S)
    if not done:
        probed = [key for key, _ in replicas if key in endpoints]
        refusals = await asyncio.gather(*(refuses(endpoints[key]) for key in probed))
        refused = {key for key, refusing in zip(probed, refusals, strict=True) if refusing}
        if refused:
            call.cancel()
            return Asked(refused=refused)
    try:
        answer = await asyncio.wait_for(call, STATUS_WAIT_S - PROBE_AFTER_S)
    except (RayError, TimeoutError, ScalableTopicsError, ValueError):
        return Asked()
    return Asked({key: answer.get(segment) for key, segment in replicas})


async def refuses(endpoint: tuple[str, int]) -> bool:
    """Whether a connection to ``endpoint`` is refused (nothing listens there)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*endpoint), PROBE_WAIT_S)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):  # unreachable or slow: no proof of anything
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False
