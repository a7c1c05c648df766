"""The bytes of a step's scratch: scratch arrays are carved from one workspace, each start
rounded up to 16 bytes (base.Context.scratch); :func:`workspace_bytes` is what a kernel asks
for, so layers and codecs size their workspaces alike."""

import math

import numpy as np


def workspace_bytes(*arrays):
    """Bytes of workspace for scratch arrays given as ``(shape, dtype)``, with ``scratch``'s padding."""
    total = 0
    for shape, dtype in arrays:
        total = -(-total // 16) * 16 + math.prod(map(int, shape)) * np.dtype(dtype).itemsize
    return total
