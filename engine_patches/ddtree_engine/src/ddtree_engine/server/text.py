"""Token ids to completion text: incremental decoding with OpenAI stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_INCOMPLETE_UTF8 = "\ufffd"


class CompletionText:
    """Decodes generated ids chunk by chunk and yields only text that is final.

    Text is held back while it ends in an incomplete UTF-8 sequence or could still be the start
    of a stop string; the output is cut before the first stop string (OpenAI excludes it).
    """

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._stops = tuple(s for s in stop_strings if s)
        self._ids: list[int] = []
        self._emitted = 0
        self._final_text: str | None = None

    @property
    def stopped(self) -> bool:
        """True once a stop string was found; later tokens add no text."""
        return self._final_text is not None

    @property
    def text(self) -> str:
        """All text so far (cut at the stop string once one was found)."""
        if self._final_text is not None:
            return self._final_text
        return self._decode()

    def add(self, token_ids: Sequence[int]) -> str:
        """Take newly generated ids; return the text that became final with them."""
        if self.stopped:
            return ""
        self._ids.extend(token_ids)
        text = self._decode()
        cut = self._first_stop(text)
        if cut is not None:
            self._final_text = text[:cut]
            return self._take(cut)
        complete = text.rstrip(_INCOMPLETE_UTF8)
        safe_end = len(complete) - self._stop_prefix_len(complete)
        return self._take(max(self._emitted, safe_end))

    def finish(self) -> str:
        """Return whatever text is still held back (call once generation has ended)."""
        text = self.text
        return self._take(len(text))

    def _take(self, end: int) -> str:
        text = self.text
        delta = text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return delta

    def _decode(self) -> str:
        return self._tokenizer.decode(self._ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string starts with."""
        for n in range(min(len(text), max((len(s) for s in self._stops), default=1) - 1), 0, -1):
            if any(s.startswith(text[-n:]) for s in self._stops):
                return n
        return 0

    def _first_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        return min(hits) if hits else None
