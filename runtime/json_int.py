"""Integers as JSON carries them: one number type, so ``4.0`` is the integer 4.

JSON Schema agrees (``{"type": "integer"}`` accepts ``4.0``), so a client
generated from the gateway's OpenAPI document may send it. Strict pydantic
models would refuse it; fields typed ``JsonInt`` take an integral float as its
integer and still refuse ``4.5``, ``"4"`` and ``true``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]


def json_int(**constraints: Any) -> Any:
    """``JsonInt`` carrying its own ``constraints`` (``ge``, ``gt``, ``le``), for a field
    that may also be ``None``: set before the validator, they stay JSON Schema keywords
    (``minimum``...) in the generated schema instead of being lost."""
    return Annotated[int, Field(**constraints), BeforeValidator(_integral)]
