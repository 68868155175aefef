"""What applications import."""

from clients.admin import ScalableTopicsAdmin
from clients.checkpoint_consumer import Checkpoint, CheckpointConsumer
from clients.connection import connect
from clients.http import AdminHttpClient
from clients.message import RECEIVED_SCHEMA, BatchResult, Message, MessageId
from clients.producer import Producer
from clients.queue_consumer import QueueConsumer
from clients.stream_consumer import StreamConsumer
from runtime.redelivery import DeadLetterPolicy, RedeliveryBackoff

__all__ = [
    "RECEIVED_SCHEMA",
    "AdminHttpClient",
    "BatchResult",
    "Checkpoint",
    "CheckpointConsumer",
    "DeadLetterPolicy",
    "Message",
    "MessageId",
    "Producer",
    "QueueConsumer",
    "RedeliveryBackoff",
    "ScalableTopicsAdmin",
    "StreamConsumer",
    "connect",
]
