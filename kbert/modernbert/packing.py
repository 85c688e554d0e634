"""ModernBERT's packer: texts, pairs and long documents in windows -> `input_ids` and `input_mask`
[rows, sequence_length], the `Packer` interface fine-tuning and `embed` read (kbert.text.packing),
with the tokenizer.json's own template (`[CLS] a [SEP]`, `[CLS] a [SEP] b [SEP]`) and truncation
(longest first, as transformers cuts a pair). ModernBERT has no segment ids.
"""

from __future__ import annotations

import numpy as np

from kbert.modernbert.tokenizer import BpeTokenizer
from kbert.runtime.errors import KbertError
from kbert.text.packing import Rows, window_rows


class BpePacker:
    """A ModernBERT's `Packer`.

    Args:
        tokenizer_file: its tokenizer.json.
        pad_token_id: its config's.
        sequence_length: every row's length.
    """

    do_lower_case = False

    def __init__(self, tokenizer_file, pad_token_id: int, sequence_length: int):
        if sequence_length < 3:
            raise KbertError(f"sequence length {sequence_length}: a ModernBERT row needs 3 or more tokens")
        self.tokenizer = BpeTokenizer(tokenizer_file, pad_token_id)
        self.vocab_file = self.tokenizer.tokenizer_file
        self.sequence_length = int(sequence_length)
        self.cls_id = self.tokenizer.encode([""])[0][0]  # the template's first token
        self.sep_id = self.tokenizer.encode([""])[0][-1]

    def _fill(self, rows) -> dict:
        ids = np.full((len(rows), self.sequence_length), self.tokenizer.pad_token_id, np.int32)
        mask = np.zeros((len(rows), self.sequence_length), np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return {"input_ids": ids, "input_mask": mask}

    def encode(self, texts, texts_b=None):
        """Texts (and second texts, "" or None for none) -> (features, truncated: bool [rows])."""
        texts_b = None if texts_b is None else [b or "" for b in texts_b]
        whole = self.tokenizer.encode(texts, texts_b)
        cut = self.tokenizer.encode(texts, texts_b, max_length=self.sequence_length)
        truncated = np.array([len(a) != len(b) for a, b in zip(whole, cut)], bool)
        return self._fill(cut), truncated

    def _windows(self, documents, stride: int):
        rows, starts = window_rows(
            documents, self.sequence_length - 2, stride, lambda tokens: [self.cls_id, *tokens, self.sep_id]
        )
        return self._fill(rows), Rows.from_lists(starts)

    def encode_windows(self, texts, stride: int):
        """Documents -> (the features of each window, each document's windows' starts as `Rows`):
        windows of sequence_length - 2 tokens, `stride` tokens apart, each packed as a text."""
        return self._windows([self.tokenizer.tokens_only(text) for text in texts], stride)

    def encode_words(self, sentences):
        """Sentences of words -> (features, each word's first token's position ([CLS] is 0, -1 for
        a word cut off) as `Rows`, truncated: bool [sentences])."""
        room = self.sequence_length - 2
        rows, positions, truncated = [], [], np.zeros(len(sentences), bool)
        for i, words in enumerate(sentences):
            pieces, first = self.tokenizer.word_pieces(words)
            truncated[i] = len(pieces) > room
            rows.append([self.cls_id, *pieces[:room], self.sep_id])
            positions.append([f + 1 if 0 <= f < room else -1 for f in first])
        return self._fill(rows), Rows.from_lists(positions), truncated

    def encode_word_windows(self, sentences, stride: int):
        """Documents of words -> (the features of each window, the windows' starts, each word's
        first token counted from 0 in its document as `Rows`)."""
        pieces = [self.tokenizer.word_pieces(words) for words in sentences]
        features, starts = self._windows([ids for ids, _ in pieces], stride)
        return features, starts, Rows.from_lists([first for _, first in pieces])
