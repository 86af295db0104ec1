"""Read a drafter swap's named-tensor payload and nothing else: bounded before anything is allocated.

Why: ``/update_weights_from_tensor`` takes a pickle from the network. Python's unpickler, even with a global
allowlist, lets a payload name torch's shared-memory and file-descriptor reductions (the server then dials a
socket or opens a descriptor the sender names), build huge objects from a few bytes (``bytes(n)``, a memo
index of 2**31, a storage of any size) or raise C++ errors whose text leaks out. This reader accepts one
shape of payload, the one a plain ``pickle.dumps([(name, cpu_tensor), ...])`` writes and SGLang 0.5.23's own
``SafeUnpickler`` also reads (``torch.storage._load_from_bytes`` -> ``torch.load(weights_only=True)``):

- every tensor's bytes are *in* the payload (``_load_from_bytes`` of torch's legacy storage record, parsed
  here, never by ``torch.load``); no storage is shared out of band, so no fd, socket or shm name is followed;
- every pickle is scanned opcode by opcode first (:func:`_scan`): only the opcodes a tensor list needs, memo
  indices no larger than the pickle's own opcode count, at most ``MAX_OPCODES_PER_TENSOR`` a tensor;
- the only callables are stand-ins that check before they allocate: a storage no larger than the bytes left
  in its record nor than the largest tensor the served drafter holds, all storages together no larger than
  the payload; a tensor no larger than the drafter's largest, contiguous, inside its storage, without grad
  or hooks (names and exact shapes are then the swap's own check, ``engine.swap.check_drafter_tensors``).

Every refusal is a :class:`PayloadRefused` whose text names ``serialized_named_tensors`` and says what was
expected; no exception text from pickle or torch reaches the client.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any, Iterable

import torch

from draftlab.errors import DraftlabError

FIELD = "serialized_named_tensors"
MAX_OPCODES_PER_TENSOR = 64  # a plain-pickled CPU tensor takes ~30 opcodes
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_PROTOCOL = 1001
STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
}
# the opcodes plain pickle writes for a list of (str, tensor) pairs (protocols 3-5; 2 writes bytes through
# _codecs.encode) and protocol 2 for torch's legacy storage record; everything else (BUILD, INST, OBJ, NEWOBJ,
# EXT*, BYTEARRAY8, out-of-band buffers, text INT/LONG of any length, ...) is refused before unpickling starts
OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_DICT", "APPEND", "APPENDS", "SETITEM",
    "SETITEMS", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
    "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BININT", "BININT1", "BININT2", "LONG1", "NEWFALSE", "NEWTRUE",
    "NONE", "BINFLOAT", "GLOBAL", "STACK_GLOBAL", "REDUCE", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "BINPERSID",
})


class PayloadRefused(DraftlabError):
    """A payload that is not a bounded list of named in-band CPU tensors (the message names the field)."""


def refuse(what: str) -> PayloadRefused:
    return PayloadRefused(f"{FIELD}: {what}")


class _Budget:
    """What the served drafter allows: its tensors' shapes, the largest one's bytes, the payload's length."""

    def __init__(self, shapes: Iterable[tuple[int, ...]], payload_bytes: int, tensors: int):
        self.max_numel = max((_numel(s) for s in shapes), default=0)
        self.max_storage = self.max_numel * 8  # the widest element: 8 bytes
        self.left = payload_bytes  # storages allocated, all together, never exceed the payload's own length
        self.tensors = tensors


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _scan(stream: io.BytesIO, max_opcodes: int, persid: bool) -> None:
    """Walk one pickle's opcodes without building anything: refuse what a tensor list never holds."""
    start = stream.tell()
    count = 0
    pushed: list[Any] = [None, None]  # the last two stack pushes (memo puts aside): STACK_GLOBAL's operands
    try:
        for op, arg, _pos in pickletools.genops(stream):
            count += 1
            if count > max_opcodes:
                raise refuse(f"more than {max_opcodes} pickle opcodes; expected at most "
                             f"{MAX_OPCODES_PER_TENSOR} per tensor of the served drafter")
            if op.name not in OPCODES or (op.name == "BINPERSID" and not persid):
                raise refuse(f"pickle opcode {op.name} is not part of a named-tensor list")
            if op.name in ("BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET") and int(arg) > max_opcodes:
                raise refuse(f"memo index {int(arg)} is larger than the pickle could fill")
            if op.name == "GLOBAL":
                _check_global(*str(arg).split(" ", 1))
            elif op.name == "STACK_GLOBAL" and all(isinstance(p, str) for p in pushed):
                _check_global(*pushed)  # operands fetched from the memo are left to find_class
            if op.name not in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "FRAME"):
                pushed = [pushed[1], arg if "UNICODE" in op.name else None]
    except PayloadRefused:
        raise
    except Exception:  # noqa: BLE001 - pickletools' own errors: a torn or foreign byte stream
        raise refuse("not a pickle (torn or malformed at some byte)") from None
    stream.seek(start)


