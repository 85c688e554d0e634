"""Fine-tuning features: examples read by `kbert.finetuning.readers` -> model inputs.

Features are google-research/bert's: `encode_texts` builds exactly what run_classifier.py's
`convert_single_example` builds, `encode_tagged` the same layout with each word's tag on its
first WordPiece, and `encode_choices` one sentence pair per (context, ending).
"""

from __future__ import annotations

import numpy as np

from kbert.errors import KbertError

_MAX_LISTED = 10  # tags named in an error message


def _special_ids(tokenizer, *tokens) -> list[int]:
    missing = [t for t in tokens if t not in tokenizer.vocab]
    if missing:
        raise KbertError(f"the vocab has no {', '.join(missing)}; use the vocab.txt the model was trained with")
    return [tokenizer.vocab[t] for t in tokens]


def _features(n: int, max_seq_length: int) -> dict[str, np.ndarray]:
    return {name: np.zeros((n, max_seq_length), np.int32) for name in ("input_ids", "input_mask", "segment_ids")}


def encode_texts(tokenizer, texts, texts_b, max_seq_length: int) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for single texts or pairs, exactly as run_classifier.py builds them.

    "[CLS] a [SEP]" or "[CLS] a [SEP] b [SEP]", segment 0 for the first part and 1 for
    "b [SEP]", mask 1 on real tokens, zero padding. A pair that does not fit loses tokens
    from the end of its longer text, one at a time (`_truncate_seq_pair`); a single text
    keeps its first max_seq_length - 2 tokens. An empty second text (or one with no tokens,
    or none left after cutting at a tiny max_seq_length) makes a single-text example, as in
    the original.

    Args:
        tokenizer: kbert.Tokenizer.
        texts: list of str. The first texts.
        texts_b: list of str, or None. The second texts of pairs ("" or None for none).
        max_seq_length: int. Tokens per example, special tokens included: at least 2, or 3
            with `texts_b`.

    Returns:
        (features, truncated): a dict of int32 [N, max_seq_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many examples lost tokens.

    Example:
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt")
    >>> features, truncated = encode_texts(tokenizer, ["Is it?"], ["Yes."], 8)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0])
    ['[CLS]', 'is', 'it', '?', '[SEP]', 'yes', '.', '[SEP]']
    >>> features["segment_ids"][0].tolist(), truncated
    ([0, 0, 0, 0, 0, 1, 1, 1], 0)
    >>> features, truncated = encode_texts(tokenizer, ["Is it?"], None, 4)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0]), truncated
    (['[CLS]', 'is', 'it', '[SEP]'], 1)
    """
    n = len(texts)
    if texts_b is not None and len(texts_b) != n:
        raise ValueError(f"{n} texts but {len(texts_b)} texts_b")
    least = 2 if texts_b is None else 3
    if max_seq_length < least:
        raise KbertError(
            f"max sequence length {max_seq_length} is too short; it must be at "
            f"least {least} ([CLS] and [SEP]{', [SEP]' if least == 3 else ''})"
        )
    cls_id, sep_id = _special_ids(tokenizer, "[CLS]", "[SEP]")
    vocab = tokenizer.vocab
    features = _features(n, max_seq_length)
    input_ids, input_mask, segment_ids = (features[k] for k in ("input_ids", "input_mask", "segment_ids"))
    truncated = 0
    for i in range(n):
        tokens_a = tokenizer.tokenize(texts[i])
        text_b = texts_b[i] if texts_b is not None else None
        tokens_b = tokenizer.tokenize(text_b) if text_b else None
        if tokens_b:
            # _truncate_seq_pair: pop from the longer list (b on ties) until both fit.
            room = max_seq_length - 3
            len_a, len_b = len(tokens_a), len(tokens_b)
            if len_a + len_b > room:
                truncated += 1
                while len_a + len_b > room:
                    if len_a > len_b:
                        len_a -= 1
                    else:
                        len_b -= 1
            ids = [cls_id] + [vocab[t] for t in tokens_a[:len_a]] + [sep_id]
            if len_b:  # as the original, which asks `if tokens_b` again after cutting
                ids += [vocab[t] for t in tokens_b[:len_b]] + [sep_id]
                segment_ids[i, len_a + 2 : len(ids)] = 1
        else:
            if len(tokens_a) > max_seq_length - 2:
                truncated += 1
                tokens_a = tokens_a[: max_seq_length - 2]
            ids = [cls_id] + [vocab[t] for t in tokens_a] + [sep_id]
        input_ids[i, : len(ids)] = ids
        input_mask[i, : len(ids)] = 1
    return features, truncated


def encode_tagged(tokenizer, words, tags, label_ids: dict[str, int], max_seq_length: int):
    """Model inputs and per-token labels for tagging, each word's tag on its first WordPiece.

    "[CLS] pieces [SEP]" with segment 0, mask 1 on real tokens, zero padding. A word that
    tokenizes to nothing (only control characters, say) becomes "[UNK]", so every word has a
    first piece. A sentence with more than max_seq_length - 2 pieces keeps its first
    max_seq_length - 2; words whose first piece is cut off get position -1 and no label.

    Args:
        tokenizer: kbert.Tokenizer.
        words: list of list of str. The words of each sentence.
        tags: list of list of str, or None. One tag per word; None for prediction.
        label_ids: dict of str to int. The tags the model was trained on, and their ids.
        max_seq_length: int. Tokens per example, [CLS] and [SEP] included (at least 3).

    Returns:
        (features, labels, word_positions, truncated): features as `encode_texts` returns
        them; labels, int32 [N, max_seq_length], the tag id on each word's first piece and
        -1 everywhere else (all -1 when `tags` is None); per sentence, each word's first
        piece position (-1 for a cut word); and how many sentences lost pieces.

    Raises:
        KbertError: a tag is not in `label_ids`.

    Example:
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt")
    >>> features, labels, positions, truncated = encode_tagged(
    ...     tokenizer, [["Peter", "is", "unaffable"]], [["B-PER", "O", "O"]], {"O": 0, "B-PER": 1}, 8)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0])
    ['[CLS]', 'peter', 'is', 'una', '##ffa', '##ble', '[SEP]', '[PAD]']
    >>> labels[0].tolist(), positions, truncated
    ([-1, 1, 0, 0, -1, -1, -1, -1], [[1, 2, 3]], 0)
    """
    n = len(words)
    if tags is not None:
        if len(tags) != n:
            raise ValueError(f"{n} sentences but {len(tags)} tag lists")
        unseen = {t for sentence in tags for t in sentence if t not in label_ids}
        if unseen:
            listed = sorted(unseen)
            more = f" and {len(listed) - _MAX_LISTED} more" if len(listed) > _MAX_LISTED else ""
            known = ", ".join(sorted(label_ids)[:_MAX_LISTED])
            raise KbertError(
                f"tags {', '.join(listed[:_MAX_LISTED])}{more} were not in the "
                f"training data (the model knows {known}"
                f"{', ...' if len(label_ids) > _MAX_LISTED else ''}); evaluate "
                "with data tagged with the training set's tags"
            )
    if max_seq_length < 3:
        raise KbertError(
            f"max sequence length {max_seq_length} is too short for tagging; it "
            "must be at least 3 ([CLS], a word, [SEP])"
        )
    cls_id, sep_id, unk_id = _special_ids(tokenizer, "[CLS]", "[SEP]", "[UNK]")
    vocab = tokenizer.vocab
    room = max_seq_length - 2
    features = _features(n, max_seq_length)
    input_ids, input_mask = features["input_ids"], features["input_mask"]
    labels = np.full((n, max_seq_length), -1, np.int32)
    all_positions, truncated = [], 0
    for i, sentence in enumerate(words):
        if tags is not None and len(tags[i]) != len(sentence):
            raise ValueError(f"sentence {i} has {len(sentence)} words but {len(tags[i])} tags")
        ids, positions = [cls_id], []
        for word in sentence:
            positions.append(len(ids) if len(ids) <= room else -1)
            ids.extend([vocab[t] for t in tokenizer.tokenize(word)] or [unk_id])
        if len(ids) > room + 1:
            truncated += 1
            del ids[room + 1 :]
        ids.append(sep_id)
        input_ids[i, : len(ids)] = ids
        input_mask[i, : len(ids)] = 1
        if tags is not None:
            for position, tag in zip(positions, tags[i]):
                if position >= 0:
                    labels[i, position] = label_ids[tag]
        all_positions.append(positions)
    return features, labels, all_positions, truncated


def encode_choices(tokenizer, contexts, endings, max_seq_length: int) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for multiple choice: each (context, ending) pair packed as `encode_texts`
    packs a sentence pair, as the BERT paper fine-tuned on SWAG.

    Args:
        tokenizer: kbert.Tokenizer.
        contexts: list of str. One context per question.
        endings: list of list of str. The endings of each question, the same number for all.
        max_seq_length: int. Tokens per (context, ending) pair, special tokens included.

    Returns:
        (features, truncated): int32 [N, choices, max_seq_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many pairs lost tokens.

    Example:
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt")
    >>> features, truncated = encode_choices(tokenizer, ["A man sits."], [["He smiles.", "He flies."]], 10)
    >>> features["input_ids"].shape, truncated
    ((1, 2, 10), 0)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0, 1])
    ['[CLS]', 'a', 'man', 'sits', '.', '[SEP]', 'he', 'flies', '.', '[SEP]']
    """
    n = len(contexts)
    choices = len(endings[0]) if endings else 0
    if any(len(row) != choices for row in endings):
        raise KbertError("every question needs the same number of endings")
    flat, truncated = encode_texts(
        tokenizer, [c for c in contexts for _ in range(choices)], [e for row in endings for e in row], max_seq_length
    )
    return {k: v.reshape(n, choices, max_seq_length) for k, v in flat.items()}, truncated
