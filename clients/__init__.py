"""What applications import.

Each name is imported when first used (PEP 562): ``from clients import AdminHttpClient``
(or ``from clients.http import ...``) in a process outside Ray imports no Ray, as the
REST client needs none; the Ray clients import it when they are used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from clients._install import ray_required

if TYPE_CHECKING:  # what the names are, for type checkers and IDEs
    from clients.admin import ScalableTopicsAdmin  # noqa: F401
    from clients.checkpoint_consumer import Checkpoint, CheckpointConsumer  # noqa: F401
    from clients.connection import connect  # noqa: F401
    from clients.http import AdminHttpClient  # noqa: F401
    from clients.message import RECEIVED_SCHEMA, BatchResult, Message, MessageId  # noqa: F401
    from clients.namespace_consumer import NamespaceConsumer  # noqa: F401
    from clients.producer import Producer  # noqa: F401
    from clients.queue_consumer import QueueConsumer  # noqa: F401
    from clients.stream_consumer import StreamConsumer  # noqa: F401
    from runtime.redelivery import DeadLetterPolicy, RedeliveryBackoff  # noqa: F401

# Each public name and the module that defines it.
_EXPORTS = {
    "RECEIVED_SCHEMA": "clients.message",
    "AdminHttpClient": "clients.http",
    "BatchResult": "clients.message",
    "Checkpoint": "clients.checkpoint_consumer",
    "CheckpointConsumer": "clients.checkpoint_consumer",
    "DeadLetterPolicy": "runtime.redelivery",
    "Message": "clients.message",
    "MessageId": "clients.message",
    "NamespaceConsumer": "clients.namespace_consumer",
    "Producer": "clients.producer",
    "QueueConsumer": "clients.queue_consumer",
    "RedeliveryBackoff": "runtime.redelivery",
    "ScalableTopicsAdmin": "clients.admin",
    "StreamConsumer": "clients.stream_consumer",
    "connect": "clients.connection",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    with ray_required(f"clients.{name}"):
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
