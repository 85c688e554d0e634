"""TF Text's WordPiece learner, as `kbert vocab` runs it: word counts -> a vocabulary.

The learner is tensorflow-text's `tools.wordpiece_vocab.wordpiece_tokenizer_learner_lib`, the
one behind TF Text's BERT vocabulary guide; `kbert.text.vocab_builder` counts the words it
learns from (kbert.Tokenizer's) and writes and checks the vocab.txt. This module holds what
depends on TF Text: the learner's call, and the cut to the size asked.
"""

from __future__ import annotations

from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

from kbert.runtime.errors import KbertError, option
from kbert.text.tokenizer import JOINER, RESERVED_TOKENS


def learn_vocab(word_counts, size: int) -> list[str]:
    """A WordPiece vocabulary of at most `size` entries: reserved tokens, characters, pieces.

    Args:
        word_counts: dict or Counter. {word: count}.
        size: int. Entries at most, reserved tokens included.

    Example:
    >>> vocab = learn_vocab({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 30)
    >>> vocab[:5], vocab[5:8], vocab[15:19], vocab[-2:]
    (['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'], ['d', 'e', 'i'], ['newest', 'low', 'widest', 'lower'], ['##t', '##w'])
    """
    # lower_thresh=1 lets a small corpus reach `size`; on a large one the search for the count
    # threshold that gives `size` entries stops far above it.
    vocab = learner.learn(dict(word_counts), size, RESERVED_TOKENS, lower_thresh=1, joiner=JOINER)
    if len(vocab) <= size:
        return vocab
    # The threshold search can end a little over `size`. Drop the rarest pieces, never a
    # character or its ## form: those are what lets any word be spelled without [UNK].
    chars = {t for t in vocab if len(t) == 1 or (t.startswith(JOINER) and len(t) == len(JOINER) + 1)}
    required = set(RESERVED_TOKENS) | chars
    if len(required) > size:
        raise KbertError(
            f"{option('size', size)} is too small: the text has "
            f"{sum(len(t) == 1 for t in chars)} distinct "
            f"characters, which need {len(required)} entries with the reserved tokens; "
            f"use {option('size', len(required))} or more"
        )
    room = size - len(required)
    kept = []
    for token in vocab:
        if token in required:
            kept.append(token)
        elif room > 0:
            kept.append(token)
            room -= 1
    return kept
