"""What feeds a net: the data source fitted to the net's input, opened and checked against it,
and the loaders that batch it (sn-train parses ``--data`` and calls these; data.py reads the
sources themselves).

    side = fixed_side(spec, "train.npz", size_given=False)   # 28: re-load the spec with size=28
    cfg = data_config(spec, "digits")                        # None for an Input net without --data
    cfg, train_set, test_set = open_data(net, cfg)
    train_loader, test_loader = loaders(cfg, train_set, test_set, net.batch, seed=0)
"""

from ..errors import SNError
from .batches import Loader
from .readahead import ReadAhead
from .sources import check_labels, describe, open_source, source_config, source_kind

FIXED_SIZE = ("npz", "cifar")        # sources whose samples have one size, which size cannot change
RESIZED = ("digits", "synthetic", "folder")   # sources that make samples of any size
READ_AHEAD = ("lmdb", "imagelist")   # decoded per batch: read ahead on a thread


def fixed_side(spec, source, size_given=False):
    """The side of ``source``'s samples that ``spec``'s ``size`` parameter should take, or
    None: when the source has one fixed size (.npz, CIFAR), its samples are square, the net
    has a ``size`` parameter that differs and the user did not give it (``size_given``), so
    that a LeNet whose default size is 32 trains on 28x28 samples as they are."""
    if not source or "size" not in spec.params or source_kind(source) not in FIXED_SIZE or size_given:
        return None
    (_, h, w), _ = describe({"source": source})
    if h != w or spec.params["size"] == h:
        return None
    return h


def data_config(spec, source=None):
    """The Data layer's configuration with ``source`` (a ``--data`` value, or None) replacing
    its own, or for an Input net the ``source``'s, sized to the input where the source makes
    samples of any size (None for an Input net without a source: see :func:`synthetic_like`).
    SNError when a source that makes square samples meets an input that is not square."""
    first = spec.layers[0]
    if first.type in ("HDF5Data", "MemoryData"):
        raise SNError(f"layer '{first.name}' ({first.type}): sn-train feeds Input and Data layers; train a "
                      f"{first.type} net from Python (Net.train_step with a feed of its tops)")
    if first.type == "Data":
        if source:
            first.cfg.update(source_config(source, first.cfg))
            if source_kind(source) in FIXED_SIZE:  # the net's size was meant for its own source
                first.cfg["size"] = 0
        return first.cfg
    if not source:
        return None
    shape = first.cfg["shape"][0]
    base = {"batch_size": shape[0]}
    kind = source_kind(source)
    if kind == "text" and len(shape) == 2:
        base["size"] = shape[1]  # tokens per window
    if kind in RESIZED and len(shape) == 4:
        if shape[2] != shape[3]:
            raise SNError(f"{source}: {kind} data is made square, but the net's input "
                          f"'{first.tops[0]}' is {shape[2]}x{shape[3]}")
        base["size"] = shape[2]  # images: the shorter side resized to it, the centre (or a random) square cut
        if kind in ("synthetic", "digits"):
            base["channels"] = shape[1]  # digits: the grey replicated over the channels the net expects
    shapes = first.cfg["shape"]
    if kind == "synthetic" and len(shapes) > 1 and len(shapes[1]) == 4 and shapes[1][:2] == (1, 1) \
            and shapes[1][3] == 8 and shapes[1][2] % shape[0] == 0:
        base["boxes"] = shapes[1][2] // shape[0]  # SSD's label blob: images with boxes (box_data.py)
    return source_config(source, base)


def synthetic_like(net, classes):
    """Learnable synthetic data with the shape and classes (None: 10) of an Input net."""
    shape = net.input_shape(net.input_names[0])
    if len(shape) != 4 or shape[2] != shape[3]:
        raise SNError(f"input '{net.input_names[0]}' has shape {shape}: pass --data (synthetic data "
                      f"is made for square images only)")
    cfg = source_config("synthetic", {"batch_size": shape[0]})
    cfg.update(channels=shape[1], size=shape[2], classes=classes or 10)
    return cfg


def check_sample_shape(net, dataset, source):
    """SNError unless ``dataset``'s samples have the shape of ``net``'s first input."""
    name = net.input_names[0]
    want = tuple(net.input_shape(name)[1:])
    if tuple(dataset.sample_shape) != want:
        raise SNError(f"{source}: samples have shape {tuple(dataset.sample_shape)}; the net's input "
                      f"'{name}' expects {want}")


def open_data(net, cfg):
    """``(cfg, train set, test set)``: the source of ``cfg`` (from :func:`data_config`; None:
    synthetic data like the net's input) opened, its labels checked against the net's
    classes and its samples against the net's input."""
    if not net.input_names:
        makers = ", ".join(f"'{n.name}'" for n in net.graph.nodes if not n.bottoms)
        raise SNError(f"net '{net.graph.name}' makes its own data (layer {makers}): sn-train feeds a net through "
                      f"its Input or Data layer; train this one from Python (Net.train_step)")
    classes = net.classes
    if cfg is None:  # an Input net: synthetic data shaped like its input, with its classes
        cfg = synthetic_like(net, classes)
    elif source_kind(cfg["source"]) == "synthetic" and classes is not None:
        cfg = dict(cfg, classes=classes)  # made to fit the net: as many classes as its loss scores
    train_set, test_set = open_source(cfg)
    if classes is not None:
        check_labels(train_set, classes, cfg["source"])
        check_labels(test_set, classes, cfg["source"])
    check_sample_shape(net, train_set, cfg["source"])
    return cfg, train_set, test_set


def loaders(cfg, train_set, test_set, batch, seed=0, shard=(0, 1)):
    """``(train loader, test loader or None)`` of ``batch`` samples: the training set
    shuffled (unless ``cfg`` says ``shuffle: false``) by ``seed`` and read ahead on a thread
    where its source decodes per batch; the test set in order, None when it is empty.
    ``shard``: ``(rank, ranks)``: ``batch`` is the global batch, of which the training loader
    gives rank ``rank``'s part (batches.Loader); the test loader's batch is then one rank's."""
    train = Loader(train_set, batch, shuffle=cfg.get("shuffle", True), seed=seed, train=True, shard=shard)
    if source_kind(cfg["source"]) in READ_AHEAD:
        train = ReadAhead(train)
    test_batch = batch // shard[1]
    test = Loader(test_set, test_batch, shuffle=False, seed=seed, train=False) if len(test_set) else None
    return train, test
