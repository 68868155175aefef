"""``CheckpointConsumer``: assignment like a stream consumer, positions kept by the caller.

For connectors that store progress in their own system: nothing is
acknowledged to the topic; ``checkpoint()`` captures where this consumer is,
and a consumer started from that checkpoint — even after later splits and
merges — resumes exactly after it, following the DAG.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clients._group_access import GroupAccess
from clients._group_consumer import GroupConsumer, group_access, run_on_loop
from clients._group_core import ConsumerConfig, GroupConsumerCore
from clients._remote import gateway_url
from runtime.auth import client_credential
from runtime.errors import InvalidArgumentError
from runtime.names import TopicName
from runtime.subscription import DEFAULT_GRACE_S


@dataclass(frozen=True)
class Checkpoint:
    """Next offset per in-progress segment plus the segments already finished."""

    topic: str
    positions: dict[int, int] = field(default_factory=dict)
    finished: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "topic": self.topic,
                "positions": {str(k): v for k, v in sorted(self.positions.items())},
                "finished": sorted(self.finished),
            }
        )

    @classmethod
    def at_timestamp(
        cls, topic: str, when: datetime | int, *, token: str | None = None, url: str | None = None
    ) -> Checkpoint:
        """Where a reader starts to receive every message published at or after ``when``
        (a timezone-aware ``datetime``, or epoch milliseconds) and none before: in each
        segment its first such message, and the segments that end before it finished.
        For ``CheckpointConsumer(start=...)``; ``read_topic`` and ``read_topic_dataset``
        take the time itself as ``start`` or ``end``. Needs ``consume``. Asked of the
        REST gateway at ``url`` (default ``RAYTOPICS_URL``) when there is one."""
        url = gateway_url(url, None)
        if url is not None:
            from clients.http import AdminHttpClient

            with AdminHttpClient(url, token=token) as http:
                found = http.position_at_time(topic, when)
        else:
            from clients.admin import ScalableTopicsAdmin

            found = ScalableTopicsAdmin(token=token).position_at_time(topic, when)
        return cls(
            topic=str(TopicName.parse(topic)),
            positions={int(k): int(v) for k, v in found["next"].items()},
            finished=tuple(sorted(int(s) for s in found["finished"])),
        )

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        try:
            data = json.loads(text)
            return cls(
                topic=str(TopicName.parse(data["topic"])),
                positions={int(k): int(v) for k, v in data.get("positions", {}).items()},
                finished=tuple(int(s) for s in data.get("finished", ())),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise InvalidArgumentError(f"invalid checkpoint JSON: {err}") from None


class CheckpointConsumer(GroupConsumer):
    def __init__(
        self,
        topic: str,
        group: str,
        consumer_name: str,
        start: Checkpoint | None = None,
        *,
        session_grace_s: float = DEFAULT_GRACE_S,
        token: str | None = None,
        address: str | None = None,
        url: str | None = None,
        **config: Any,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume`` on the topic's
        namespace when the cluster has an auth policy; a refusal is raised here.
        ``address``: the Ray to join when this process is not connected yet. ``url``
        (default ``RAYTOPICS_URL`` when no ``address`` is given): the REST gateway to
        consume through instead, from a process that never joins Ray."""
        name = TopicName.parse(topic)
        if start is not None and start.topic != str(name):
            raise InvalidArgumentError(f"checkpoint is for {start.topic}, not {name}")
        settings, credential = ConsumerConfig(**config), client_credential(token)
        url = gateway_url(url, address)
        access = group_access(name, group, consumer_name, credential, url=url, address=address)
        self._core = GroupConsumerCore(
            name,
            group,
            consumer_name,
            acknowledges=False,
            config=settings,
            credential=credential,
            access=access,
            start_positions=start.positions if start else None,
        )
        self._topic = str(name)
        run_on_loop(self._join(access, session_grace_s, start))

    async def _join(
        self, access: GroupAccess, session_grace_s: float, start: Checkpoint | None
    ) -> None:
        try:
            await access.ensure_group(session_grace_s)
            if start is not None:
                await access.reset(list(start.finished), start.positions)
        except BaseException:
            await access.close()
            raise
        await self._core.start()

    def checkpoint(self) -> Checkpoint:
        """Where this consumer is: resume from it to get exactly the messages after it."""
        snapshot = run_on_loop(self._core.access.snapshot())
        return Checkpoint(self._topic, self._core.positions(), tuple(snapshot["finished"]))
