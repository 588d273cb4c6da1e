"""The element types the core takes, read from it once for the whole Python layer: ids,
item sizes, which are integers, and the canonical name of a numpy, torch or string dtype."""
import numpy as np

from . import _core

DTYPE_IDS = {name: i for name, (i, _, _) in _core.DTYPES.items()}
ITEMSIZE = {name: size for name, (_, size, _) in _core.DTYPES.items()}
INTEGER_DTYPES = frozenset(name for name, (_, _, floating) in _core.DTYPES.items() if not floating)
_NAMES = {i: name for name, i in DTYPE_IDS.items()}


def canonical(dtype):
    """The core's name of a numpy dtype, torch dtype or string ("float32", "bfloat16", ...)."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text[6:]
    return np.dtype(dtype).name


def name_of(dtype_id):
    """The name of one of the core's dtype ids."""
    return _NAMES[dtype_id]
