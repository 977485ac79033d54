"""safetensors files: read (checked), write (to a temporary file, then renamed).

The format: an 8-byte little-endian header length, a JSON header (tensor name -> dtype, shape,
data_offsets; "__metadata__" -> string values), then the tensors' bytes.

bfloat16 ("BF16"): numpy has no such type, so a BF16 tensor is a `BF16Tensor` (its raw uint16
bits) when written, `info()` names its dtype `BFLOAT16`, and `read()` returns it widened to float32
(exact: every bfloat16 is a float32) while `read_bits()` returns the stored bits.
"""
import json
import math
import os
import struct
import zlib

import numpy as np

from ..errors import MicaError
from ..files import atomic_write

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


class _BFloat16:
    """The dtype `info()` gives a BF16 tensor: it prints as bfloat16, is floating point, 2 bytes,
    and equals no numpy dtype (so a float32 slot never takes BF16 bytes by mistake)."""
    name, kind, itemsize, code = "bfloat16", "f", 2, "BF16"

    def __repr__(self):
        return "bfloat16"


BFLOAT16 = _BFloat16()


class BF16Tensor:
    """A tensor to store as BF16: `bits` is a uint16 array of bfloat16 bit patterns."""

    def __init__(self, bits):
        bits = np.asarray(bits)
        if bits.dtype != np.uint16:
            raise TypeError("BF16Tensor holds uint16 bit patterns; use BF16Tensor.round(floats) for values")
        self.bits = bits
        self.shape = bits.shape

    @classmethod
    def round(cls, values):
        """Values (as float32) rounded to the nearest bfloat16, ties to even, as torch's
        .to(torch.bfloat16): overflow goes to infinity; a NaN stays a NaN (0x7FC0)."""
        a = np.array(values, dtype=np.float32)
        u = a.view(np.uint32).astype(np.uint64)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return cls(np.where(np.isnan(a), np.uint16(0x7FC0), rounded).astype(np.uint16))

    def float32(self):
        return widen_bf16(self.bits)


def widen_bf16(bits):
    """bfloat16 bit patterns (uint16) as the float32 values they are (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def crc32(array):
    """zlib's CRC-32 of a C-contiguous array's bytes (the trainer computes the same in C)."""
    return zlib.crc32(array.reshape(-1).data)


def missing(path, then="check the path, or train a run into that folder first"):
    """The sentence for a checkpoint that is not there: a nanoGPT ckpt.pt beside it is named, with
    the import that turns it into Mica's."""
    folder = os.path.dirname(path) or "."
    pt = os.path.join(folder, "ckpt.pt")
    if os.path.basename(path) == "ckpt.safetensors" and os.path.isfile(pt):
        into = folder if os.access(folder, os.W_OK) else "DIR"  # (a read-only folder: into another one)
        return (f"{folder} holds nanoGPT's ckpt.pt but no Mica checkpoint ({path}); convert it first with "
                f"mica import {pt} --out_dir {into}" + ("" if into == folder else ", a folder you can write, and "
                                                          "use --out_dir=DIR"))
    return f"checkpoint {path} does not exist; {then}"


RESUMED_METADATA = ("iter_num", "best_val_loss", "config")  # (and the batch generator's "rng", where a run wrote it)


def metadata_crc(md):
    """The CRC-32 of the metadata a resume reads, as the trainer computes it: iteration, best loss,
    batch generator (empty in an imported checkpoint, which has none) and config, one a line."""
    text = "\n".join([md["iter_num"], md["best_val_loss"], md.get("rng", ""), md["config"]])
    return zlib.crc32(text.encode())


