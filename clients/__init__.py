"""What applications import."""

from clients.admin import ScalableTopicsAdmin

__all__ = ["ScalableTopicsAdmin"]
