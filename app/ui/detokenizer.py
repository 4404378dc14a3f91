"""Token ids to text pieces as they stream in, for the Text tab's coloured output."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces, one per token, without re-decoding everything.

    It decodes a short window (a few already-shown tokens + the new ones) and emits the text past the window's
    shown part, so tokenizers that drop or merge leading spaces and byte-level tokens that split a UTF-8
    character (decoded as U+FFFD until complete) give the same text as decoding the whole sequence.
    """

    def __init__(self, tokenizer, context_ids: list[int] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context_ids)[-6:]  # a little prompt context for leading-space handling
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """The new text that token_id completes ('' while a multi-byte character is unfinished)."""
        self.ids.append(int(token_id))
        shown = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) > len(shown) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(shown):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream."""
        shown = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(shown):] if len(text) > len(shown) else ""
