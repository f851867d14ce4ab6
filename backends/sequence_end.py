"""Where one sampled sequence ends, the same way in every generator: at an end-of-generation
token (kept, as llama.cpp keeps it), at the token whose text completes a stop string, or at the
length limit, whichever comes first.

Stop strings are looked for in each token's new text plus the short tail of earlier text that a
stop string could straddle, so a check costs the same at token 5 as at token 500. Text is `str`
or `bytes` (llama.cpp hands out byte pieces that may split a UTF-8 character); stop strings come
in the same type."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import AnyStr, Generic

from .base import FinishReason


class SequenceEnd(Generic[AnyStr]):
    def __init__(
        self,
        max_new_tokens: int,
        stops: Sequence[AnyStr],
        is_end_token: Callable[[int], bool],
        text_of: Callable[[int], AnyStr],
    ) -> None:
        """`text_of(token)`: the text the token adds to the sequence (asked only while stop
        strings are being looked for, once per token, in order)."""
        self._max_new_tokens = max_new_tokens
        self._stops = tuple(stops)
        self._is_end_token = is_end_token
        self._text_of = text_of
        # A stop string ending in new text starts at most len(stop) - 1 characters before it.
        self._keep = max((len(s) for s in self._stops), default=1) - 1
        self._tail: AnyStr | None = None
        self.tokens = 0  # tokens the sequence keeps so far
        self.reason: FinishReason | None = None

    @property
    def finish_reason(self) -> FinishReason:
        # No reason only when no token was asked for (max_new_tokens = 0): that is the length limit.
        return self.reason or "length"

    def add(self, token: int) -> bool:
        """Count the next sampled token; true once the sequence has ended (with it or before)."""
        if self.reason is not None:
            return True
        self.tokens += 1
        if self._is_end_token(token):
            self.reason = "eos"
        elif self._stops and self._completes_stop(self._text_of(token)):
            self.reason = "stop"
        elif self.tokens >= self._max_new_tokens:
            self.reason = "length"
        return self.reason is not None

    def abandon(self) -> None:
        """Generation was stopped on request before this sequence ended."""
        if self.reason is None:
            self.reason = "abandoned"

    def _completes_stop(self, new_text: AnyStr) -> bool:
        window = new_text if self._tail is None else self._tail + new_text
        self._tail = window[max(0, len(window) - self._keep):]
        return any(stop in window for stop in self._stops)
