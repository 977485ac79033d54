"""mica.save and mica.load: torch.save's file format, read and written without torch.

A torch file (torch >= 1.6) is a zip archive, stored uncompressed: `<name>/data.pkl` is a pickle
(protocol 2) of the object in which every tensor is `torch._utils._rebuild_tensor_v2(storage,
offset, size, stride, requires_grad, hooks)` and every storage a persistent id `('storage',
torch.FloatStorage, key, 'cpu', numel)` whose bytes are the record `<name>/data/<key>` (little
endian, each aligned to 64 bytes), beside `version`, `byteorder` and torch's other small records.

mica.save writes that format: Mica's host tensors (a state_dict's values) and numpy arrays become
torch tensors (one storage per tensor object: a tensor that appears twice, as nanoGPT's tied
embedding and head, is saved once and loads shared; views of one array, a[1:] and a.t(), share
its storage, as torch's views do), a Parameter torch's Parameter, a Mica dtype
torch's; so real torch's `torch.load(path)` reads it with its default weights_only=True. mica.load
reads torch's files and Mica's into host tensors (bfloat16 ones widened to float32, as Mica holds
them outside a program), with torch's weights_only rule: by default only tensors, containers and
numbers load; anything else is a sentence naming it, and weights_only=False loads it as pickle would.
A file is written to a temporary name beside it and then renamed, so a failed save never destroys
the last good checkpoint.
"""
import collections
import io
import os
import pickle
import zipfile

import numpy as np

from .errors import MicaError

_STORAGES = {  # torch's storage class names, by the numpy type the values are held in
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16, "LongStorage": np.int64,
    "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_, "ComplexFloatStorage": np.complex64, "ComplexDoubleStorage": np.complex128,
    "BFloat16Storage": None}  # (bfloat16: two bytes each, widened to float32 when read)
_BY_TYPE = {np.dtype(t): name for name, t in _STORAGES.items() if t is not None}
_TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                 "complex64", "complex128", "float", "double", "half", "long", "int", "short")
_SAFE = set()  # (add_safe_globals: the user's classes that a weights_only load may build)


def add_safe_globals(safe_globals):
    """torch.serialization.add_safe_globals: classes or functions a weights_only load may build."""
    for g in safe_globals:
        g = g[0] if isinstance(g, tuple) else g
        _SAFE.add((g.__module__, g.__qualname__))


# ---------------------------------------------------------------------------------------- save

class _Global:
    """A name the pickle refers to (torch's, which need not be importable here)."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # (pickle's reduce asks for a callable; only the name is written)
        raise TypeError(f"{self.module}.{self.name} is a name in a torch file")


class _Storage:
    def __init__(self, key, kind, numel):
        self.key, self.kind, self.numel = key, kind, numel


class _Writer(pickle._Pickler):
    """pickle's own (Python) pickler, writing torch's names for tensors, Parameters and dtypes."""

    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.records = []  # [(key, bytes)]
        self.kept = {}  # id(tensor) -> its _Storage (a tensor saved twice is one storage)
        self.alive = []  # (the objects whose ids key self.kept, kept alive until the save ends)

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", _Global("torch", obj.kind), obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, _Global):
            return NotImplemented
        if type(obj).__name__ == "Parameter" and type(obj).__module__.startswith("mica"):
            return (_Global("torch._utils", "_rebuild_parameter"),
                    (_values(obj), bool(obj.requires_grad), collections.OrderedDict()))
        if isinstance(obj, np.ndarray) and obj.dtype in _BY_TYPE:
            return self._tensor(obj)
        return NotImplemented

    def _tensor(self, a):
        """A tensor as torch's rebuild of (storage, offset, size, stride): views of one array (a, a[1:],
        a.t()) share its storage, as torch's views share theirs; anything else gets a storage of its own."""
        from .host import memory_owner

        owner = memory_owner(a)
        item = a.dtype.itemsize
        shared = (isinstance(owner, np.ndarray) and owner is not a and owner.dtype == a.dtype and
                  owner.flags.c_contiguous and all(s >= 0 and s % item == 0 for s in a.strides))
        base = owner if shared else a
        storage = self.kept.get(id(base))
        if storage is None:
            data = np.ascontiguousarray(base).astype(base.dtype.newbyteorder("<"), copy=False)
            storage = _Storage(str(len(self.records)), _BY_TYPE[base.dtype], int(base.size))
            self.records.append((storage.key, data.tobytes()))
            self.kept[id(base)] = storage
            self.alive.append(base)
        if shared:
            offset = (a.__array_interface__["data"][0] - owner.__array_interface__["data"][0]) // item
            strides = tuple(s // item for s in a.strides)
        else:
            offset, strides, step = 0, [], 1
            for n in reversed(a.shape):
                strides.insert(0, step)
                step *= n
            strides = tuple(strides)
        leaf = type(a).__name__ == "LeafTensor" and bool(a.requires_grad)  # (a tensor made a leaf: torch's keeps it)
        return (_Global("torch._utils", "_rebuild_tensor_v2"),
                (storage, int(offset), tuple(int(n) for n in a.shape), strides, leaf, collections.OrderedDict()))

    def save_global_name(self, obj):
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("utf-8"))
        self.memoize(obj)


