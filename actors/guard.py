"""Who may call: the cluster's authentication policy, applied where the data lives.

A check that runs in the client's process decides nothing: a client that skips
it, or whose environment names no policy, would be let in. So every server-side
entry point (segments, their data plane, coordinators, the DAG watch,
controllers, the admin service and gateway) asks this module, with the
credential the caller presented.

The policy lives in the cluster's metadata (``storage.catalog``: token digests
and grants, never tokens). Each process keeps a copy and re-reads it when it is
older than ``REFRESH_S``, so a rotation or a revocation applies everywhere within
seconds, without restarting anything. No stored policy means authentication is
off, as on a fresh local cluster.

The system's own actors call each other with the cluster's internal token
(``Catalog.internal_token``), which no operator file holds and which may do
anything; the internal principal is not part of any operator policy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runtime.auth import AuthPolicy, Grant, Permission, Principal, token_digest
from runtime.errors import UnauthorizedError
from storage.catalog import Catalog

REFRESH_S = 1.0  # how stale a process's copy of the policy may get
INTERNAL_PRINCIPAL = Principal("raytopics-internal", (Grant("*", frozenset(Permission)),))


class Guard:
    """One process's view of the policy, refreshed on use when stale."""

    def __init__(
        self,
        catalog: Catalog | None = None,
        *,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalog = catalog or Catalog()
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._policy = AuthPolicy()
        self._version = -1  # never read
        self._read_at = float("-inf")
        self._internal_token: str | None = None
        self._internal_digest: str | None = None

    @property
    def version(self) -> int:
        """The policy version in force (0: authentication off); refreshes when stale."""
        self._refresh_if_stale()
        return self._version

    @property
    def enabled(self) -> bool:
        self._refresh_if_stale()
        return self._policy.enabled

    def authenticate(self, token: str | None) -> Principal | None:
        """The caller's principal; ``None`` while authentication is off.
        ``UnauthenticatedError`` for no token, an unknown or a revoked one."""
        self._refresh_if_stale()
        if not self._policy.enabled:
            return None
        if token and self._is_internal(token):
            return INTERNAL_PRINCIPAL
        return self._policy.authenticate(token)

    def check(self, token: str | None, action: Permission, namespace: str) -> Principal | None:
        """Authenticate, then require ``action`` on ``namespace`` (``tenant/ns``, or ``*``
        for what spans every namespace)."""
        principal = self.authenticate(token)
        if principal is not None and not principal.may(action, namespace):
            raise UnauthorizedError(
                f"principal {principal.name!r} may not {action.value} in namespace {namespace}"
            )
        return principal

    def check_internal(self, token: str | None, what: str) -> None:
        """Require the system's own credential for ``what`` (a replica's fetch: no
        operator's grant, admin's included, may pose as a segment's replica)."""
        principal = self.authenticate(token)
        if principal is not None and principal is not INTERNAL_PRINCIPAL:
            raise UnauthorizedError(
                f"principal {principal.name!r} may not {what}: the system's own credential only"
            )

    def allows(self, principal: Principal | None, action: Permission, namespace: str) -> bool:
        """Whether an already authenticated caller may (still) ``action`` on ``namespace``."""
        return principal is None or principal.may(action, namespace)

    def internal_token(self) -> str:
        """What this process presents when it calls another actor of the system (read
        once: it is made with the cluster's metadata and never changes after)."""
        if self._internal_token is None:
            self._internal_token = self._catalog.internal_token()
        return self._internal_token

    def refresh(self) -> None:
        """Read the stored policy now."""
        record = self._catalog.auth()
        with self._lock:
            if record is None:
                self._policy, self._version = AuthPolicy(), 0
            elif record.version != self._version:
                self._policy, self._version = record.auth_policy(), record.version
            self._read_at = self._clock()

    def _refresh_if_stale(self) -> None:
        if self._clock() - self._read_at >= self._refresh_s:
            self.refresh()

    def _is_internal(self, token: str) -> bool:
        if self._internal_digest is None:
            self._internal_digest = token_digest(self.internal_token())
        return token_digest(token) == self._internal_digest


_process_guard: Guard | None = None
_process_lock = threading.Lock()


def guard() -> Guard:
    """This process's guard (one per process: its copy of the policy is shared)."""
    global _process_guard
    with _process_lock:
        if _process_guard is None:
            _process_guard = Guard()
        return _process_guard
