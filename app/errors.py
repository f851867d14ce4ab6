"""Errors the user can act on: the message says what to do, and no traceback is shown."""

from __future__ import annotations


class NodeError(RuntimeError):
    """A problem with this node's setup or state (model, checkpoints, port, disk)."""
