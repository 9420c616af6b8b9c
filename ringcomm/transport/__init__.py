"""Transports: how bytes move between two ranks. Algorithms see only ``base.Transport``."""
from .base import DoneRequest, Request, Transport

__all__ = ["Transport", "Request", "DoneRequest"]
