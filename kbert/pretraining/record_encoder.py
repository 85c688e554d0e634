"""Pretraining records as bytes: their features, and tf.train.Example serialized by hand.

The original builds a `tf.train.Example` per instance and writes it with a TFRecordWriter.
Here a token is held as the protobuf bytes of its id, so a record's bytes are assembled with a
few joins of precomputed pieces (`ExampleBytes`), and `kbert.runtime.records.tfrecord_frames` frames them
as a TFRecord file holds them. Neither needs TensorFlow, whose start-up alone was a sixth of
create-data's time on the Debian corpus; the tests decode the records with the original
run_pretraining.py's reader.
"""

from __future__ import annotations

from kbert.config import ENCODER_INPUTS
from kbert.runtime.records import encode_varint

# The features of create_pretraining_data.py's records: the pretrainer's inputs, then its labels.
INPUT_KEYS = (*ENCODER_INPUTS, "masked_lm_positions")
LABEL_KEYS = ("masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
FEATURES = INPUT_KEYS + LABEL_KEYS
# Masked-LM-only records (a ModernBERT's: no segments, no next-sentence task) hold just these;
# a file's features say which objective it was made for.
MLM_INPUT_KEYS = ("input_ids", "input_mask", "masked_lm_positions")
MLM_LABEL_KEYS = ("masked_lm_ids", "masked_lm_weights")

# An Example is Features{map<string, Feature>}; a map entry is {1: key, 2: Feature}; a Feature
# holds {2: FloatList | 3: Int64List}; each list is {1: packed values}. Every field here is
# length-delimited (wire type 2), so the tags are (field << 3) | 2.


class ExampleBytes:
    """Serialized tf.train.Example records for one (max_seq_length, max_predictions_per_seq).

    Values only vary in a few places, so the fixed parts (tags, lengths, padding, the
    input_mask / weights / label entries) are built once and a record is one bytes.join.

    Example:
    >>> from kbert.runtime.records import parse_example
    >>> record = ExampleBytes(8, 2, 100).record([b"\\x65", b"\\x07", b"\\x66"], 1, [1], [b"\\x09"], True)
    >>> example = parse_example(record)
    >>> example["input_ids"].tolist(), example["masked_lm_weights"].tolist()
    ([101, 7, 102, 0, 0, 0, 0, 0], [1.0, 0.0])
    """

    def __init__(self, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int):
        self.seq, self.preds = max_seq_length, max_predictions_per_seq
        self.varint = [encode_varint(v) for v in range(max(vocab_size, max_seq_length) + 1)]
        self.zeros = [b"\x00" * n for n in range(4 * max(max_seq_length, max_predictions_per_seq) + 1)]
        self.ones = [b"\x01" * n for n in range(max_seq_length + 1)]
        self._prefixes = {}
        seq, preds = max_seq_length, max_predictions_per_seq
        self.input_mask = [self.entry("input_mask", self.ones[n] + self.zeros[seq - n]) for n in range(seq + 1)]
        one = b"\x00\x00\x80\x3f"  # 1.0 as a little-endian float32
        self.weights = [
            self.entry("masked_lm_weights", one * k + self.zeros[4 * (preds - k)], float_list=True)
            for k in range(preds + 1)
        ]
        self.labels = [self.entry("next_sentence_labels", b"\x00"), self.entry("next_sentence_labels", b"\x01")]
        # The prefixes of the entries whose size varies, indexed by the size of their values.
        widest = len(self.varint[-1])
        self.ids_prefix = [self.prefix("input_ids", size) for size in range(seq * widest + 1)]
        self.positions_prefix = [self.prefix("masked_lm_positions", size) for size in range(preds * widest + 1)]
        self.labels_prefix = [self.prefix("masked_lm_ids", size) for size in range(preds * widest + 1)]
        self.segment_prefix = self.prefix("segment_ids", seq)

    def _length(self, n: int) -> bytes:
        return self.varint[n] if n < len(self.varint) else encode_varint(n)

    def prefix(self, name: str, size: int, float_list: bool = False) -> bytes:
        """Everything of a map entry before its packed values, for `size` bytes of values."""
        key = (name, size, float_list)
        if key not in self._prefixes:
            values = b"\x0a" + self._length(size)
            feature = (b"\x12" if float_list else b"\x1a") + self._length(len(values) + size) + values
            name_field = b"\x0a" + self._length(len(name)) + name.encode()
            entry = name_field + b"\x12" + self._length(len(feature) + size) + feature
            self._prefixes[key] = b"\x0a" + self._length(len(entry) + size) + entry
        return self._prefixes[key]

    def entry(self, name: str, payload: bytes, float_list: bool = False) -> bytes:
        return self.prefix(name, len(payload), float_list) + payload

    def record(self, tokens: list, len_a: int, positions: list, labels: list, is_random_next: bool) -> bytes:
        """One Example from tokens held as their ids' varint bytes (`self.varint[id]`).

        Args:
            tokens: list of bytes. [CLS] A [SEP] B [SEP], after masking.
            len_a: int. Tokens in A.
            positions: list of int. Masked positions, ascending.
            labels: list of bytes. The original tokens at `positions`.
            is_random_next: bool. The next_sentence_label.
        """
        n = len(tokens)
        segments = (self.segment_prefix, self.zeros[len_a + 2], self.ones[n - len_a - 2], self.zeros[self.seq - n])
        return self._example(tokens, positions, labels, segments, self.labels[is_random_next])

    def mlm_record(self, tokens: list, positions: list, labels: list) -> bytes:
        """One masked-LM-only Example (`MLM_INPUT_KEYS + MLM_LABEL_KEYS`): no segment_ids and no
        next_sentence_labels, whose absence is what tells these records from BERT's.

        Args:
            tokens: list of bytes. The template's specials around one piece of text, after masking.
            positions: list of int. Masked positions, ascending.
            labels: list of bytes. The original tokens at `positions`.

        Example:
        >>> from kbert.runtime.records import parse_example
        >>> example = parse_example(ExampleBytes(6, 2, 100).mlm_record([b"\\x01", b"\\x04", b"\\x02"], [1], [b"\\x09"]))
        >>> sorted(example) == sorted(MLM_INPUT_KEYS + MLM_LABEL_KEYS), example["input_ids"].tolist()
        (True, [1, 4, 2, 0, 0, 0])
        """
        return self._example(tokens, positions, labels, (), b"")

    def _example(self, tokens: list, positions: list, labels: list, segments: tuple, next_sentence: bytes) -> bytes:
        """The Example's bytes, its features in create_pretraining_data.py's order; `segments` and
        `next_sentence` are the segment_ids and next_sentence_labels entries (empty: left out)."""
        n, k, zeros = len(tokens), len(positions), self.zeros
        ids = b"".join(tokens)
        pos = b"".join(map(self.varint.__getitem__, positions))
        lab = b"".join(labels)
        ids_pad, preds_pad = self.seq - n, self.preds - k  # padding: one 0x00 byte per zero
        features = b"".join(
            (
                self.ids_prefix[len(ids) + ids_pad],
                ids,
                zeros[ids_pad],
                self.input_mask[n],
                *segments,
                self.positions_prefix[len(pos) + preds_pad],
                pos,
                zeros[preds_pad],
                self.labels_prefix[len(lab) + preds_pad],
                lab,
                zeros[preds_pad],
                self.weights[k],
                next_sentence,
            )
        )
        return b"\x0a" + self._length(len(features)) + features
