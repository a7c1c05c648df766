"""Caffe ``.prototxt`` nets → our network spec: one translation, so that planning, training,
depth search and conversion to YAML are shared with YAML nets.

A NetParameter (``layer {}`` blocks, or the old V1 ``layers { type: CONVOLUTION }``) is read by
:mod:`.textproto` and rewritten as the mapping a YAML net file would hold (Caffe's keys
flattened out of their ``*_param`` blocks, as our YAML writes them), carrying the positions of
the prototxt, and handed to the YAML loader's checks (:func:`superneuron.netfile.spec.spec_from_tree`).
So every problem is reported as ``file:line:col: layer 'name' (Type): ...`` in the prototxt.

``data="synthetic"`` (or ``"synthetic:CxHxW"``) replaces Data and ImageData layers with
synthetic data of the shape they would produce: crop size, channels from ``mean_value`` or the
written shape, classes from the ``num_output`` feeding the loss (prototxt_data.py; the forks'
layers: prototxt_forks.py).
"""

import os

from ...errors import SpecError, where
from ...layers.registry import REGISTRY
from ..yaml_read import Map, Seq
from . import caffe_pb2
from .prototxt_data import DataLayers, f32
from .prototxt_forks import FORK_TYPES, bn_layers, dense_image_data
from .textproto import parse

LAYER_FIELDS = {"name", "type", "bottom", "top", "loss_weight", "param", "include", "exclude", "phase",
                "propagate_down"}
V1_FIELDS = {"name", "type", "bottom", "top", "loss_weight", "include", "exclude", "blobs_lr", "weight_decay"}
DATA_TYPES = ("Data", "ImageData", "AnnotatedData")
NESTED = ("nms_param", "save_output_param")  # the SSD fork's blocks inside a *_param: flattened too

# V1's enum names → the layer type names Caffe's upgrade gives them
V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL", "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution", "DATA": "Data",
    "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout", "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData", "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN", "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence", "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice", "TANH": "TanH",
    "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}

# (field, value) pairs that say only what our layers do anyway: left out of the spec
NO_EFFECT = {("engine", None), ("force_nd_im2col", False), ("transpose", False), ("stable_prod_grad", True),
             ("variance_norm", "FAN_IN"), ("sparse", -1)}
PAIR_FIELDS = {"kernel_size", "stride", "pad", "dilation"}  # Caffe's repeated: one value or h, w
RENAMED = {"concat_dim": "axis", "hole": "dilation"}  # hole: DeepLab's and PSPNet's name for dilation


def prototxt_tree(text, file="<net>", data=None):
    """The YAML-layout mapping (with positions) of a prototxt's text; SpecError if it is bad."""
    net = caffe_pb2.NetParameter()
    pos = parse(text, net, file)
    return _Translator(file, data).net(net, pos)


def _scalar(field, value):
    if field.type == field.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type == field.TYPE_FLOAT:
        return f32(value)
    if field.type == field.TYPE_MESSAGE:
        return _message(value)
    return value


def _message(msg):
    """A nested message as plain values: BlobShape → its dims, a filler or rule → a mapping."""
    if msg.DESCRIPTOR.name == "BlobShape":
        return list(msg.dim)
    out = {}
    for field, value in msg.ListFields():
        value = [_scalar(field, v) for v in value] if _repeated(field) else _scalar(field, value)
        if _no_effect(field.name, value):
            continue
        out[field.name] = value
    return out


def _no_effect(name, value):
    return (name, None) in NO_EFFECT or (isinstance(value, (str, int, float, bool))
                                         and (name, value) in NO_EFFECT)


def _repeated(field):
    return field.label == field.LABEL_REPEATED if hasattr(field, "label") else field.is_repeated


