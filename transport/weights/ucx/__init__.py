"""Weights over UCX: a trainer serves byte ranges of its staged versions, receivers pull
them (and relay them on), each over endpoints made from UCX worker addresses."""

from .node import TransferError, UcxNode
from .strategy import UcxPublisher, UcxReceiver

__all__ = ["TransferError", "UcxNode", "UcxPublisher", "UcxReceiver"]
