"""The admin service's operations on the cluster rather than on one topic: namespace
defaults and limits, storage that outlived its metadata, and the cluster's
authentication policy (what a policy may be is ``actors.admin.auth``), with admin on
every namespace (``*``); while no policy is stored, anyone may load the first one.

A mixin of ``actors.admin.service.AdminService``, which provides ``_guard`` (the
cluster's policy) and ``_catalog``; each method's caller is checked as the Admin API
table says (``actors.admin.permits``) before it runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from actors.admin.auth import (
    FIRST_POLICY_IS_THE_OPERATORS,
    load_policy,
    policy_status,
)
from actors.admin.permits import admin_operation
from actors.admin.storage_tasks import storage_report
from actors.control.node_disks import check_replication
from actors.control.tiering import check_policy_tier
from actors.guard import Guard
from runtime.errors import UnauthorizedError
from runtime.limits import Limits, namespace_limits
from runtime.policy import TopicPolicy
from storage.catalog import Catalog
from storage.durability import default_storage_root


class ClusterOperations:
    _catalog: Catalog
    _guard: Guard

    # --- namespace default policy ---------------------------------------------------------

    @admin_operation
    async def get_namespace_policy(
        self, namespace: str, *, credential: str | None = None
    ) -> dict[str, Any]:
        return (self._catalog.namespace_policy(namespace) or TopicPolicy()).shown()

    @admin_operation
    async def set_namespace_policy(
        self, namespace: str, policy: dict[str, Any], *, credential: str | None = None
    ) -> dict[str, Any]:
        """Replace the namespace's default policy (validated, its tier checked, first)."""
        parsed = TopicPolicy.parse(policy)
        await check_policy_tier(parsed)
        root = str(default_storage_root())
        await asyncio.to_thread(check_replication, parsed, namespace, root)
        self._catalog.set_namespace_policy(namespace, parsed)
        return parsed.shown()

    # --- limits -------------------------------------------------------------------------

    @admin_operation
    async def set_namespace_limits(
        self, namespace: str, limits: dict[str, int], *, credential: str | None = None
    ) -> dict[str, int]:
        """The whole resulting set is validated before it is stored."""

        def merged(stored: dict[str, Any]) -> dict[str, Any]:
            overrides = {**stored, **limits}
            Limits.from_env().overridden(overrides)  # raises before anything is written
            return overrides

        self._catalog.update_limit_overrides(namespace, merged)
        return asdict(namespace_limits(self._catalog, namespace))

    # --- storage: what outlives metadata (storage.topic_storage) ----------------------

    @admin_operation
    async def check_storage(
        self, delete: bool = False, *, credential: str | None = None
    ) -> dict[str, Any]:
        """Orphaned storage (and, with ``delete``, its removal); spans every namespace."""
        return await storage_report(self._catalog, delete)

    # --- the cluster's authentication policy ---------------------------------------------

    @admin_operation
    async def load_auth(
        self, document: dict[str, Any], *, over_rest: bool = False, credential: str | None = None
    ) -> dict[str, Any]:
        """Replace the policy with ``document`` (``actors.admin.auth.load_policy``); this
        process applies it at once, every other within ``actors.guard.REFRESH_S``.

        ``over_rest`` (the gateway says so): the caller is outside the cluster, and
        while no policy is stored anyone who reaches the API would pass the check and
        could lock everyone else out with a token of their own. The first policy is the
        operator's, loaded from inside the cluster's boundary."""
        if over_rest and self._catalog.auth() is None:
            raise UnauthorizedError(FIRST_POLICY_IS_THE_OPERATORS)
        status = load_policy(self._catalog, document)
        self._guard.refresh()
        return status

    @admin_operation
    async def disable_auth(self, *, credential: str | None = None) -> dict[str, Any]:
        """Turn authentication off: anyone who reaches the cluster may do anything."""
        self._catalog.disable_auth()
        self._guard.refresh()
        return policy_status(None)

    @admin_operation
    async def auth_status(self, *, credential: str | None = None) -> dict[str, Any]:
        return policy_status(self._catalog.auth())
