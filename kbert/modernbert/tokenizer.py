"""ModernBERT's tokenizer: the byte-level BPE of a model's `tokenizer.json`, run by Hugging Face's
`tokenizers` library (the code transformers' fast tokenizer runs), so the ids, the special tokens
and the pair template are the model's own.

Example:
>>> tokenizer = BpeTokenizer("tests/fixtures/modernbert-tiny/tokenizer.json")  # doctest: +SKIP
>>> batch = tokenizer.pack(["Hello, world!"], max_length=16)  # doctest: +SKIP
>>> sorted(batch)  # doctest: +SKIP
['input_ids', 'input_mask']
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from kbert.runtime.errors import KbertError, first_line

TOKENIZER_FILE = "tokenizer.json"
# What travels with a ModernBERT model: the tokenizer and what transformers reads beside it.
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json")


def tokenizer_files_in(folder) -> tuple:
    """(tokenizer.json's path, its folder), or one line saying it is missing."""
    path = os.path.join(os.fspath(folder), TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise KbertError(f"{folder}: no {TOKENIZER_FILE}; a ModernBERT's tokenizer is its tokenizer.json: copy it here")
    return path, os.fspath(folder)


class BpeTokenizer:
    """A `tokenizer.json`'s tokenizer, packing texts (and pairs) to `input_ids` and `input_mask`.

    Args:
        tokenizer_file: the model's tokenizer.json.
        pad_token_id: the id padding gets; default: the tokenizer's own padding token's, else 0.
    """

    def __init__(self, tokenizer_file, pad_token_id: int | None = None):
        from tokenizers import Tokenizer

        self.tokenizer_file = os.fspath(tokenizer_file)
        try:
            self._tokenizer = Tokenizer.from_file(self.tokenizer_file)
        except Exception as e:  # the library raises a bare Exception for a malformed file
            raise KbertError(
                f"{self.tokenizer_file}: not a tokenizer.json the tokenizers library reads ({first_line(e)})"
            ) from None
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        if pad_token_id is None:
            pad_token_id = self._tokenizer.token_to_id("[PAD]") or self._tokenizer.token_to_id("<pad>") or 0
        self.pad_token_id = int(pad_token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def tokens_only(self, text: str) -> list:
        """The ids of `text`'s tokens, without the template's special tokens."""
        self._tokenizer.no_truncation()
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def word_pieces(self, words) -> tuple:
        """(the ids of `words`' tokens, without special tokens; each word's first token's index,
        -1 for a word with none), each word tokenized on its own as transformers'
        `is_split_into_words` tokenizes it."""
        self._tokenizer.no_truncation()
        encoding = self._tokenizer.encode(list(words), is_pretokenized=True, add_special_tokens=False)
        first = [-1] * len(words)
        for index, word in enumerate(encoding.word_ids):
            if word is not None and first[word] < 0:
                first[word] = index
        return encoding.ids, first

    def decode(self, ids) -> str:
        """The text of `ids`, special tokens included (one id: its token as text)."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def encode(self, texts, texts_b=None, max_length: int | None = None) -> list:
        """Each text's (or pair's) ids with the special tokens, cut to `max_length` as transformers
        cuts them (longest first); an empty second text packs as none."""
        if max_length is not None:
            self._tokenizer.enable_truncation(max_length, strategy="longest_first")
        else:
            self._tokenizer.no_truncation()
        # An empty second text packs as no second text, as transformers' tokenizer packs it.
        inputs = list(texts) if texts_b is None else [(a, b) if b else a for a, b in zip(texts, texts_b)]
        return [encoding.ids for encoding in self._tokenizer.encode_batch(inputs)]

    def pack(self, texts, texts_b=None, max_length: int | None = None) -> dict:
        """int32 `input_ids` and `input_mask` [len(texts), longest], padded at the end."""
        rows = self.encode(texts, texts_b, max_length)
        width = max((len(row) for row in rows), default=0)
        ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int32)
        mask = np.zeros((len(rows), width), dtype=np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return {"input_ids": ids, "input_mask": mask}


def copy_tokenizer_files(model, folder: str):
    """The tokenizer.json (and tokenizer_config.json, special_tokens_map.json where the model has
    them) into `folder`."""
    source = getattr(model, "tokenizer_folder", None) or (
        os.path.dirname(model.tokenizer_file) if model.tokenizer_file else None
    )
    if source is None:
        raise KbertError("the model declares no tokenizer.json; build it on a converted or loaded ModernBERT")
    for name in TOKENIZER_FILES:
        path = os.path.join(source, name)
        if os.path.isfile(path):
            shutil.copyfile(path, os.path.join(folder, name))
