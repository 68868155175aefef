"""``ScalableTopicsAdmin``: the Admin Client API, carried out by the cluster.

The client decides nothing: each call goes, with the caller's token, to the
cluster's admin service (``actors.admin.service``), which checks it against the
policy stored in the cluster and then reads the metadata or asks the topic's
controller. So a process without the operator's policy, or with a policy of
its own, gets exactly what its token allows there, and the same typed errors
as every other way in (REST, the CLI).

Calls ride out a restart of the service and of a topic's controller for
``controller_restart_timeout_s``; a split or merge is sent again under the same
request id, which the controller recognizes, so a retry never applies it twice.
No call waits forever: each waits as long as the REST gateway would for the same
operation (``runtime.admin_api``), then raises ``RequestTimeoutError``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any

from actors.admin.caller import AdminServiceCaller
from actors.admin.service import (
    DEFAULT_RESTART_TIMEOUT_S,
    DEFAULT_SEGMENT_TIMEOUT_S,
    AdminService,
)
from clients._loop import with_sync_twins
from clients.admin_calls import AdminCall, AdminCalls
from runtime.admin_api import operation
from runtime.auth import default_token
from runtime.config import topic_settings
from runtime.connect import connect
from runtime.errors import RequestTimeoutError
from runtime.operations import new_request_id
from runtime.rest import DEFAULT_REST_TIMEOUT_S


@with_sync_twins
class ScalableTopicsAdmin(AdminCalls):
    """Administer scalable topics through Ray (the Admin Client API of
    ``clients.admin_calls``); every method has an ``_async`` twin."""

    def __init__(
        self,
        *,
        address: str | None = None,
        namespace: str | None = None,
        controller_restart_timeout_s: float = DEFAULT_RESTART_TIMEOUT_S,
        segment_timeout_s: float = DEFAULT_SEGMENT_TIMEOUT_S,
        token: str | None = None,
        request_timeout_s: float = DEFAULT_REST_TIMEOUT_S,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) is presented with every call; one the
        cluster does not know fails here (``UnauthenticatedError``), not at first use.
        While the cluster has no policy, no token is needed. ``request_timeout_s``: how
        long a call waits for its answer, as the REST gateway's time-out does (an
        operation with a longer time-out of its own, such as a split, waits that long);
        then ``RequestTimeoutError``, and a change asked for may still complete."""
        self._token = token if token is not None else default_token()
        connect(address, namespace=namespace)
        self._restart_timeout_s = controller_restart_timeout_s
        self._segment_timeout_s = segment_timeout_s
        self._request_timeout_s = request_timeout_s
        self._service = AdminServiceCaller(controller_restart_timeout_s)
        self._service.call_blocking("whoami", credential=self._token)

    # --- transport ------------------------------------------------------------------------

    async def _run(self, call: AdminCall) -> Any:
        """The call with what this client adds where the service's handler takes it: how
        long a topic's controller may take to restart, how long a segment may take to
        answer, and the settings of this process that a new topic's actors inherit."""
        handled = _handler_options(call.operation)
        options = {
            "restart_timeout_s": self._restart_timeout_s,
            "segment_timeout_s": self._segment_timeout_s,
        }
        kwargs = {name: value for name, value in options.items() if name in handled}
        if "settings" in handled:
            kwargs["settings"] = topic_settings()
        return await self._call(call.operation, **call.args, **kwargs)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The admin service's ``method`` with this client's token, and a fresh request id
        when the operation takes one (``runtime.admin_api``): the service's retries
        after a restart send the same id, so the operation is applied once."""
        op = operation(method)
        if op.request_id:
            kwargs.setdefault("request_id", new_request_id())
        wait_s = op.rest_timeout_s(self._request_timeout_s)
        try:
            async with asyncio.timeout(wait_s) as deadline:
                return await self._service.call(method, *args, credential=self._token, **kwargs)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise RequestTimeoutError(
                f"{method}: no answer from the cluster's admin service within {wait_s:g}s; "
                "what it asked for may still complete: read the resource to see its state"
            ) from None


@functools.cache
def _handler_options(method: str) -> frozenset[str]:
    """The keyword-only parameters of the admin service's handler ``method``."""
    parameters = inspect.signature(getattr(AdminService, method)).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)
