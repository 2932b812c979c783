"""The binding of libtiershim.so and of the layout in shim/tiering.h: the
text between the header's CDEF markers handed to cffi, the library opened
on first use, and numpy dtypes of its structs from cffi's offsets.  The
lowest layer of the package (docs/design.md, "The parts"): the catalog,
the placement and the cluster all reach the shim's helpers through it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import cffi
import numpy as np

PACKAGE_DIR = Path(__file__).resolve().parent     # tiering/


def _first_existing(*candidates: Path) -> Path:
    for c in candidates:
        if c.exists():
            return c
    raise FileNotFoundError(
        f"{candidates[0].name} not found (looked in {', '.join(str(c.parent) for c in candidates)}); "
        "reinstall with `pip install .` or build in place with `make`"
    )


def header_path() -> Path:
    """tiering.h: shipped inside the package, or shim/ in a source checkout."""
    return _first_existing(PACKAGE_DIR / "tiering.h", PACKAGE_DIR.parent / "shim" / "tiering.h")


def library_path() -> Path:
    """libtiershim.so, built into the package by setup.py (or `make`)."""
    return _first_existing(PACKAGE_DIR / "libtiershim.so", PACKAGE_DIR.parent / "shim" / "libtiershim.so")


def _cdef_text() -> str:
    text = header_path().read_text()
    try:
        return text.split("/* BEGIN CDEF */", 1)[1].split("/* END CDEF */", 1)[0]
    except IndexError:
        raise RuntimeError(f"{header_path()}: CDEF markers missing") from None


ffi = cffi.FFI()
ffi.cdef(_cdef_text())


class _Library:
    """libtiershim.so, opened on first use: importing tiering (profiles, the
    catalog, `tiering profile check`) never needs the built library."""

    _lib: Any = None

    def __getattr__(self, name: str) -> Any:
        if _Library._lib is None:
            _Library._lib = ffi.dlopen(str(library_path()))
        return getattr(_Library._lib, name)


lib: Any = _Library()


_NUMPY_OF_C = {"uint64_t": "<u8", "int64_t": "<i8", "uint32_t": "<u4", "uint16_t": "<u2", "uint8_t": "|u1"}


def numpy_dtype(struct: str) -> np.dtype:
    """The numpy dtype of a struct of tiering.h (its scalar fields), from
    cffi's offsets: one definition of the layout for numpy too."""
    fields = [(name, f) for name, f in ffi.typeof(struct).fields if f.type.cname in _NUMPY_OF_C]
    return np.dtype({"names": [n for n, _ in fields], "formats": [_NUMPY_OF_C[f.type.cname] for _, f in fields],
                     "offsets": [f.offset for _, f in fields], "itemsize": ffi.sizeof(struct)})