# the outer pickle's callables (each replaced by a checking stand-in) and the storage record's classes
OUTER_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"), ("torch.storage", "_load_from_bytes"),
                 ("collections", "OrderedDict")}


def _check_global(module: str, name: str) -> None:
    """Refuse a global no tensor list names, before unpickling starts (the same check as ``find_class``)."""
    if (module, name) in OUTER_GLOBALS or (module == "torch" and name in STORAGE_DTYPES):
        return
    if module.startswith("torch.multiprocessing") or module.startswith("multiprocessing"):
        raise refuse(f"{module}.{name} shares storage out of band (a file descriptor, socket or shared-memory "
                     "name); the builtin server reads only tensors whose bytes are in the payload")
    raise refuse(f"global {module}.{name} is not part of a named-tensor list")


class _Storage:
    """One in-band storage: its dtype and its bytes, copied out of the payload (never shared)."""

    def __init__(self, dtype: torch.dtype, data: bytearray):
        self.dtype, self.data = dtype, data


class _StorageType:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


class _NoHooks:
    """``collections.OrderedDict()`` as ``_rebuild_tensor_v2``'s empty backward hooks, and nothing else."""


class _RecordUnpickler(pickle.Unpickler):
    """The small pickles of torch's legacy storage record: storage classes as dtypes, the persistent id kept."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(STORAGE_DTYPES[name])
        raise refuse(f"global {module}.{name} in a storage record; expected a torch storage class")

    def persistent_load(self, pid: Any) -> Any:
        return ("pid", pid)


def _load_record(stream: io.BytesIO, persid: bool = False) -> Any:
    _scan(stream, 256, persid)
    try:
        return _RecordUnpickler(stream).load()
    except PayloadRefused:
        raise
    except Exception:  # noqa: BLE001 - a torn record: one line, no pickle internals
        raise refuse("a storage record is torn or malformed") from None


def _storage_from_record(blob: Any, budget: _Budget) -> _Storage:
    """``torch.storage._load_from_bytes``'s argument (torch's legacy ``torch.save`` of one storage), read by
    hand: magic, protocol, little-endian, one CPU storage with its element count, then its bytes."""
    if not isinstance(blob, bytes):
        raise refuse("a storage must be given as bytes")
    stream = io.BytesIO(blob)
    if _load_record(stream) != LEGACY_MAGIC or _load_record(stream) != LEGACY_PROTOCOL:
        raise refuse("a storage record is not torch's storage serialization (magic number or protocol)")
    info = _load_record(stream)
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise refuse("a storage record is not little-endian")
    pid = _load_record(stream, persid=True)
    if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "pid" and isinstance(pid[1], tuple)
            and len(pid[1]) == 6):
        raise refuse("a storage record does not hold exactly one storage")
    kind, stype, key, location, numel, view = pid[1]
    if kind != "storage" or not isinstance(stype, _StorageType) or location != "cpu" or view is not None \
            or type(numel) is not int or numel < 0:
        raise refuse("a storage record must hold one CPU storage with its element count")
    keys = _load_record(stream)
    if keys != [key]:
        raise refuse("a storage record's key list does not match its storage")
    nbytes = numel * torch.empty((), dtype=stype.dtype).element_size()
    head = stream.read(8)
    if len(head) != 8 or int.from_bytes(head, "little") != numel:
        raise refuse("a storage record's element count does not match its header")
    if nbytes > budget.max_storage or nbytes > budget.left or nbytes > len(blob) - stream.tell():
        raise refuse(f"a storage of {nbytes} bytes is larger than its record or than the served drafter's "
                     f"largest tensor ({budget.max_storage} bytes)")
    budget.left -= nbytes
    return _Storage(stype.dtype, bytearray(stream.read(nbytes)))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _tensor(budget: _Budget, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
            hooks: Any = None, *rest: Any) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` for one in-band storage, every argument checked first."""
    if not isinstance(storage, _Storage):
        raise refuse("a tensor's storage is not carried in the payload (in-band storages only)")
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and all(type(d) is int for d in size + stride)
            and type(offset) is int and offset >= 0):
        raise refuse("a tensor's offset, size and stride must be integers")
    if _numel(size) > budget.max_numel:  # names and exact shapes are the swap's own check, once all are read
        raise refuse(f"a tensor of shape {list(size)} is larger than any tensor the served drafter holds")
    if stride != _contiguous(size) or requires_grad is not False or not isinstance(hooks, _NoHooks) or rest:
        raise refuse("a tensor must be contiguous, without grad, hooks or metadata")
    budget.tensors -= 1
    if budget.tensors < 0:
        raise refuse("more tensors than the served drafter holds")
    itemsize = torch.empty((), dtype=storage.dtype).element_size()
    numel = _numel(size)
    if (offset + numel) * itemsize > len(storage.data):
        raise refuse("a tensor reaches past the end of its storage")
    if numel == 0:
        return torch.empty(size, dtype=storage.dtype)
    flat = torch.frombuffer(storage.data, dtype=storage.dtype, count=numel, offset=offset * itemsize)
    return flat.reshape(size)


