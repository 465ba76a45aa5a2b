"""Pickles of NumPy arrays read without running code: the CIFAR python archives.

`pickle.load` calls whatever global a file names (`os.system` among them), so a downloaded
pickle is a program. `load_arrays` admits exactly the globals a pickled NumPy array and a
dict of bytes need, and refuses the file at the first other one, before any of it runs.
"""

from __future__ import annotations

import io
import pickle

import numpy as np

try:  # NumPy 2's name; NumPy 1 and Python 2's pickles say numpy.core.
    from numpy._core.multiarray import _reconstruct
except ImportError:
    from numpy.core.multiarray import _reconstruct


class RefusedGlobalError(Exception):
    """A pickle asked for a global outside the allowed ones; the message names it."""


def _latin1(text: str, encoding: str) -> bytes:
    """`_codecs.encode` as Python 3 pickles bytes under protocol 2, for latin-1 only."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


# Python 2's pickles (the distributed files) name numpy.core.multiarray, NumPy 2 writes
# numpy._core.multiarray, and Python 3 writes bytes as `_codecs.encode(text, "latin1")`.
ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1,
}


class ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        allowed = ALLOWED_GLOBALS.get((module, name))
        if allowed is None:
            raise RefusedGlobalError(f"{module}.{name}")
        return allowed


def load_arrays(data: bytes):
    """The object a pickle of arrays holds (Python 2 strings as bytes).

    Raises:
      RefusedGlobalError: the file asks for another global than an array's.
      Exception: anything a damaged pickle raises from its opcodes.
    """
    return ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
