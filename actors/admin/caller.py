"""``AdminServiceCaller``: how the Python admin client and the REST gateway reach the
cluster's admin service (``actors.admin.service``).

Both present their caller's credential with every call and decide nothing
themselves. The service is a detached actor that Ray restarts after a crash, so
a call that meets a dead or restarting service is sent again until
``restart_timeout_s`` has passed: the service's reads are safe to repeat, and
its mutations are either idempotent or, for split and merge, carry the
caller's request id, which the topic's controller recognizes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

from actors.admin.service import DEFAULT_RESTART_TIMEOUT_S, RESTART_ERRORS, admin_service_actor
from runtime import remote
from runtime.admin_api import operation
from runtime.errors import NotFoundError, UnavailableError

RETRY_S = 0.05  # a restart takes a second or two: look often


class AdminServiceCaller:
    """Calls the admin service on behalf of one caller (a client, or the gateway for
    each request), riding out a restart of the service."""

    def __init__(self, restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S) -> None:
        self._restart_timeout_s = restart_timeout_s
        self._handle: ray.actor.ActorHandle | None = None

    async def call(self, method: str, *args: Any, credential: str | None, **kwargs: Any) -> Any:
        """The service's ``method`` as the holder of ``credential``; its typed errors
        come back as themselves, but for a delete sent again after its answer was lost
        that finds the thing gone: the first attempt deleted it (``Operation.gone``)."""
        deadline = time.monotonic() + self._restart_timeout_s
        lost = False
        while True:
            try:
                return await remote.call(self._send(method, args, kwargs, credential))
            except RESTART_ERRORS as err:
                self._lost(err, deadline)
                lost = True
            except NotFoundError as err:
                if lost and isinstance(err, operation(method).gone):
                    return None
                raise
            await asyncio.sleep(RETRY_S)

    def call_blocking(self, method: str, *args: Any, credential: str | None, **kwargs: Any) -> Any:
        """``call`` for a synchronous caller (a constructor), whatever loop runs around it."""
        deadline = time.monotonic() + self._restart_timeout_s
        while True:
            try:
                return remote.get(self._send(method, args, kwargs, credential))
            except RESTART_ERRORS as err:
                self._lost(err, deadline)
            time.sleep(RETRY_S)

    def _send(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], credential: str | None
    ) -> ray.ObjectRef:
        if self._handle is None:
            self._handle = admin_service_actor()
        return getattr(self._handle, method).remote(*args, credential=credential, **kwargs)

    def _lost(self, err: Exception, deadline: float) -> None:
        """Forget the handle (a service killed for good is started afresh); give up
        once the deadline has passed."""
        self._handle = None
        if time.monotonic() > deadline:
            raise UnavailableError(
                f"the admin service did not answer within {self._restart_timeout_s}s: {err}"
            ) from None