class _TensorListUnpickler(pickle.Unpickler):
    """The outer pickle: three names resolve, each to a checking stand-in; every other global is refused."""

    def __init__(self, stream: io.BytesIO, budget: _Budget):
        super().__init__(stream)
        self.budget = budget

    def find_class(self, module: str, name: str) -> Any:
        budget = self.budget
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda *args: _tensor(budget, *args)
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return lambda *args: _storage_from_record(*args, budget) if len(args) == 1 else _bad_call()
        if (module, name) == ("collections", "OrderedDict"):
            return lambda *args, **kw: _bad_call() if args or kw else _NoHooks()
        _check_global(module, name)
        raise refuse(f"global {module}.{name} is not part of a named-tensor list")

    def persistent_load(self, pid: Any) -> Any:
        raise refuse("persistent ids are not part of a named-tensor list")


def _bad_call() -> Any:
    raise refuse("a rebuild function was called with arguments a tensor list never passes")


def read_named_tensors(raw: bytes, shapes: Iterable[tuple[int, ...]], tensors: int) -> list[tuple[str, Any]]:
    """``raw`` (one rank's decoded entry) as ``[(name, tensor)]``: at most ``tensors`` tensors, each of one
    of ``shapes`` (the served drafter's), every byte read from ``raw`` itself."""
    budget = _Budget(shapes, len(raw), tensors)
    stream = io.BytesIO(raw)
    _scan(stream, MAX_OPCODES_PER_TENSOR * max(tensors, 1) + 16, persid=False)
    try:
        obj = _TensorListUnpickler(stream, budget).load()
    except PayloadRefused:
        raise
    except Exception:  # noqa: BLE001 - any other failure of a hostile byte stream: no internals leak out
        raise refuse("not a named-tensor payload (malformed pickle)") from None
    if stream.read(1):
        raise refuse("bytes after the end of the pickle")
    if not isinstance(obj, list) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], torch.Tensor)
            for p in obj):
        raise refuse("expected a list of (name, tensor) pairs")
    names = [p[0] for p in obj]
    if len(set(names)) != len(names):
        raise refuse("a tensor name appears twice")
    return obj


def write_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """The payload :func:`read_named_tensors` reads (and SGLang's ``SafeUnpickler`` too): a plain pickle, each
    tensor a contiguous CPU copy of its own, so its storage holds exactly its bytes."""
    pairs = [(str(n), t.detach().to("cpu").contiguous().clone()) for n, t in named]
    return pickle.dumps(pairs, protocol=4)
