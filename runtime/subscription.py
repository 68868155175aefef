"""Subscription-level metadata, stored at ``.../subscriptions/{subscription}``.

A subscription is created and deleted across many segments; its state field
records how far that got, so a controller restart can finish the job.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SubscriptionState = Literal["CREATING", "ACTIVE", "DELETING"]
StartPosition = Literal["earliest", "latest"]


class SubscriptionMetadata(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    name: str
    state: SubscriptionState = "CREATING"
    position: StartPosition = "earliest"
    created_at_ms: int = Field(default_factory=lambda: int(time.time() * 1000), alias="createdAtMs")

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SubscriptionMetadata:
        return cls.model_validate_json(data)
