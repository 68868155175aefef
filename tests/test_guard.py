"""The server-side guard: the stored policy applied, re-read when stale, the internal token.

Pure: the guard reads the policy through two catalog methods, given here by a
plain holder of the record, so refresh timing and revocation run on a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from actors.guard import INTERNAL_PRINCIPAL, Guard
from runtime.auth import AuthPolicy, Permission
from runtime.errors import UnauthenticatedError, UnauthorizedError
from storage.records import AuthRecord

OPS, APP = "ops-token-0123456789", "app-token-0123456789"
INTERNAL = "internal-token-" + "0" * 49


def policy(*tokens: tuple[str, str, str, str]) -> dict:
    return {
        "tokens": [
            {"principal": p, "token": t, "grants": [{"namespace": ns, "actions": [action]}]}
            for p, t, ns, action in tokens
        ]
    }


@dataclass
class Stored:
    """What the catalog would hold: a policy record (or none) and the internal token."""

    record: AuthRecord | None = None
    reads: int = 0

    def auth(self) -> AuthRecord | None:
        self.reads += 1
        return self.record

    def internal_token(self) -> str:
        return INTERNAL

    def store(self, doc: dict | None) -> None:
        version = (self.record.version if self.record else 0) + 1
        config = AuthPolicy.from_config(doc).to_config() if doc else None
        self.record = AuthRecord(version=version, updated_at_ms=0, policy=config) if doc else None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world() -> tuple[Stored, Clock, Guard]:
    stored, clock = Stored(), Clock()
    return stored, clock, Guard(stored, refresh_s=1.0, clock=clock)  # type: ignore[arg-type]


def test_no_stored_policy_means_authentication_is_off(world) -> None:
    _, _, guard = world
    assert guard.check(None, Permission.ADMIN, "a/b") is None
    assert guard.version == 0 and not guard.enabled


def test_the_stored_policy_decides_whatever_the_callers_environment_says(world) -> None:
    stored, clock, guard = world
    stored.store(policy(("ops", OPS, "*", "admin"), ("app", APP, "acme/orders", "produce")))
    clock.now += 1.0
    assert guard.check(OPS, Permission.ADMIN, "x/y").name == "ops"
    assert guard.check(APP, Permission.PRODUCE, "acme/orders").name == "app"
    with pytest.raises(UnauthorizedError):
        guard.check(APP, Permission.CONSUME, "acme/orders")
    with pytest.raises(UnauthenticatedError):
        guard.check(None, Permission.LOOKUP, "acme/orders")


def test_a_revocation_applies_once_the_copy_is_stale(world) -> None:
    stored, clock, guard = world
    stored.store(policy(("app", APP, "acme/orders", "produce")))
    clock.now += 1.0
    assert guard.check(APP, Permission.PRODUCE, "acme/orders") is not None
    reads = stored.reads
    stored.store(policy(("ops", OPS, "*", "admin")))  # app's token revoked
    clock.now += 0.5
    assert guard.check(APP, Permission.PRODUCE, "acme/orders") is not None  # copy still fresh
    assert stored.reads == reads, "a fresh copy is not read again"
    clock.now += 0.5
    with pytest.raises(UnauthenticatedError):
        guard.check(APP, Permission.PRODUCE, "acme/orders")
    assert guard.version == 2


def test_the_internal_token_may_do_anything_and_is_in_no_policy(world) -> None:
    stored, clock, guard = world
    stored.store(policy(("ops", OPS, "*", "admin")))
    clock.now += 1.0
    assert guard.check(INTERNAL, Permission.ADMIN, "any/ns") is INTERNAL_PRINCIPAL
    assert guard.internal_token() == INTERNAL
    assert "raytopics-internal" not in str(stored.record.policy)
    with pytest.raises(UnauthenticatedError):
        guard.check(INTERNAL[:-1], Permission.LOOKUP, "any/ns")


def test_a_policy_stored_after_auth_was_off_is_new_to_a_copy_that_missed_it(ray_cluster) -> None:
    """Versions never repeat across a disable: a process that held policy A, and did not
    look while authentication was off, applies the next policy B instead of keeping A."""
    import uuid

    from storage.catalog import Catalog

    catalog = Catalog(f"test-guard-{uuid.uuid4().hex[:8]}")
    catalog.replace_auth(AuthPolicy.from_config(policy(("a", "token-a" * 3, "t/ns", "admin"))))
    clock = Clock()
    copy = Guard(catalog, clock=clock)
    assert copy.authenticate("token-a" * 3).name == "a"
    catalog.disable_auth()
    assert catalog.auth() is None
    catalog.replace_auth(AuthPolicy.from_config(policy(("b", "token-b" * 3, "t/ns", "admin"))))
    clock.now += 5
    assert copy.authenticate("token-b" * 3).name == "b"
    with pytest.raises(UnauthenticatedError):
        copy.authenticate("token-a" * 3)
