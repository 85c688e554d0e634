"""kbert.runtime.records: TFRecord frames and tf.train.Example's wire format, against TensorFlow's and
protobuf's own readers and writers."""

import numpy as np
import pytest

from kbert.runtime.records import decode_varint, encode_varint, parse_example, read_frames, tfrecord_frames


def test_varints_are_protobufs():
    from google.protobuf.internal.decoder import _DecodeVarint  # protobuf's own codec
    from google.protobuf.internal.encoder import _VarintBytes

    for value in [0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1, 2**63 - 1, 2**64 - 1]:
        assert encode_varint(value) == _VarintBytes(value)
        data = b"\x07" + _VarintBytes(value)
        assert decode_varint(data, 1) == _DecodeVarint(data, 1) == (value, len(data))


def test_frames_are_tensorflows(tmp_path):
    import tensorflow as tf

    records = [b"", b"first", bytes(range(256)) * 40]
    path = tmp_path / "x.tfrecord"
    path.write_bytes(tfrecord_frames(records)[0])
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == records
    # Small chunks: records that straddle the reads are put together again.
    assert [data for _, data in read_frames(path, chunk_size=16)] == records


def test_what_is_not_an_example_is_a_value_error():
    for data in [b"\x0f", b"\x80", b"\x0a\xff\xff\xff\xff\x0f"]:
        with pytest.raises(ValueError, match="not a tf.train.Example"):
            parse_example(data)


def test_unpacked_and_negative_values_decode_as_protobuf_does():
    from google.protobuf.internal.encoder import _VarintBytes  # protobuf's own encoder, for the wire bytes

    # Int64List{value: -3, value: 300} unpacked (wire type 0), FloatList{1.5} unpacked (wire type 5)
    ints = b"\x08" + _VarintBytes((1 << 64) - 3) + b"\x08" + _VarintBytes(300)
    floats = b"\x0d" + np.float32(1.5).tobytes()

    def entry(key, feature):
        body = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(feature)]) + feature
        return b"\x0a" + bytes([len(body)]) + body

    features = entry(b"a", b"\x1a" + bytes([len(ints)]) + ints) + entry(b"b", b"\x12\x05" + floats)
    features += entry(b"c", b"\x0a\x04\x0a\x02hi")
    raw = b"\x0a" + bytes([len(features)]) + features
    import tensorflow as tf

    theirs = tf.train.Example.FromString(raw).features.feature
    example = parse_example(raw)
    assert example["a"].tolist() == list(theirs["a"].int64_list.value) == [-3, 300]
    assert example["b"].tolist() == list(theirs["b"].float_list.value) == [1.5]
    assert example["c"] == list(theirs["c"].bytes_list.value) == [b"hi"]