class SafeTensors:
    """A checked view of a safetensors file: .metadata, .names, .info(name), .read(name), .crc(name).

    Every malformed header is one sentence. Where the metadata holds checksums ("crc32": JSON of
    tensor name -> 8 hex digits, as Mica writes them), they must name exactly the file's tensors,
    and read() verifies the tensor it returns."""

    def __init__(self, path):
        self.path = path
        if not os.path.exists(path):
            raise MicaError(missing(path))
        if not os.path.isfile(path):
            raise MicaError(f"checkpoint {path} is not a file")
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
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON object")
        except (OSError, ValueError, RecursionError) as e:
            raise MicaError(f"checkpoint {path} is not a readable safetensors file ({e})") from None
        metadata = header.pop("__metadata__", {}) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise MicaError(f"checkpoint {path} is corrupt: its metadata is not a table of strings")
        self.metadata = metadata
        self.data_start = 8 + hlen
        self.tensors = header
        for name, t in header.items():
            code = t.get("dtype") if isinstance(t, dict) else None
            if isinstance(code, str) and code not in DTYPES and code != "BF16":
                raise MicaError(f"checkpoint {path} holds tensor {name!r} as {code[:20]}, a type Mica does not read "
                                "(it reads F64, F32, BF16, F16 and integers); convert the file to float32")
            try:
                dtype, shape, (a, b) = _dtype(t["dtype"]), t["shape"], t["data_offsets"]
                if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
                        and type(a) is int and type(b) is int and 0 <= a <= b):
                    raise ValueError
            except (KeyError, TypeError, ValueError):
                raise MicaError(f"checkpoint {path} is corrupt: tensor {name!r} has a malformed entry") from None
            if b - a != math.prod(shape) * dtype.itemsize or self.data_start + b > size:
                raise MicaError(f"checkpoint {path} is truncated or corrupt: tensor {name!r} does not fit the file")
        self._crcs = self._read_crcs()

    def _read_crcs(self):
        if "crc32" not in self.metadata:
            return None
        try:
            table = json.loads(self.metadata["crc32"])
            if not isinstance(table, dict):
                raise ValueError
            crcs = {}
            for name, hexdigits in table.items():
                if not isinstance(hexdigits, str) or len(hexdigits) != 8:
                    raise ValueError
                crcs[name] = int(hexdigits, 16)
        except (ValueError, RecursionError):
            raise MicaError(f"checkpoint {self.path} is corrupt: its checksum table is unreadable") from None
        if set(crcs) != set(self.tensors):
            odd = sorted(set(crcs) ^ set(self.tensors))
            raise MicaError(f"checkpoint {self.path} is corrupt: its checksums and its tensors disagree about "
                            f"{', '.join(map(repr, odd[:3]))}{' ...' if len(odd) > 3 else ''} (a damaged header?)")
        return crcs

    def check_metadata(self):
        """Where the file holds a CRC-32 of the metadata a resume reads (the trainer writes one),
        the metadata must match it."""
        if "meta_crc32" not in self.metadata:
            return
        try:
            ok = metadata_crc(self.metadata) == int(self.metadata["meta_crc32"], 16)
        except (KeyError, ValueError):
            ok = False
        if not ok:
            raise MicaError(f"checkpoint {self.path} is corrupt: its metadata (iteration, best loss, batch generator, "
                            "config) does not match its checksum; use another checkpoint")

    @property
    def names(self):
        return list(self.tensors)

    @property
    def checksummed(self):
        return self._crcs is not None

    def crc(self, name):
        """The CRC-32 the tensor's bytes must have, or None where the file holds no checksums."""
        return None if self._crcs is None else self._crcs[name]

    def info(self, name):
        """(dtype, shape, file offset): a numpy dtype, or BFLOAT16."""
        t = self.tensors[name]
        return _dtype(t["dtype"]), tuple(t["shape"]), self.data_start + t["data_offsets"][0]

    def read(self, name):
        """The tensor as a numpy array (a BF16 tensor widened to float32, exactly)."""
        dtype, _, _ = self.info(name)
        return widen_bf16(self.read_bits(name)) if dtype is BFLOAT16 else self.read_bits(name)

    def verify(self):
        """Every tensor read against its checksum (a sentence at the first that does not match), so a
        resume checks its checkpoint whole before it changes anything in the run's folder."""
        for name in self.names if self._crcs is not None else ():
            self.read_bits(name)

    def read_bits(self, name):
        """The tensor's stored values (a BF16 tensor's uint16 bit patterns), checked."""
        dtype, shape, offset = self.info(name)
        storage = np.uint16 if dtype is BFLOAT16 else dtype
        a = np.fromfile(self.path, dtype=storage, count=math.prod(shape), offset=offset).reshape(shape)
        if self._crcs is not None and crc32(a) != self._crcs[name]:
            raise MicaError(f"checkpoint {self.path} is corrupt: tensor {name} does not match its checksum (its "
                            "bytes changed after it was written); use another checkpoint")
        return a


def _dtype(code):
    """The dtype of a safetensors dtype code (KeyError for codes Mica does not read)."""
    return BFLOAT16 if code == "BF16" else np.dtype(DTYPES[code])


def write(path, tensors, metadata=None):
    """Write {name: array or BF16Tensor} (and string metadata, plus a CRC-32 of every tensor) to
    `path` atomically: a temporary file, synced, then renamed; on failure nothing is replaced."""
    header, arrays, at = {}, [], 0
    for name, a in tensors.items():
        code = "BF16" if isinstance(a, BF16Tensor) else None
        a = a.bits if code else np.asarray(a)
        if not a.flags.c_contiguous:
            a = a.copy()  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        if code is None and a.dtype not in CODES:
            raise MicaError(f"cannot store tensor {name!r} of dtype {a.dtype} in safetensors")
        code = code or CODES[a.dtype]
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        arrays.append(a)
        at += a.nbytes
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    if all(k in meta for k in RESUMED_METADATA):  # (an import's: a resume checks it, as it checks the trainer's)
        meta["meta_crc32"] = f"{metadata_crc(meta):08x}"
    meta["crc32"] = json.dumps({name: f"{crc32(a):08x}" for name, a in zip(header, arrays)},
                               separators=(",", ":"))
    blob = json.dumps({"__metadata__": meta, **header}, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)

    def write_all(f):
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in arrays:
            f.write(a.tobytes())

    atomic_write(path, write_all, sync=True)
