"""Caffe ``.caffemodel`` weights (a binary NetParameter): read into a net by layer name, as
``caffe train --weights`` does, and written from a net so that Caffe reads ours.

A layer's blobs are its parameters in :meth:`param_specs` order (Caffe's order): weight then
bias; BatchNorm's three are its running mean and variance sums and their scale factor, which our
BatchNorm keeps exactly as Caffe does (its fourth state buffer is ours alone and not written).
"""

import math
import os

import numpy as np
from google.protobuf.message import DecodeError

from ...errors import SNError
from . import caffe_pb2

CAFFE_BLOBS = {"BatchNorm": 3}  # blobs Caffe stores; the rest of the layer's state is ours
MAX_BYTES = 2 << 30  # protobuf's own limit on one message


def net_layers(graph):
    """``(name, type, bottoms, tops, [param tensor names])`` of every layer of ``graph`` with
    blobs, in execution order."""
    for node in graph.nodes:
        names = list(node.params.values())[:CAFFE_BLOBS.get(node.layer.type)]
        if names:
            yield node.name, node.layer.type, list(node.bottoms), list(node.tops), names


def read_caffemodel(path):
    """``{layer name: (type, [arrays])}`` of a ``.caffemodel`` (``layer`` or V1 ``layers``);
    a one-line SNError if it is not one."""
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise SNError(f"{path}: {size} bytes; larger than protobuf reads ({MAX_BYTES >> 30} GiB)")
        with open(path, "rb") as f:
            net = caffe_pb2.NetParameter.FromString(f.read())
    except OSError as e:
        raise SNError(f"{path}: cannot read the weights: {e.strerror or e}") from None
    except DecodeError as e:
        raise SNError(f"{path}: not a Caffe .caffemodel (binary NetParameter): {e}") from None
    out = {}
    for lp in net.layer:
        out[lp.name] = (lp.type, [_blob_array(b) for b in lp.blobs])
    for lp in net.layers:  # V1 files
        out.setdefault(lp.name, (caffe_pb2.V1LayerParameter.LayerType.Name(lp.type),
                                 [_blob_array(b) for b in lp.blobs]))
    if not out:
        raise SNError(f"{path}: not a Caffe .caffemodel (no layers)")
    return out


def _blob_array(blob):
    if blob.HasField("shape"):
        shape = tuple(blob.shape.dim)
    else:  # legacy 4-D blobs: num, channels, height, width
        shape = (blob.num, blob.channels, blob.height, blob.width)
    data = np.asarray(blob.data if len(blob.data) else blob.double_data, dtype=np.float32)
    if data.size != math.prod(shape):
        raise SNError(f"a blob of shape {shape} holds {data.size} values")
    return data.reshape(shape)


def _fits(theirs, ours):
    """Whether a file's blob fits our parameter: the same shape, or a legacy 4-D blob with the
    same dims once its leading 1s are dropped (Caffe's own rule for old files)."""
    if theirs.shape == ours:
        return True
    squeeze = tuple(theirs.shape)
    while len(squeeze) > len(ours) and squeeze[0] == 1:
        squeeze = squeeze[1:]
    return squeeze == tuple(ours) and theirs.ndim == 4


def load_weights(net, path):
    """Copy a .caffemodel's blobs into ``net`` by layer name; returns a report:
    ``{"copied": [name], "skipped": [name], "refused": [(name, why)], "unused": [name]}``.
    A layer is copied whole or not at all; a refused layer keeps its initial values."""
    blobs = read_caffemodel(path)
    report = {"copied": [], "skipped": [], "refused": [], "unused": []}
    seen = set()
    for name, _ltype, _, _, params in net_layers(net.graph):
        seen.add(name)
        if name not in blobs:
            report["skipped"].append(name)
            continue
        arrays = blobs[name][1]
        ours = [net.graph.tensors[p].shape for p in params]
        if len(arrays) != len(ours):
            report["refused"].append((name, f"{len(arrays)} blobs in the file, the layer has {len(ours)}"))
            continue
        bad = [(i, a.shape, s) for i, (a, s) in enumerate(zip(arrays, ours)) if not _fits(a, s)]
        if bad:
            i, theirs, mine = bad[0]
            report["refused"].append((name, f"blob {i} has shape {tuple(theirs)} in the file, "
                                            f"{tuple(mine)} here"))
            continue
        for p, a, s in zip(params, arrays, ours):
            net.set_param(p, a.reshape(s))
        report["copied"].append(name)
    report["unused"] = [n for n, (_, arrays) in blobs.items() if n not in seen and arrays]
    return report


def caffemodel_bytes(graph, arrays):
    """A binary NetParameter of ``graph``'s layers with their blobs from ``arrays`` (tensor name
    → array). The float data is written as packed bytes directly: a 138M-parameter VGG would
    take minutes through protobuf's per-value lists."""
    out = [_field(1, caffe_pb2.NetParameter(name=graph.name).name.encode())]
    for name, ltype, bottoms, tops, params in net_layers(graph):
        lp = caffe_pb2.LayerParameter(name=name, type=ltype, bottom=bottoms, top=tops)
        body = [lp.SerializeToString()]
        for p in params:
            a = np.ascontiguousarray(arrays[p], dtype="<f4")
            shape = caffe_pb2.BlobShape(dim=list(a.shape)).SerializeToString()
            blob = _field(7, shape) + _field(5, a.tobytes())
            body.append(_field(7, blob))
        out.append(_field(100, b"".join(body)))
    return b"".join(out)


def write_caffemodel(net, path, arrays=None):
    """Write ``net``'s parameters (or ``arrays``, tensor name → array) as a .caffemodel at
    ``path`` (through a temporary file, renamed when whole)."""
    if arrays is None:
        arrays = {p: net.param(p) for *_, params in net_layers(net.graph) for p in params}
    data = caffemodel_bytes(net.graph, arrays)
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise SNError(f"cannot write '{path}': {e.strerror or e}") from None
    return path


def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, payload):
    """A length-delimited field (wire type 2): a message, a string, or packed floats."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload
