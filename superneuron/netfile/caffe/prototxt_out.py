"""A checked net (NetSpec and its Graph) written as a Caffe ``.prototxt``: the way back from
YAML to a file a Caffe user can read (``sn-convert net.yaml -o net.prototxt``).

Each layer's keys go back into the ``*_param`` block of Caffe's NetParameter that holds a
field of that name (found in the descriptor of :mod:`.caffe_pb2`, so nothing is spelt twice):
``convolution_param { num_output: 64 ... }``, and ``loss_param`` for a loss layer's
``ignore_label``/``normalize``. Every value that Caffe has a field for is written, defaults
included, since our defaults are not always Caffe's (our Convolution's msra filler, Caffe's
constant 0). A key with no Caffe field is left out where it holds our default and refused
otherwise (it would change what the net computes). Our Data layers (synthetic data, image
folders) have no Caffe form: they are written as Input layers of the shapes they produce, which
plan and compute the same. Read back by :mod:`.prototxt`, the file gives the same layers, the
same parameters and the same plan.
"""

from ...errors import SpecError, where
from ...layers import layer_class
from ..rules import PHASES
from . import caffe_pb2

LAYER = caffe_pb2.LayerParameter.DESCRIPTOR
# Layer types whose parameter block is not spelt as the type in snake case
PARAM_BLOCKS = {"ReLU": "relu_param", "PReLU": "prelu_param", "TanH": "tanh_param", "LRN": "lrn_param",
                "ELU": "elu_param", "ArgMax": "argmax_param", "MVN": "mvn_param", "SPP": "spp_param",
                "Deconvolution": "convolution_param", "SoftmaxWithLoss": "softmax_param",
                "Normalize": "norm_param", "MultiBoxLoss": "multibox_loss_param"}
# blocks inside a *_param whose fields our layers take flat (the SSD fork's nms_param, ...)
NESTED = ("nms_param", "save_output_param")
# (key, value)s that mean "as Caffe does when the field is not written": left out, since
# writing them would say something else (BatchNorm's use_global_stats: false would make Caffe
# normalise a TEST pass by the batch's statistics)
CAFFES_UNSET = {("use_global_stats", False)}


def _snake(name):
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def param_blocks(ltype, is_loss):
    """The names of the LayerParameter fields (``*_param``) that hold a layer type's keys."""
    names = [PARAM_BLOCKS.get(ltype, _snake(ltype) + "_param")]
    if is_loss or ltype == "Accuracy":
        names.append("loss_param")
    return [n for n in names if n in LAYER.fields_by_name]


def _scalar(field, value):
    if field.type == field.TYPE_ENUM:
        return str(value)
    if field.type == field.TYPE_STRING:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if field.type == field.TYPE_BOOL:
        return "true" if value else "false"
    if field.type == field.TYPE_FLOAT or field.type == field.TYPE_DOUBLE:
        return repr(float(value))
    return str(int(value))


def _lines(field, value, pad):
    """Text-format lines of ``field`` holding ``value`` (a filler dict, a shape, a list...)."""
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
    values = list(value) if repeated and isinstance(value, (list, tuple)) else [value]
    out = []
    for v in values:
        if field.type != field.TYPE_MESSAGE:
            out.append(f"{pad}{field.name}: {_scalar(field, v)}")
        elif field.message_type.name == "BlobShape":
            out.append(f"{pad}{field.name} {{ " + " ".join(f"dim: {d}" for d in v) + " }")
        else:  # a filler
            inner = field.message_type.fields_by_name
            body = " ".join(f"{k}: {_scalar(inner[k], x)}" for k, x in v.items() if k in inner)
            out.append(f"{pad}{field.name} {{ {body} }}")
    return out


def _rules(ls):
    """include/exclude lines of a layer: its phases, and its NetState rules as written."""
    rules = getattr(ls, "rules", None)
    if rules:
        out = []
        for key, items in rules:
            for rule in items:
                body = []
                for k, v in rule.items():
                    for one in (v if isinstance(v, (list, tuple)) else [v]):
                        body.append(f'{k}: "{one}"' if k in ("stage", "not_stage") else f"{k}: {one}")
                out.append(f"  {key} {{ " + " ".join(body) + " }")
        return out
    if ls.phases != PHASES:
        return [f"  include {{ phase: {next(iter(ls.phases))} }}"]
    return []