_Writer.dispatch = dict(pickle._Pickler.dispatch)
_Writer.dispatch[_Global] = _Writer.save_global_name


def _save_dtype(writer, dtype):
    writer.save_global_name(_Global("torch", dtype.name))  # (mica.float16 is torch.float16 in the file)


def _dtype_class():
    from .dtypes import DType

    return DType


_Writer.dispatch[_dtype_class()] = _save_dtype


def _values(p):
    """A Parameter's values, as a numpy array."""
    live = getattr(p, "_held", None)
    return np.asarray(live if live is not None else p)


def save(obj, f, pickle_module=None, pickle_protocol=2, _use_new_zipfile_serialization=True):
    """torch.save: obj in torch's file format, to a path (written to a temporary file, then renamed)
    or a writable binary file object."""
    from .tensor import user_location

    body = io.BytesIO()
    writer = _Writer(body)
    try:
        writer.dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise MicaError(f"mica.save cannot save this object: {e} (a lambda, a local class or an open file cannot "
                        "be pickled; save a state_dict() and numbers)", user_location()) from None
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        name = os.path.splitext(os.path.basename(path))[0] or "archive"
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise MicaError(f"mica.save: the folder {folder} does not exist; make it first (os.makedirs)",
                            user_location())
        temporary = f"{path}.tmp{os.getpid()}"
        try:
            with open(temporary, "wb") as out:
                _archive(out, name, body.getvalue(), writer.records)
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        return
    if not hasattr(f, "write"):
        raise MicaError(f"mica.save takes a path or a file opened for writing in binary mode, got a "
                        f"{type(f).__name__}", user_location())
    _archive(f, "archive", body.getvalue(), writer.records)


def _archive(out, name, pickled, records):
    import random

    entries = [("data.pkl", pickled), (".format_version", b"1"), (".storage_alignment", b"64"),
               ("byteorder", b"little")]
    entries += [(f"data/{key}", data) for key, data in records]
    entries += [("version", b"3\n"), (".data/serialization_id", "".join(
        random.choice("0123456789") for _ in range(40)).encode())]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for entry, data in entries:
            info = zipfile.ZipInfo(f"{name}/{entry}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            start = z.fp.tell() + 30 + len(info.filename.encode("utf-8"))  # (where its bytes would begin)
            pad = (-(start + 4)) % 64  # (an extra field pads them to 64 bytes, as torch's writer does)
            info.extra = b"FB" + pad.to_bytes(2, "little") + b"Z" * pad
            z.writestr(info, data)


# ---------------------------------------------------------------------------------------- load

class _StorageKind:
    def __init__(self, name):
        self.name = name


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    from .host import HostTensor

    size, stride, offset = tuple(int(n) for n in size), tuple(int(s) for s in stride), int(offset)
    if not isinstance(storage, np.ndarray) or len(size) != len(stride) or min(size + stride + (offset,), default=0) < 0:
        raise ValueError("a tensor whose size, stride or storage does not fit")
    if any(n == 0 for n in size):
        return np.zeros(size, storage.dtype).view(HostTensor)
    if offset + sum((n - 1) * st for n, st in zip(size, stride)) >= storage.size:
        raise ValueError("a tensor that reaches past its storage's end")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=tuple(int(s) * storage.itemsize for s in stride))
    out = view.view(HostTensor)  # (a view of its storage: tensors saved sharing one, tied weights, still share it)
    if requires_grad and out.dtype.kind == "f":
        out.requires_grad = True  # (a leaf, as torch's loads it)
    return out


def _rebuild_parameter(data, requires_grad, hooks, state=None):
    from .nn import Parameter

    return Parameter(np.array(data), requires_grad=bool(requires_grad))


def _rebuild_from_type(func, new_type, args, state):
    return func(*args)


def _dtype_named(name):
    from . import dtypes

    mapped = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32"}
    name = mapped.get(name, name)
    if name in dtypes._BY_NAME:
        return dtypes._BY_NAME[name]
    return np.dtype(name)  # (int16, int8, uint8: numpy's, as Mica holds them)


