"""``admin_operation``: the admin service's methods check their caller as the Admin API
table says (``runtime.admin_api``), in one place.

Each method of the service is an ``Operation`` of the same name. Before the method
runs, the caller's credential is authenticated (401), the argument that names what
the operation acts on is parsed (400), and the operation's permission is required on
that namespace (403), in that order, so a refused call reads and changes nothing.
The method receives the parsed name (``TopicName``, ``SegmentName``, or the checked
``tenant/namespace``) in place of the string it was called with; however the caller
passed it (by position or by keyword), it is the checked one the method gets.

Then every argument is checked against the type its parameter declares (with the
constraints an ``Annotated`` parameter adds), strictly, by pydantic: the method's
signature is its operation's typed parameters, so a wrong one is refused (400) naming
the parameter, before the method reads or changes anything.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import ConfigDict, ValidationError, validate_call

from actors.admin.auth import EVERY_NAMESPACE
from actors.guard import Guard
from runtime.admin_api import Operation, Scope, operation
from runtime.errors import InvalidArgumentError
from runtime.names import SegmentName, TopicName, parse_namespace

Method = TypeVar("Method", bound=Callable[..., Awaitable[Any]])

# An argument is checked against its parameter's annotation as it is: no "3" for 3, no
# True for 1 (a caller that lies gets a 400, not a coerced value).
_STRICT = ConfigDict(strict=True, arbitrary_types_allowed=True)


def admin_operation(method: Method) -> Method:
    """Check the caller of ``method`` (the operation of its name) before it runs; the
    instance provides the cluster's policy as ``_guard``."""
    op = operation(method.__name__)
    signature = inspect.signature(method)
    target = _target_parameter(op, signature)
    typed = _typed_arguments(method, signature)

    @functools.wraps(method)
    async def checked(self: Any, *args: Any, credential: str | None = None, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(self, *args, credential=credential, **kwargs)
        except TypeError as err:
            raise InvalidArgumentError(f"{op.name}: {err}") from None
        named = bound.arguments.get(target) if target else None
        checked_target = permit(self._guard, op, credential, named)
        if target:
            bound.arguments[target] = checked_target
        try:
            args, kwargs = typed(**bound.arguments)
        except ValidationError as err:
            raise InvalidArgumentError(f"{op.name}: {_described(err)}") from None
        return await method(*args, **kwargs)

    checked.admin_operation = op  # type: ignore[attr-defined]
    return checked  # type: ignore[return-value]


def _typed_arguments(
    method: Callable[..., Any], signature: inspect.Signature
) -> Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]:
    """A check of ``method``'s arguments against its annotations that gives them back
    checked: a stand-in of the same signature, so only the arguments are checked,
    never what the method raises."""
    hints = typing.get_type_hints(method, include_extras=True)
    parameters = [
        p.replace(annotation=hints.get(name, Any)) for name, p in signature.parameters.items()
    ]

    def stand_in(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, kwargs

    stand_in.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=inspect.Signature.empty
    )
    stand_in.__annotations__ = {p.name: p.annotation for p in parameters}
    return validate_call(config=_STRICT)(stand_in)


def _described(err: ValidationError) -> str:
    """Each refused argument by name, with what it should have been."""
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in err.errors()
    )


def permit(guard: Guard, op: Operation, credential: str | None, target: Any) -> Any:
    """Authenticate, parse ``target`` per the operation's scope, require its permission;
    the parsed target (``None`` for an operation on the cluster or the caller)."""
    guard.authenticate(credential)
    if op.scope is Scope.CALLER:
        return None
    if op.scope is Scope.CLUSTER:
        assert op.permission is not None
        guard.check(credential, op.permission, EVERY_NAMESPACE)
        return None
    parsed, namespace = _parsed(op.scope, target)
    assert op.permission is not None
    guard.check(credential, op.permission, namespace)
    return parsed


def _parsed(scope: Scope, target: Any) -> tuple[Any, str]:
    """The target as its type, and the namespace (``tenant/ns``) it lies in."""
    if scope is Scope.TOPIC:
        name = TopicName.parse(target)
        return name, name.namespace_path
    if scope is Scope.SEGMENT:
        segment = SegmentName.parse(target)
        return segment, segment.topic.namespace_path
    parse_namespace(target)
    return target, target


def _target_parameter(op: Operation, signature: inspect.Signature) -> str | None:
    """The parameter naming what ``op`` acts on: the first after ``self``."""
    if op.scope in (Scope.CALLER, Scope.CLUSTER):
        return None
    names = list(signature.parameters)
    if len(names) < 2:
        raise TypeError(f"{op.name} acts on a {op.scope.value} but takes no argument naming it")
    return names[1]


def is_admin_operation(method: Any) -> bool:
    return isinstance(getattr(method, "admin_operation", None), Operation)


__all__ = ["admin_operation", "is_admin_operation", "permit"]