class _Translator(DataLayers):
    def __init__(self, file, data):
        self.file, self.data = file, data
        self.problems = []
        self.shape = None
        if data is not None:
            kind, _, shape = str(data).partition(":")
            if kind != "synthetic":
                raise SpecError(f"--data {data}: a Caffe net's Data layers can be replaced by "
                                f"'synthetic' or 'synthetic:CxHxW' only")
            if shape:
                try:
                    self.shape = tuple(int(d) for d in shape.lower().split("x"))
                    assert len(self.shape) == 3 and min(self.shape) > 0
                except (ValueError, AssertionError):
                    raise SpecError(f"--data {data}: expected synthetic:CxHxW, such as synthetic:3x32x32") from None

    def problem(self, mark, layer, ltype, message):
        self.problems.append(where(self.file, *mark, layer, ltype) + message)

    def net(self, net, pos):
        root = Map()
        root.mark = (1, 1)
        if net.HasField("name"):
            root["name"] = net.name
            root.keymarks["name"] = root.valmarks["name"] = pos.at("name")
        if net.input:
            self.inputs(net, pos, root)
        layers = Seq()
        layers.mark = pos.at("layer") if net.layer else pos.at("layers")
        if net.layer and net.layers:
            self.problem(pos.at("layers"), None, None, "a net has either 'layer' blocks or the old "
                         "'layers' blocks, not both")
        raw = [(lp, pos.child("layer", i), False) for i, lp in enumerate(net.layer)]
        raw += [(lp, pos.child("layers", i), True) for i, lp in enumerate(net.layers)]
        self.all = [(self.type_of(lp, v1), lp) for lp, _, v1 in raw]
        sources = {}  # (name, rules) of layers without bottoms → how many so far
        for lp, lpos, v1 in raw:
            item = self.layer(lp, lpos, v1)
            if isinstance(item, list):  # a fork's layer read as two of ours (BN)
                for part in item:
                    layers.append(part)
                    layers.marks.append(part.mark)
                continue
            if item is not None and not lp.bottom and "name" in item:
                # Caffe allows one name for several layers (LRCN's ImageData and HDF5Data are
                # both "data"); ours are keys, so a later source layer of a name already used
                # under the same rules is called name.2, name.3 (it has no weights to match)
                key = (item["name"], str(item.get("include")), str(item.get("exclude")))
                sources[key] = sources.get(key, 0) + 1
                if sources[key] > 1:
                    item["name"] = f"{item['name']}.{sources[key]}"
            if item is not None:
                layers.append(item)
                layers.marks.append(item.mark)
        root["layers"] = layers
        root.keymarks["layers"] = root.valmarks["layers"] = layers.mark
        if self.problems:
            raise SpecError(self.problems)
        return root

    def inputs(self, net, pos, root):
        """``input: "data"`` with ``input_shape { dim: ... }`` or four ``input_dim`` each."""
        shapes = [list(s.dim) for s in net.input_shape]
        if not shapes and net.input_dim:
            dims = list(net.input_dim)
            if len(dims) != 4 * len(net.input):
                self.problem(pos.at("input_dim"), None, None, f"{len(dims)} input_dim values for "
                             f"{len(net.input)} input(s); Caffe wants four (N, C, H, W) per input")
                return
            shapes = [dims[4 * i:4 * i + 4] for i in range(len(net.input))]
        if len(shapes) != len(net.input):
            self.problem(pos.at("input"), None, None, f"{len(net.input)} input(s) but {len(shapes)} "
                         "shape(s): give one input_shape (or four input_dim) per input")
            return
        inp = Map()
        inp.mark = pos.at("input")
        for i, (name, shape) in enumerate(zip(net.input, shapes)):
            inp[name] = shape
            inp.keymarks[name] = inp.valmarks[name] = pos.at("input", i)
        root["input"] = inp
        root.keymarks["input"] = root.valmarks["input"] = inp.mark

    @staticmethod
    def type_of(lp, v1):
        if v1:
            name = caffe_pb2.V1LayerParameter.LayerType.Name(lp.type)
            return V1_TYPES.get(name, name)
        return FORK_TYPES.get(lp.type, lp.type)

    def layer(self, lp, lpos, v1):
        ltype = self.type_of(lp, v1)
        item = Map()
        item.mark = lpos.mark

        def put(key, value, field):
            item[key] = value
            item.keymarks[key] = item.valmarks[key] = lpos.at(field)

        for key in ("name", "type", "bottom", "top"):
            if key == "type":
                if lp.HasField("type"):
                    put("type", ltype, "type")
            elif key == "name":
                if lp.HasField("name"):
                    put("name", lp.name, "name")
            elif getattr(lp, key):
                put(key, list(getattr(lp, key)), key)
        for key in ("include", "exclude"):
            rules = getattr(lp, key)
            if rules:
                put(key, [_message(r) for r in rules], key)
        if lp.loss_weight:
            put("loss_weight", [f32(w) for w in lp.loss_weight], "loss_weight")
        if v1:
            if lp.blobs_lr:
                put("lr_mult", [f32(v) for v in lp.blobs_lr], "blobs_lr")
            if lp.weight_decay:
                put("decay_mult", [f32(v) for v in lp.weight_decay], "weight_decay")
        elif lp.param:
            put("param", [_message(p) for p in lp.param], "param")
        if not v1 and lp.propagate_down:
            self.propagate_down(lp, lpos, ltype)
        if ltype in DATA_TYPES:
            return self.data_layer(lp, lpos, item, ltype)
        if ltype == "BN":
            return bn_layers(lp, lpos, item, _message, f32)
        if ltype == "DenseImageData":
            return dense_image_data(self, lp, lpos, item)
        if ltype == "Input" and lp.HasField("input_param"):
            shapes = [list(s.dim) for s in lp.input_param.shape]
            if len(shapes) == 1 and len(lp.top) > 1:
                shapes = shapes * len(lp.top)  # Caffe: one shape serves every top
            item["shape"] = shapes
            item.keymarks["shape"] = item.valmarks["shape"] = lpos.child("input_param").at("shape")
            return item
        for field, msg in lp.ListFields():
            if field.name in (V1_FIELDS if v1 else LAYER_FIELDS):
                continue
            if field.type != field.TYPE_MESSAGE or _repeated(field):
                put(field.name, _scalar(field, msg) if not _repeated(field) else None, field.name)
                continue  # the loader reports it as a key this layer does not take
            self.flatten(msg, lpos.child(field.name), item, ltype)
        return item

    def propagate_down(self, lp, lpos, ltype):
        """Caffe's ``propagate_down``: accepted where it says what we do anyway (no gradient to
        a label bottom, as MultiBoxLoss's priors and boxes); a ``false`` on a bottom that would
        get one is refused."""
        cls = REGISTRY.get(ltype)
        if cls is None:
            return  # the unknown type is reported by itself
        if len(lp.propagate_down) != len(lp.bottom):
            self.problem(lpos.at("propagate_down"), lp.name, ltype, f"{len(lp.propagate_down)} propagate_down "
                         f"for {len(lp.bottom)} bottoms: give one per bottom")
            return
        for i, (flag, bottom) in enumerate(zip(lp.propagate_down, lp.bottom)):
            if not flag and i not in cls.LABEL_BOTTOMS and cls.BACKWARD:
                self.problem(lpos.at("propagate_down", i), lp.name, ltype, f"propagate_down: false on "
                             f"bottom '{bottom}' is not supported (it would get a gradient here)")

    def flatten(self, msg, mpos, item, ltype):
        """Put a ``*_param`` block's fields into the layer mapping, as our YAML writes them."""
        for field, value in msg.ListFields():
            name = field.name
            if name in NESTED and field.type == field.TYPE_MESSAGE:
                self.flatten(value, mpos.child(name), item, ltype)
                continue
            if _repeated(field):
                value = [_scalar(field, v) for v in value]
                if name in PAIR_FIELDS and len(value) in (1, 2):
                    value = value[0] if len(value) == 1 else value
            else:
                value = _scalar(field, value)
            if _no_effect(name, value):
                continue
            if name == "round_mode":  # BVLC's spelling of the forks' ceil_mode
                name, value = "ceil_mode", value == "CEIL"
            name = RENAMED.get(name, name)
            if name in item:
                self.problem(mpos.at(field.name), item.get("name"), ltype,
                             f"'{field.name}' is given twice (as {name})")
                continue
            item[name] = value
            item.keymarks[name] = item.valmarks[name] = mpos.at(field.name)

