"""The layer registry: Caffe type names → layer classes, filled by ``@register`` beside each
class. Its own module, so that a layer module imports it without importing the package that
imports every layer module."""

import difflib

REGISTRY = {}


def register(cls):
    """Class decorator: make ``cls`` available under its class name as a YAML ``type``."""
    cls.type = cls.__name__
    REGISTRY[cls.type] = cls
    return cls


STOCK = "stock Caffe"
# Layer types of Caffe's forks (and stock types) that are not implemented here, with where a
# user's file got them: the error says so in one line, rather than suggesting a near spelling
# ("ROIPooling" is not a misspelt "Pooling").
UNSUPPORTED = {
    **dict.fromkeys(("DetectionEvaluate",), "the SSD fork"),
    "AnnotatedData": "the SSD fork; write Data with boxes: N, the boxes per image, or read the prototxt",
    **dict.fromkeys(("ROIPooling", "Proposal", "ROIAlign", "SmoothL1Loss"), "the Faster R-CNN fork"),
    **dict.fromkeys(("PSROIPooling",), "the R-FCN fork"),
    **dict.fromkeys(("DenseCRF", "SegAccuracy", "ImageSegData"), "the DeepLab fork"),
    **dict.fromkeys(("BN",), "the SegNet and PSPNet forks; a .prototxt's is read as BatchNorm and Scale, "
                             "write those"),
    **dict.fromkeys(("DenseImageData",), "the SegNet fork; a .prototxt's is read as an Input with --data "
                                         "synthetic:CxHxW"),
    **dict.fromkeys(("Region", "Reorg", "Yolo", "YoloLoss"), "a YOLO fork"),
    **dict.fromkeys(("ShuffleChannel",), "a ShuffleNet fork"),
    **dict.fromkeys(("DepthwiseConvolution", "ConvolutionDepthwise"),
                    "a MobileNet fork; write Convolution with group equal to its channels"),
    **dict.fromkeys(("HDF5Output", "WindowData", "Im2col", "Recurrent", "LSTMUnit"), STOCK),
}
CLOSE_ENOUGH = 0.85  # difflib's ratio for a suggestion: a misspelling, not another layer's name


def layer_class(type_name):
    """The class registered as ``type_name``; KeyError with a suggestion when it is unknown:
    a near spelling (case aside), or where a known fork's layer type comes from."""
    try:
        return REGISTRY[type_name]
    except KeyError:
        pass
    if UNSUPPORTED.get(type_name) == STOCK:
        raise KeyError(f"layer type '{type_name}' (stock Caffe) is not implemented here")
    if type_name in UNSUPPORTED:
        raise KeyError(f"layer type '{type_name}' (from {UNSUPPORTED[type_name]}) is not supported")
    known = sorted(t for t in REGISTRY if not REGISTRY[t].__dict__.get("INTERNAL", False))
    lower = {t.lower(): t for t in known}
    close = difflib.get_close_matches(str(type_name).lower(), list(lower), n=1, cutoff=CLOSE_ENOUGH)
    hint = f"; did you mean '{lower[close[0]]}'?" if close else f"; known types: {', '.join(known)}"
    raise KeyError(f"unknown layer type '{type_name}'{hint}") from None
