"""What cupy or numba hand over for GPU memory: __cuda_array_interface__ (version 3) with an
address no host code may read. Without a usable GPU, mpicomp must refuse it before touching
the address."""
import numpy as np


class FakeDeviceArray:
    def __init__(self, n=1024):
        self.shape, self.dtype = (n,), np.dtype(np.float32)
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (0xDEAD0000, False),
                                         "version": 3, "strides": None, "stream": 1}
