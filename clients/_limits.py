"""A client's copy of its namespace's limits, as the cluster answers them.

The producer checks a message's size before queueing it and cuts batches at the
limits, so a refusal comes at ``send`` and a batch never exceeds what its segment
accepts. The segment actor stays the authority (it checks every append); this
copy only makes the refusal early. It comes from the admin service, which checks
the producer's credential (``produce`` implies ``lookup``), never from the
metadata store or this process's environment: a client whose environment
differs from the operator's still sees the cluster's limits. A client outside Ray
asks the REST gateway, which asks the admin service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from runtime.errors import ScalableTopicsError
from runtime.limits import Limits

log = logging.getLogger(__name__)

# How a client asks for a namespace's limits: (namespace, credential) -> the limits.
Ask = Callable[[str, str | None], Awaitable[Limits]]


class ClusterLimits:
    """The limits in force in one namespace, re-asked at most every ``max_age_s``, so an
    operator's change reaches running producers within seconds.

    Who calls: the producer, from user threads (``send``'s early check) and its loop
    (batch cuts), through ``current``, which never waits: a stale value starts one
    refresh on the loop and is answered meanwhile; a refresh that fails keeps it."""

    def __init__(
        self,
        namespace: str,
        credential: str | None,
        limits: Limits,
        loop: asyncio.AbstractEventLoop,
        max_age_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        ask: Ask | None = None,
    ) -> None:
        self._ask = ask or _ask_admin_service
        self._namespace, self._credential = namespace, credential
        self._limits, self._loop = limits, loop
        self._max_age_s, self._clock = max_age_s, clock
        self._read_at = clock()
        self._refreshing = False

    @classmethod
    async def open(
        cls, namespace: str, credential: str | None, ask: Ask | None = None
    ) -> ClusterLimits:
        """The namespace's limits now, asked through ``ask`` (default: the admin service
        over Ray); a refusal (the credential) is raised here."""
        limits = await (ask or _ask_admin_service)(namespace, credential)
        return cls(namespace, credential, limits, asyncio.get_running_loop(), ask=ask)

    @property
    def current(self) -> Limits:
        if not self._refreshing and self._clock() - self._read_at >= self._max_age_s:
            self._refreshing = True
            self._loop.call_soon_threadsafe(self._start_refresh)
        return self._limits

    def _start_refresh(self) -> None:
        self._loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            self._limits = await self._ask(self._namespace, self._credential)
        except (ScalableTopicsError, TimeoutError) as err:
            log.debug("limits of %s not refreshed: %s", self._namespace, err)
        finally:
            self._read_at, self._refreshing = self._clock(), False


async def _ask_admin_service(namespace: str, credential: str | None) -> Limits:
    from actors.admin.caller import AdminServiceCaller  # a Ray driver's only

    answer = await AdminServiceCaller().call(
        "get_namespace_limits", namespace, credential=credential
    )
    return Limits(**answer)
