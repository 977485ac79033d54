"""safetensors files: read (checked), write (to a temporary file, then renamed).

The format: an 8-byte little-endian header length, a JSON header (tensor name -> dtype, shape,
data_offsets; "__metadata__" -> string values), then the tensors' bytes.
"""
import json
import os
import struct

import numpy as np

from ..errors import MicaError

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


class SafeTensors:
    """A checked view of a safetensors file: .metadata, .names, .info(name), .read(name)."""

    def __init__(self, path):
        self.path = path
        if not os.path.exists(path):
            raise MicaError(f"checkpoint {path} does not exist")
        size = os.path.getsize(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(8)
                if len(raw) < 8:
                    raise ValueError("shorter than its header length")
                (hlen,) = struct.unpack("<Q", raw)
                if hlen > min(size - 8, 1 << 28):
                    raise ValueError("its header length is larger than the file")
                header = json.loads(f.read(hlen))
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise MicaError(f"checkpoint {path} is not a readable safetensors file ({e})") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self.data_start = 8 + hlen
        self.tensors = header
        for name, t in header.items():
            try:
                dtype, shape, (a, b) = DTYPES[t["dtype"]], t["shape"], t["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise MicaError(f"checkpoint {path} is corrupt: tensor {name!r} has a malformed entry") from None
            if b - a != int(np.prod(shape)) * np.dtype(dtype).itemsize or self.data_start + b > size:
                raise MicaError(f"checkpoint {path} is truncated or corrupt: tensor {name!r} does not fit the file")

    @property
    def names(self):
        return list(self.tensors)

    def info(self, name):
        t = self.tensors[name]
        return np.dtype(DTYPES[t["dtype"]]), tuple(t["shape"]), self.data_start + t["data_offsets"][0]

    def read(self, name):
        dtype, shape, offset = self.info(name)
        return np.fromfile(self.path, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)


def write(path, tensors, metadata=None):
    """Write {name: array} (and string metadata) to `path` atomically."""
    header, arrays, at = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, a in tensors.items():
        a = np.asarray(a)
        if not a.flags.c_contiguous:
            a = a.copy()  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        if a.dtype not in CODES:
            raise MicaError(f"cannot store tensor {name!r} of dtype {a.dtype} in safetensors")
        header[name] = {"dtype": CODES[a.dtype], "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        arrays.append(a)
        at += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in arrays:
            f.write(a.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
