"""The layers of Caffe's forks that a ``.prototxt`` may name and that are read as ours:
SegNet's, ENet's and PSPNet's ``BN`` (a BatchNorm and a Scale), SegNet's and ENet's
``DenseImageData`` (an Input of the images' shape), PSPNet's ``HoleConvolution`` (a
Convolution; its ``hole`` is read as ``dilation`` by the translator)."""

from ..yaml_read import Map
from . import caffe_pb2

FORK_TYPES = {"HoleConvolution": "Convolution"}  # a fork's type that is one of ours under another name


def bn_layers(lp, lpos, item, message, f32):
    """The BN layer of SegNet's, PSPNet's and ENet's forks (normalisation with its own scale
    and shift, blobs scale, shift[, mean, variance]) as our BatchNorm and a Scale after it,
    in place on its top, named NAME and NAME.scale: the same learnable blobs (2 per channel).
    The first two ``param`` blocks go to the Scale; the statistics' are not learnable.
    ``bn_mode: INFERENCE`` is ``use_global_stats``; PSPNet's ``decay`` d is
    ``moving_average_fraction`` 1 - d. ``message`` and ``f32``: the translator's readings of a
    nested message and of a float field (prototxt.py's)."""
    bp, bpos = lp.bn_param, lpos.child("bn_param")
    name, top = item.get("name"), (list(lp.top) or list(lp.bottom))[:1]
    norm = Map({k: item[k] for k in ("name", "type", "bottom", "top", "include", "exclude") if k in item})
    norm.mark = item.mark
    for k in norm:
        norm.keymarks[k], norm.valmarks[k] = item.keymarks[k], item.valmarks[k]
    norm["type"] = "BatchNorm"
    settings = {"use_global_stats": bp.bn_mode == caffe_pb2.BNParameter.INFERENCE}
    if bp.HasField("var_eps") and bp.var_eps > 0:
        settings["eps"] = f32(bp.var_eps)
    if bp.HasField("decay"):
        settings["moving_average_fraction"] = f32(1.0 - bp.decay)
    scale = Map({"name": f"{name}.scale", "type": "Scale", "bottom": top, "top": top, "bias_term": True})
    scale.mark = item.mark
    if bp.HasField("scale_filler"):
        scale["filler"] = message(bp.scale_filler)
    if bp.HasField("shift_filler"):
        scale["bias_filler"] = message(bp.shift_filler)
    if lp.param:
        scale["param"] = [message(p) for p in lp.param[:2]]
    for k in ("include", "exclude"):
        if k in item:
            scale[k] = item[k]
    for target, values in ((norm, settings), (scale, {})):
        target.update(values)
        for k in target:
            target.keymarks.setdefault(k, bpos.mark)
            target.valmarks.setdefault(k, bpos.mark)
    return [norm, scale]


def dense_image_data(reader, lp, lpos, item):
    """SegNet's and ENet's DenseImageData (images and their label images) as an Input of
    their shapes: ``data=synthetic:CxHxW`` gives them (or ``new_height``/``new_width``
    with ``data=synthetic``); the label is (N, 1, H, W), one class per pixel."""
    p, name = lp.dense_image_data_param, item.get("name")
    if reader.data is None:
        reader.problem(lpos.mark, name, "DenseImageData", "the SegNet fork's image reader is not "
                       "implemented: plan and train with --data synthetic:CxHxW (its images' shape)")
        return None
    if reader.shape is not None:
        c, h, w = reader.shape
    elif p.new_height and p.new_width:
        c, h, w = (3 if p.is_color else 1), p.new_height, p.new_width
    else:
        reader.problem(lpos.mark, name, "DenseImageData", "the images' shape is not written: give it "
                       "as --data synthetic:CxHxW, such as synthetic:3x360x480")
        return None
    n, factor = p.batch_size or 1, max(1, p.label_divide_factor)
    shapes = [[n, c, h, w], [n, 1, h // factor, w // factor]][:len(lp.top)]
    item["type"] = "Input"
    item["shape"] = shapes
    item.keymarks["shape"] = item.valmarks["shape"] = lpos.mark
    return item