_TORCH_NAMES = {("torch._utils", "_rebuild_tensor_v2"): lambda: _rebuild_tensor,
                ("torch._utils", "_rebuild_tensor"): lambda: _rebuild_tensor,
                ("torch._utils", "_rebuild_parameter"): lambda: _rebuild_parameter,
                ("torch._utils", "_rebuild_parameter_with_state"): lambda: _rebuild_parameter,
                ("torch._tensor", "_rebuild_from_type_v2"): lambda: _rebuild_from_type,
                ("torch", "Size"): lambda: tuple,
                ("torch", "device"): lambda: str}
_PLAIN = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
          ("builtins", "slice"), ("builtins", "bytearray"), ("__builtin__", "set"), ("_codecs", "encode"),
          ("builtins", "range"), ("__builtin__", "frozenset")}


class _Reader(pickle.Unpickler):
    def __init__(self, file, records, weights_only, where):
        super().__init__(file, encoding="utf-8")
        self.records, self.weights_only, self.where = records, weights_only, where
        self.storages = {}

    def find_class(self, module, name):
        made = _TORCH_NAMES.get((module, name))
        if made is not None:
            return made()
        if module == "torch" and name.endswith("Storage") and name in _STORAGES:
            return _StorageKind(name)
        if module == "torch" and name in _TORCH_DTYPES:
            return _dtype_named(name)
        if (module, name) in _PLAIN:
            return super().find_class("builtins" if module == "__builtin__" else module, name)
        if self.weights_only and (module, name) not in _SAFE:
            raise _Refused(module, name)
        if module.split(".")[0] == "torch":
            raise MicaError(f"mica.load: {self.where} holds a {module}.{name}, which Mica does not read without "
                            "torch; load it with torch and save its state_dict()")
        return super().find_class(module, name)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise MicaError(f"mica.load: {self.where} is not a torch file Mica reads (a persistent id {pid!r:.60})")
        _, kind, key, _, numel = pid
        if key not in self.storages:
            data = self.records(f"data/{key}")
            name = kind.name if isinstance(kind, _StorageKind) else str(kind)
            if name == "BFloat16Storage":
                values = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                values = np.frombuffer(data, np.dtype(_STORAGES[name]).newbyteorder("<"))
                values = values.astype(values.dtype.newbyteorder("="))
            self.storages[key] = np.array(values, copy=True)
        return self.storages[key]


class _Refused(Exception):
    def __init__(self, module, name):
        self.module, self.name = module, name


def load(f, map_location=None, pickle_module=None, *, weights_only=True, mmap=None, **pickle_load_args):
    """torch.load: what mica.save or torch.save wrote, its tensors as Mica's host tensors."""
    from .tensor import user_location

    where = os.fspath(f) if isinstance(f, (str, os.PathLike)) else "the file"
    try:
        source = open(where, "rb") if isinstance(f, (str, os.PathLike)) else f
    except FileNotFoundError:
        raise MicaError(f"mica.load: {where} does not exist", user_location()) from None
    except IsADirectoryError:
        raise MicaError(f"mica.load: {where} is a folder; give the file's path", user_location()) from None
    try:
        head = source.read(4)
        source.seek(0)
        if head == b"\x80\x02\x8a\x0a":  # (a pickle opening with torch's legacy magic number)
            raise MicaError(f"mica.load: {where} is a torch file in the format before torch 1.6 (or saved with "
                            "_use_new_zipfile_serialization=False), which Mica does not read; load it with torch and "
                            "save it again", user_location())
        if head[:2] != b"PK":
            raise MicaError(f"mica.load: {where} is not a torch file (torch.save writes a zip archive; a file saved by "
                            "torch before 1.6, or with _use_new_zipfile_serialization=False, loads with torch: save it "
                            "again from there)", user_location())
        try:
            archive = zipfile.ZipFile(source)
            pickles = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
            if not pickles:
                raise zipfile.BadZipFile("no data.pkl")
            prefix = pickles[0][:-len("data.pkl")]
            reader = _Reader(io.BytesIO(archive.read(pickles[0])), lambda key: archive.read(prefix + key),
                             weights_only, where)
            return reader.load()
        except _Refused as e:
            raise MicaError(f"mica.load: {where} holds a {e.module}.{e.name}, which weights_only=True (torch's "
                            "default) does not load; pass weights_only=False if you trust the file (or allow the "
                            "class with mica.serialization.add_safe_globals([...]))", user_location()) from None
        except MicaError:
            raise
        except Exception as e:  # (anything a damaged file makes the unpickler raise: one sentence)
            raise MicaError(f"mica.load: {where} is not a whole torch file ({type(e).__name__}: {str(e)[:80]}); it may "
                            "be truncated, or another kind of file", user_location()) from None
    finally:
        if isinstance(f, (str, os.PathLike)):
            source.close()