def is_prototxt(path):
    """Whether ``path`` names a Caffe text net (by its extension)."""
    return os.fspath(path).lower().endswith(".prototxt")


def add_loss(root):
    """Make a deploy net trainable, as its train_val would be: a ``label`` input beside its
    data, and the final Softmax replaced by a SoftmaxWithLoss on the same scores (a net that
    ends without a Softmax gets the loss on its last top). Changes ``root`` in place."""
    layers = root["layers"]
    if not layers:
        raise SpecError("--add-loss: the net has no layers")
    if any(str(item.get("type", "")).endswith("Loss") for item in layers):
        raise SpecError("--add-loss: the net already has a loss layer")
    inputs = root.get("input")
    if isinstance(inputs, Map) and inputs:
        batch = next(iter(inputs.values()))[0]
        if "label" in inputs:
            raise SpecError("--add-loss: the net already has an input named 'label'")
        inputs["label"] = [batch]
    else:
        first = layers[0]
        if first.get("type") != "Input":
            raise SpecError("--add-loss: the net's first layer is not an Input layer (a net with "
                            "Data layers has its labels already)")
        first["top"] = list(first["top"]) + ["label"]
        first["shape"] = list(first["shape"]) + [[first["shape"][0][0]]]
    last = layers[-1]
    loss = Map({"name": "loss", "type": "SoftmaxWithLoss"})
    loss.mark = last.mark
    if last.get("type") == "Softmax":
        loss["bottom"] = [last["bottom"][0] if isinstance(last["bottom"], list) else last["bottom"], "label"]
        layers[-1] = loss
    else:
        top = last["top"][0] if isinstance(last["top"], list) else last["top"]
        loss["bottom"] = [top, "label"]
        layers.append(loss)
        layers.marks.append(loss.mark)
    loss["top"] = ["loss"]
    return root
