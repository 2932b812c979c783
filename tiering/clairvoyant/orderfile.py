"""Order files: the order given explicitly, as text (one data-set index or
file path per line, epochs separated by a blank line or "# epoch") or as a
.npy array (one row per epoch)."""
from __future__ import annotations

import io
import operator
import os
import re
import stat
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..npyfile import read_npy
from .samplers import OrderError

NPY_MAGIC = b"\x93NUMPY"


_EPOCH_LINE = re.compile(r"#\s*epoch\b", re.IGNORECASE)
_INDEX_LINE = re.compile(r"[0-9]+")
MAX_INDEX = 2**63 - 1     # an index is an int64 (no data set comes near)
MAX_INDEX_DIGITS = len(str(MAX_INDEX))


def read_order_file(path: Path, resolve: Callable[[str], int] | None = None) -> list[list[int]]:
    """Epochs of data-set indices from an explicit order file (damaged or
    oversized content is an OrderError, NOTE [untrusted arrays]).

    Text (UTF-8): one entry per line, white space around it ignored. A decimal number is
    an index; anything else is a path, turned into an index by `resolve` (KeyError,
    LookupError or ValueError from it become an OrderError with the line number; other
    exceptions pass through with the line noted). A blank line or a line "# epoch ..."
    ends an epoch (several in a row end just one; no empty epochs); other lines starting
    with "#" are comments.
    .npy (recognised by its magic bytes): an integer array, 1-D for one epoch or 2-D
    with one row per epoch."""
    return [e.tolist() for e in read_order_arrays(path, resolve)]


def read_order_arrays(path: Path, resolve: Callable[[str], int] | None = None) -> list[np.ndarray]:
    """read_order_file's epochs as int64 arrays: 8 bytes per entry while it
    reads (a text file is read line by line; NOTE [order file memory])."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise OrderError(f"order file {path}: cannot read it ({e.strerror or e})") from e
    with f:   # read once: a pipe (--order-file <(...)) cannot be read again
        head = _read(path, f, len(NPY_MAGIC))
        if head == NPY_MAGIC:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OrderError(f"order file {path}: a .npy array through a pipe; numpy reads it from a "
                                 "file: save it to one and give that")
            return _read_npy(path)
        if path.suffix == ".npy":
            raise OrderError(f"order file {path}: named .npy but not a numpy file; write it with numpy.save")
        epochs = _read_text(path, f, head, resolve)
    if not epochs:
        raise OrderError(f"order file {path}: no indices in it; write one index or path per line")
    return epochs


def _read(path: Path, f: io.BufferedReader, n: int = -1) -> bytes:
    """f.readline(), or with n >= 0 the next n bytes (fewer only at the end);
    a read error is an OrderError (one that resolve raises is its own)."""
    try:
        return f.read(n) if n >= 0 else f.readline()
    except OSError as e:
        raise OrderError(f"order file {path}: cannot read it ({e.strerror or e})") from e


def _lines(path: Path, f: io.BufferedReader, head: bytes) -> Iterator[bytes]:
    """The lines of head (the bytes read already) and then of the file."""
    first = head.split(b"\n")
    yield from (line + b"\n" for line in first[:-1])
    rest = first[-1] + _read(path, f)
    while rest:
        yield rest
        rest = _read(path, f)


def _read_text(path: Path, f: io.BufferedReader, head: bytes,
               resolve: Callable[[str], int] | None) -> list[np.ndarray]:
    """The epochs of a text order file, read line by line (a line of bytes at
    a time, each entry into an array of int64 per epoch)."""
    epochs: list[np.ndarray] = []
    current = array("q")
    for lineno, raw in enumerate(_lines(path, f, head), start=1):
        line = raw.decode("utf-8", errors="surrogateescape").strip()
        if not line or _EPOCH_LINE.match(line):
            if current:
                epochs.append(np.frombuffer(current, np.int64).copy())
                current = array("q")
            continue
        if line.startswith("#"):
            continue
        current.append(_entry(path, lineno, line, resolve))
    if current:
        epochs.append(np.frombuffer(current, np.int64).copy())
    return epochs


def _entry(path: Path, lineno: int, token: str, resolve: Callable[[str], int] | None) -> int:
    where = f"order file {path}, line {lineno}"
    if _INDEX_LINE.fullmatch(token):
        digits = token.lstrip("0") or "0"     # leading zeros count against int()'s digit limit too
        if len(digits) > MAX_INDEX_DIGITS or int(digits) > MAX_INDEX:
            raise OrderError(f"{where}: index {token[:30]}{'...' if len(token) > 30 else ''} is too large "
                             f"(indices go from 0 to the data set's number of samples - 1)")
        return int(digits)
    if resolve is None:
        raise OrderError(f"{where}: {token!r} is not a data-set index (an integer >= 0); "
                         f"paths need a resolver that maps them to indices")
    try:
        value = resolve(token)
    except (LookupError, ValueError) as e:
        raise OrderError(f"{where}: {token!r} is not a file of the data set ({e})") from e
    except Exception as e:
        e.add_note(f"while reading {where}: {token!r}")
        raise
    try:
        index = operator.index(value)
    except TypeError:
        index = -1
    if isinstance(value, bool) or index < 0:
        raise OrderError(f"{where}: {token!r} resolved to {value!r}, not an index >= 0")
    return index


def _read_npy(path: Path) -> list[np.ndarray]:
    try:
        with open(path, "rb") as f:
            arr = read_npy(f, os.fstat(f.fileno()).st_size)
    except OSError as e:
        raise OrderError(f"order file {path}: cannot read it ({e.strerror or e})") from e
    except ValueError as e:
        raise OrderError(f"order file {path}: not a readable .npy array: {e}; write it with "
                         "numpy.save(path, order.astype('int64'))") from e
    if not np.issubdtype(arr.dtype, np.integer):
        raise OrderError(f"order file {path}: holds {arr.dtype} values; indices must be integers "
                         f"(save it with an integer dtype, e.g. arr.astype('int64'))")
    if arr.ndim not in (1, 2):
        raise OrderError(f"order file {path}: a {arr.ndim}-D array; use 1-D (one epoch) or "
                         f"2-D (one row per epoch)")
    if arr.size == 0:
        raise OrderError(f"order file {path}: the array is empty")
    rows = arr.reshape(1, -1) if arr.ndim == 1 else arr
    negative = np.argwhere(rows < 0)
    if len(negative):
        row, pos = (int(x) for x in negative[0])
        raise OrderError(f"order file {path}: epoch {row + 1}, position {pos}: negative index "
                         f"{int(rows[row, pos])}; indices start at 0")
    large = np.argwhere(rows > MAX_INDEX)
    if len(large):
        row, pos = (int(x) for x in large[0])
        raise OrderError(f"order file {path}: epoch {row + 1}, position {pos}: index {int(rows[row, pos])} "
                         "is too large (indices go from 0 to the data set's number of samples - 1)")
    return [np.asarray(row, np.int64) for row in rows]


# ---------------------------------------------------------------- ranks and nodes