def _nested(names, key):
    """``(block, sub-block, field)`` of a key that lies in a NESTED message of one of the
    layer's blocks (DetectionOutput's ``nms_threshold`` in ``nms_param``), or None."""
    for b in names:
        for sub in NESTED:
            holder = LAYER.fields_by_name[b].message_type.fields_by_name.get(sub)
            if holder is not None and key in holder.message_type.fields_by_name:
                return b, sub, holder.message_type.fields_by_name[key]
    return None


def spec_to_prototxt(spec):
    """The ``.prototxt`` text of ``spec`` (a NetSpec its Graph has checked); SpecError naming
    each layer key that Caffe has no field for."""
    problems = []
    lines = [f'name: "{spec.name}"']
    for ls in spec.layers:
        cls = layer_class(ls.type)
        lines.append("layer {")
        lines.append(f'  name: "{ls.name}"')
        ltype = "Input" if ls.type == "Data" else ls.type
        lines.append(f'  type: "{ltype}"')
        lines += [f'  bottom: "{b}"' for b in ls.bottoms]
        lines += [f'  top: "{t}"' for t in ls.tops]
        lines += _rules(ls)
        if ls.loss_weight is not None:
            lines.append(f"  loss_weight: {float(ls.loss_weight)!r}")
        n = max(len(ls.lr_mult), len(ls.decay_mult))
        for i in range(n):
            lr = ls.lr_mult[i] if i < len(ls.lr_mult) else 1.0
            decay = ls.decay_mult[i] if i < len(ls.decay_mult) else 1.0
            lines.append(f"  param {{ lr_mult: {lr!r} decay_mult: {decay!r} }}")
        if ls.type == "Data":
            # synthetic data, folders, LMDBs as we read them: an Input of the shapes they produce
            data = cls(ls.name, ls.bottoms, ls.tops, ls.cfg)
            dims = data.setup([])  # per layer: a TEST layer's batch may differ from the TRAIN one's
            lines.append("  input_param { " + " ".join(
                "shape { " + " ".join(f"dim: {d}" for d in s) + " }" for s in dims) + " }")
            lines.append("}")
            continue
        blocks, nested = {}, {}
        names = param_blocks(ls.type, cls.LOSS)
        for key, value in ls.cfg.items():
            if value is None or (isinstance(value, bool) and (key, value) in CAFFES_UNSET):
                continue
            if ls.type == "Pooling" and key == "ceil_mode":
                blocks.setdefault("pooling_param", []).append(f"    round_mode: {'CEIL' if value else 'FLOOR'}")
                continue
            if ls.type == "Pooling" and key in ("kernel_size", "stride", "pad") and value[0] != value[1]:
                stem = key.split("_")[0]
                blocks.setdefault("pooling_param", []).extend(
                    [f"    {stem}_h: {value[0]}", f"    {stem}_w: {value[1]}"])
                continue
            if key in ("kernel_size", "stride", "pad", "dilation") and isinstance(value, tuple):
                value = value[:1] if value[0] == value[1] else value
            block = next((b for b in names if key in LAYER.fields_by_name[b].message_type.fields_by_name), None)
            inner = _nested(names, key) if block is None else None
            if inner is not None:
                block, sub, field = inner
                blocks.setdefault(block, [])
                nested.setdefault((block, sub), []).extend(_lines(field, value, ""))
                continue
            if block is None:
                default = cls.KEYS[key].default if key in cls.KEYS else None
                if value != default:
                    problems.append(where(ls.file, ls.line, ls.col, ls.name, ls.type)
                                    + f"'{key}' has no Caffe field: the .prototxt cannot say it")
                continue
            field = LAYER.fields_by_name[block].message_type.fields_by_name[key]
            blocks.setdefault(block, []).extend(_lines(field, value, "    "))
        for block, body in blocks.items():
            lines.append(f"  {block} {{")
            lines += body
            lines += [f"    {sub} {{ " + " ".join(inner) + " }" for (b, sub), inner in nested.items() if b == block]
            lines.append("  }")
        lines.append("}")
    if problems:
        raise SpecError(problems)
    return "\n".join(lines) + "\n"
