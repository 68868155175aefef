"""Subscription settings shared by the admin API, the REST gateway and the catalog.

The record itself (``SubscriptionMetadata``) is kept by ``storage.catalog``.
"""

from __future__ import annotations

from typing import Literal

StartPosition = Literal["earliest", "latest"]
DEFAULT_GRACE_S = 60.0
