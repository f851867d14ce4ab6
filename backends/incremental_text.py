"""The text each new token adds, for tokenizers that decode only whole lists of ids (Hugging
Face's, which the torch and MLX generators use).

Decoding token by token is wrong where a character spans several tokens (byte-level BPE) or a
token's leading space depends on its neighbour, and decoding the whole sequence after every
token costs time quadratic in its length. Like inference servers do, this decodes a short
window: from the last token whose text was complete, with one token of context before it."""

from __future__ import annotations

from collections.abc import Callable

INCOMPLETE = "\ufffd"  # what a decoder writes for a character whose remaining bytes are still to come


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._context = 0  # first id of the window (context for the ids after `_read`)
        self._read = 0  # ids before this have had their text handed out

    def add(self, token: int) -> str:
        """The new text `token` completes (possibly empty until a character is whole)."""
        self._ids.append(token)
        before = self._decode(self._ids[self._context : self._read])
        after = self._decode(self._ids[self._context :])
        if len(after) <= len(before) or after.endswith(INCOMPLETE):
            return ""
        self._context, self._read = self._read, len(self._ids)
        return after[len(before) :]
