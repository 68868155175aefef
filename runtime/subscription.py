"""Subscription-level metadata, stored at ``.../subscriptions/{subscription}``.

A subscription is created and deleted across many segments; its state field
records how far that got, so a controller restart can finish the job.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SubscriptionState = Literal["CREATING", "ACTIVE", "DELETING"]
SubscriptionKind = Literal["subscription", "checkpoint_group"]
StartPosition = Literal["earliest", "latest"]
DEFAULT_GRACE_S = 60.0


class SubscriptionMetadata(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    name: str
    state: SubscriptionState = "CREATING"
    position: StartPosition = "earliest"
    kind: SubscriptionKind = "subscription"
    session_grace_s: float = Field(default=DEFAULT_GRACE_S, alias="sessionGraceS", gt=0)
    finished_segments: tuple[int, ...] = Field(default=(), alias="finishedSegments")
    positions: dict[str, int] = Field(default_factory=dict)
    created_at_ms: int = Field(default_factory=lambda: int(time.time() * 1000), alias="createdAtMs")

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    def finishing(self, segment: int) -> SubscriptionMetadata:
        done = tuple(sorted({*self.finished_segments, segment}))
        positions = {k: v for k, v in self.positions.items() if k != str(segment)}
        return self.model_copy(update={"finished_segments": done, "positions": positions})

    @classmethod
    def from_bytes(cls, data: bytes) -> SubscriptionMetadata:
        return cls.model_validate_json(data)
