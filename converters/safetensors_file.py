"""Safetensors files, read and written with numpy (no torch, no safetensors library).

The format (github.com/huggingface/safetensors): an 8-byte little-endian header length N, N
bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian tensor bytes, offsets counted from the end of the header. Every
header entry is checked against the file's size, so a truncated or foreign file (a PyTorch
pickle renamed, say) fails with one line before numpy reads anything.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from kbert.runtime.errors import KbertError

# How to turn a model in another format into safetensors, for the errors that refuse one.
RESAVE = (
    "save it as safetensors first: in Python with transformers, "
    "BertForPreTraining.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True) "
    "(BertModel instead if it has no cls.* heads)"
)

_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}
FLOAT_DTYPES = ("F32", "F16", "BF16")  # what a weight may be stored as; read as float32
_MAX_HEADER = 100 * 2**20  # the safetensors library's own limit


class SafetensorsFile:
    """One .safetensors file: its header at once, each tensor read on demand as float32.

    Args:
        path: str. The file.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
    >>> write_safetensors(path, {"w": np.arange(6, dtype="float32").reshape(2, 3)})
    >>> f = SafetensorsFile(path)
    >>> f.shapes, f.dtypes, f.read("w")[1].tolist()
    ({'w': (2, 3)}, {'w': 'F32'}, [3.0, 4.0, 5.0])
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        entries, self.metadata, self.data_start = _read_header(self.path)
        self.shapes = {name: tuple(e["shape"]) for name, e in entries.items()}
        self.dtypes = {name: e["dtype"] for name, e in entries.items()}
        self._offsets = {name: e["data_offsets"] for name, e in entries.items()}

    def read(self, name: str) -> np.ndarray:
        dtype, shape = self.dtypes[name], self.shapes[name]
        if dtype not in FLOAT_DTYPES:
            raise KbertError(f"{self.path}: {name} is {dtype}; kbert reads weights stored as {', '.join(FLOAT_DTYPES)}")
        begin, _ = self._offsets[name]
        count = int(np.prod(shape))
        # fromfile reads straight into the array: one copy, however large the table.
        raw = np.fromfile(
            self.path,
            dtype={"F32": "<f4", "F16": "<f2", "BF16": "<u2"}[dtype],
            count=count,
            offset=self.data_start + begin,
        )
        if dtype == "BF16":  # bfloat16 is the top half of a float32
            raw = (raw.astype("<u4") << 16).view("<f4")
        return raw.astype("float32", copy=False).reshape(shape)


def _not_safetensors(path, why):
    return KbertError(f"{path}: not a safetensors file ({why}); download it again, or {RESAVE}")


def _read_header(path):
    """(entries, metadata, data_start), every entry checked against the file's size, so a
    truncated or foreign file fails here with one line rather than later in numpy."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or n > min(size - 8, _MAX_HEADER):
            # torch.save's zip, or a bare pickle (protocol 2+): named, so the fix is clear.
            if head.startswith((b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")):
                raise KbertError(
                    f"{path} is a PyTorch pickle, which kbert never loads (unpickling can run code); {RESAVE}"
                )
            raise _not_safetensors(path, f"{size} bytes" if n is None else f"header length {n} in a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise _not_safetensors(path, "header is not JSON") from None
    if not isinstance(header, dict):
        raise _not_safetensors(path, "header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_size = size - 8 - n
    for name, entry in header.items():
        _check_entry(path, name, entry, data_size)
    return header, metadata, 8 + n


def _check_entry(path, name, entry, data_size):
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        ok = (
            isinstance(dtype, str)
            and all(isinstance(d, int) and d >= 0 for d in shape)
            and isinstance(begin, int)
            and isinstance(end, int)
            and 0 <= begin <= end
        )
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise _not_safetensors(path, f"bad header entry for {name}")
    if end > data_size:
        raise KbertError(f"{path}: truncated ({name} ends at byte {end} of {data_size}); download it again")
    itemsize = _ITEMSIZE.get(dtype)
    if itemsize and end - begin != int(np.prod(shape)) * itemsize:
        raise _not_safetensors(path, f"{name}: {end - begin} bytes for {dtype} {shape}")


def write_safetensors(path, tensors: dict, metadata: dict | None = None):
    """Write float32 `tensors` ({name: array}) as a safetensors file, in name order.

    `metadata` defaults to {"format": "pt"}, which transformers requires of a model file.
    """
    arrays = {name: np.ascontiguousarray(tensors[name], dtype="<f4") for name in sorted(tensors)}
    header, offset = {"__metadata__": metadata or {"format": "pt"}}, 0
    for name, array in arrays.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the library writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for array in arrays.values():
            f.write(array.tobytes())
