"""One numpy array read from a file the user gives or keeps (an order file, a
member of the catalog cache) without trusting it: the header is parsed and
checked against the bytes that follow it before anything is allocated, so a
damaged header is a ValueError that says what is wrong, never a traceback of
numpy's or an allocation of what the header claims (docs/design.md, NOTE
[untrusted arrays])."""
from __future__ import annotations

import io
import math
import tokenize

import numpy as np
from numpy.lib import format as npformat

CHUNK = 1 << 20           # bytes read at a time
HEADER_ERRORS = (ValueError, TypeError, SyntaxError, tokenize.TokenError)   # what a damaged header makes numpy raise


def read_npy(f: io.BufferedIOBase, size: int) -> np.ndarray:
    """The array of the .npy data that starts at f's position and holds
    `size` bytes; ValueError unless it is a plain array of a fixed-size
    dtype (no objects) whose header's shape is exactly the bytes after it."""
    start = f.tell()
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} (numpy.save writes 1.0)")
    except HEADER_ERRORS as e:
        raise ValueError(f"a damaged .npy header ({str(e)[:200]})") from None
    if dtype.hasobject or dtype.itemsize == 0 or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"a .npy of {dtype} values; plain numbers are expected")
    if any(n < 0 for n in shape):
        raise ValueError(f"a damaged .npy header (shape {shape})")
    count = math.prod(shape)
    data = size - (f.tell() - start)
    if count * dtype.itemsize != data:
        raise ValueError(f"a damaged .npy file: its header says {count} values of {dtype} "
                         f"({count * dtype.itemsize} bytes), {data} bytes follow it")
    out = np.empty(count, dtype)
    view = out.data.cast("B")
    got = 0
    while got < len(view):
        n = f.readinto(view[got:got + CHUNK])
        if not n:
            raise ValueError(f"a .npy file cut short: {got} of {len(view)} bytes of its values")
        got += n
    return out.reshape(shape[::-1]).T if fortran else out.reshape(shape)
