"""Pure domain logic and wiring: layout DAG, hashing, names, config, errors, connect."""

from runtime.connect import (
    MetadataNotDurableWarning,
    connect,
    disconnect,
    metadata_durability,
)

__all__ = ["MetadataNotDurableWarning", "connect", "disconnect", "metadata_durability"]
