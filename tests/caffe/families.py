"""Real model-zoo files beyond classification, written here layer for layer as their authors
wrote them (no model zoo can be downloaded in the test environment; the files are not copied,
only their layout re-created): FCN-8s (shelhamer/fcn.berkeleyvision.org voc-fcn8s/train.prototxt,
its Python data layer included), the LSTM language model and LRCN of BVLC/caffe's
examples/coco_caption. Each takes its sizes as arguments, so a test trains it small and plans
it at the real size."""

from zoo import LR, block, layer

FROZEN = ([("lr_mult", 0)],)


# -- FCN-8s (voc-fcn8s/train.prototxt, written by its net.py) ------------------------------------------
def _conv_relu(name, relu_name, bottom, n, k=3, pad=1):
    return [layer(name, "Convolution", bottom, name, param=LR,
                  convolution_param=[("num_output", n), ("pad", pad), ("kernel_size", k)]),
            layer(relu_name, "ReLU", name, name)]


def _max_pool(name, bottom):
    return layer(name, "Pooling", bottom, name, pooling_param=[("pool", "MAX"), ("kernel_size", 2), ("stride", 2)])


def _upscore(name, bottom, k, s):
    return layer(name, "Deconvolution", bottom, name, param=FROZEN, convolution_param=[
        ("num_output", 21), ("bias_term", False), ("kernel_size", k), ("stride", s)])


def _score(name, bottom):
    return layer(name, "Convolution", bottom, name, param=LR,
                 convolution_param=[("num_output", 21), ("pad", 0), ("kernel_size", 1)])


def _crop(name, bottom, like, offset):
    return layer(name, "Crop", [bottom, like], name, crop_param=[("axis", 2), ("offset", offset)])


def fcn8s(data="python", size=500, batch=1, narrow=1):
    """voc-fcn8s/train.prototxt. ``data``: ``"python"`` as the file has it (the voc_layers
    module's SBDDSegDataLayer), or ``"input"``: Input layers of ``batch`` x 3 x ``size`` x
    ``size`` images and their label maps (deploy.prototxt's form, with the loss kept).
    ``narrow``: every width but the 21 classes' divided by it (a test's quick training)."""
    if data == "python":
        params = ("{'sbdd_dir': '../data/sbdd/dataset', 'seed': 1337, 'split': 'train', "
                  "'mean': (104.00699, 116.66877, 122.67892)}")
        out = [layer("data", "Python", (), ["data", "label"], python_param=[
            ("module", "voc_layers"), ("layer", "SBDDSegDataLayer"), ("param_str", params)])]
    else:
        out = [layer("input", "Input", (), ["data", "label"], input_param=[
            ("shape", [("dim", d) for d in (batch, 3, size, size)]),
            ("shape", [("dim", d) for d in (batch, 1, size, size)])])]
    bottom = "data"
    for stage, (width, convs) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], start=1):
        for i in range(1, convs + 1):
            name = f"conv{stage}_{i}"
            out += _conv_relu(name, f"relu{stage}_{i}", bottom, width // narrow, pad=100 if name == "conv1_1" else 1)
            bottom = name
        out.append(_max_pool(f"pool{stage}", bottom))
        bottom = f"pool{stage}"
    out += _conv_relu("fc6", "relu6", "pool5", 4096 // narrow, k=7, pad=0)
    out.append(layer("drop6", "Dropout", "fc6", "fc6", dropout_param=[("dropout_ratio", 0.5)]))
    out += _conv_relu("fc7", "relu7", "fc6", 4096 // narrow, k=1, pad=0)
    out.append(layer("drop7", "Dropout", "fc7", "fc7", dropout_param=[("dropout_ratio", 0.5)]))
    out += [_score("score_fr", "fc7"), _upscore("upscore2", "score_fr", 4, 2),
            _score("score_pool4", "pool4"), _crop("score_pool4c", "score_pool4", "upscore2", 5),
            layer("fuse_pool4", "Eltwise", ["upscore2", "score_pool4c"], "fuse_pool4",
                  eltwise_param=[("operation", "SUM")]),
            _upscore("upscore_pool4", "fuse_pool4", 4, 2),
            _score("score_pool3", "pool3"), _crop("score_pool3c", "score_pool3", "upscore_pool4", 9),
            layer("fuse_pool3", "Eltwise", ["upscore_pool4", "score_pool3c"], "fuse_pool3",
                  eltwise_param=[("operation", "SUM")]),
            _upscore("upscore8", "fuse_pool3", 16, 8), _crop("score", "upscore8", "data", 31),
            layer("loss", "SoftmaxWithLoss", ["score", "label"], "loss",
                  loss_param=[("ignore_label", 255), ("normalize", False)])]
    return 'name: "voc-fcn8s"\n' + "\n".join(out) + "\n"


# -- coco_caption: the LSTM language model and LRCN ---------------------------------------------------
UNIFORM = [("type", "uniform"), ("min", -0.08), ("max", 0.08)]
ZERO = [("type", "constant"), ("value", 0)]
SENTENCE = ["cont_sentence", "input_sentence", "target_sentence"]
STAGES = {"TRAIN": None, "test-on-train": "train", "test-on-val": "val"}


def _rule(phase, stage):
    return [("phase", phase)] + ([("stage", stage)] if stage else [])


def _sentences(folder, steps):
    """The three HDF5Data layers (TRAIN, TEST test-on-train, TEST test-on-val)."""
    out = []
    for phase, stage in (("TRAIN", None), ("TEST", "test-on-train"), ("TEST", "test-on-val")):
        split = "val" if stage == "test-on-val" else "train"
        out.append(layer("data", "HDF5Data", (), SENTENCE, include=_rule(phase, stage), hdf5_data_param=[
            ("source", f"{folder}/{split}/hdf5_chunk_list.txt"), ("batch_size", steps)]))
    return out


def _embed(vocab, hidden):
    return layer("embedding", "Embed", "input_sentence", "embedded_input_sentence", param=([("lr_mult", 1)],),
                 embed_param=[("bias_term", False), ("input_dim", vocab), ("num_output", hidden),
                              ("weight_filler", UNIFORM)])


def _lstm(name, bottoms, hidden, include=()):
    kw = {"include": list(include)} if include else {}
    return layer(name, "LSTM", bottoms, name, **kw, recurrent_param=[
        ("num_output", hidden), ("weight_filler", UNIFORM), ("bias_filler", ZERO)])


def _predict(bottom, vocab, **rule):
    return layer("predict", "InnerProduct", bottom, "predict", param=LR, **rule, inner_product_param=[
        ("num_output", vocab), ("weight_filler", UNIFORM), ("bias_filler", ZERO), ("axis", 2)])


def _loss_and_accuracy(accuracy_block):
    loss = layer("cross_entropy_loss", "SoftmaxWithLoss", ["predict", "target_sentence"], "cross_entropy_loss",
                 loss_weight=20, loss_param=[("ignore_label", -1)], softmax_param=[("axis", 2)])
    accuracy = layer("accuracy", "Accuracy", ["predict", "target_sentence"], "accuracy",
                     include=[("phase", "TEST")], **{accuracy_block: [("ignore_label", -1)] + (
                         [("axis", 2)] if accuracy_block == "accuracy_param" else [])})
    return [loss, accuracy]


def lstm_language_model(folder=".", steps=20, vocab=8801, hidden=1000, accuracy_block="loss_param"):
    """examples/coco_caption/lstm_language_model.prototxt: HDF5Data of ``steps`` time steps,
    Embed, LSTM, dropout by stage, the predictions over the vocabulary. The file writes its
    TEST-phase Accuracy's ignore_label in a loss_param block, which Accuracy does not read, and
    no axis: 2, so Caffe's test net fails its label-count check (as our planner does);
    ``accuracy_block="accuracy_param"`` writes it as lrcn.prototxt does (axis 2, ignore -1)."""
    out = _sentences(folder, steps) + [_embed(vocab, hidden)]
    out.append(layer("embed-drop", "Dropout", "embedded_input_sentence", "embedded_input_sentence",
                     dropout_param=[("dropout_ratio", 0.5)], include=[("stage", "embed-drop")]))
    out.append(_lstm("lstm1", ["embedded_input_sentence", "cont_sentence"], hidden))
    out.append(layer("lstm-drop", "Dropout", "lstm1", "lstm1", dropout_param=[("dropout_ratio", 0.5)],
                     include=[("stage", "lstm-drop")]))
    out.append(_predict("lstm1", vocab))
    out += _loss_and_accuracy(accuracy_block)
    return 'name: "lstm_language_model"\n' + "\n".join(out) + "\n"


CAFFENET = [  # name, num_output, kernel, stride, pad, group, bias value; then pool / LRN after it
    ("conv1", 96, 11, 4, 0, 1, 0), ("conv2", 256, 5, 1, 2, 2, 1), ("conv3", 384, 3, 1, 1, 1, 0),
    ("conv4", 384, 3, 1, 1, 2, 1), ("conv5", 256, 3, 1, 1, 2, 1)]


def _frozen_or_not(kind, name, bottom, shape, std, bias, param_block):
    """LRCN's pair of layers of one name: frozen in stage freeze-convnet (no fillers), trained
    at a tenth of the rate otherwise."""
    frozen = layer(name, kind, bottom, name, param=(FROZEN[0], FROZEN[0]), include=[("stage", "freeze-convnet")],
                   **{param_block: shape})
    trained = layer(name, kind, bottom, name, param=([("lr_mult", 0.1), ("decay_mult", 1)],
                                                     [("lr_mult", 0.2), ("decay_mult", 0)]),
                    exclude=[("stage", "freeze-convnet")], **{param_block: shape + [
                        ("weight_filler", [("type", "gaussian"), ("std", std)]),
                        ("bias_filler", [("type", "constant"), ("value", bias)])]})
    return [frozen, trained]


def lrcn(folder=".", steps=20, streams=100, crop=227, vocab=8801, hidden=1000, narrow=1):
    """examples/coco_caption/lrcn.prototxt: CaffeNet on the images (ImageData, ``streams`` of
    them), frozen or not by stage, its fc8 the static input of the LSTM (lstm1 "unfactored", or
    lstm2 "factored"), the caption's words from HDF5Data of ``steps`` time steps. ``narrow``
    divides CaffeNet's widths up to fc7 (a test's quick training)."""
    out = []
    for phase, stage in (("TRAIN", None), ("TEST", "test-on-train"), ("TEST", "test-on-val")):
        split = "val" if stage == "test-on-val" else "train"
        tp = [("mirror", True), ("crop_size", crop), ("mean_value", 104), ("mean_value", 117), ("mean_value", 123)]
        out.append(layer("data", "ImageData", (), ["data", "label"], include=_rule(phase, stage),
                         transform_param=tp, image_data_param=[
                             ("source", f"{folder}/{split}/image_list.with_dummy_labels.txt"),
                             ("batch_size", streams), ("new_height", 256), ("new_width", 256)]))
        out.append(layer("data", "HDF5Data", (), SENTENCE, include=_rule(phase, stage), hdf5_data_param=[
            ("source", f"{folder}/{split}/hdf5_chunk_list.txt"), ("batch_size", steps)]))
    out.append(layer("silence", "Silence", "label", ()))
    bottom = "data"
    for i, (name, n, k, s, p, g, bias) in enumerate(CAFFENET, start=1):
        shape = [("num_output", n // narrow)] + ([("pad", p)] if p else []) + [("kernel_size", k)]
        shape += ([("stride", s)] if s != 1 else []) + ([("group", g)] if g != 1 else [])
        out += _frozen_or_not("Convolution", name, bottom, shape, 0.01, bias, "convolution_param")
        out.append(layer(f"relu{i}", "ReLU", name, name))
        bottom = name
        if i in (1, 2, 5):
            out.append(layer(f"pool{i}", "Pooling", name, f"pool{i}", pooling_param=[
                ("pool", "MAX"), ("kernel_size", 3), ("stride", 2)]))
            bottom = f"pool{i}"
        if i in (1, 2):
            out.append(layer(f"norm{i}", "LRN", bottom, f"norm{i}", lrn_param=[
                ("local_size", 5), ("alpha", 0.0001), ("beta", 0.75)]))
            bottom = f"norm{i}"
    for i in (6, 7):
        out += _frozen_or_not("InnerProduct", f"fc{i}", bottom, [("num_output", 4096 // narrow)], 0.005, 1,
                              "inner_product_param")
        out += [layer(f"relu{i}", "ReLU", f"fc{i}", f"fc{i}"),
                layer(f"drop{i}", "Dropout", f"fc{i}", f"fc{i}", dropout_param=[("dropout_ratio", 0.5)])]
        bottom = f"fc{i}"
    out.append(layer("fc8", "InnerProduct", "fc7", "fc8", param=([("lr_mult", 0.1), ("decay_mult", 1)],
                                                                [("lr_mult", 0.2), ("decay_mult", 0)]),
                     inner_product_param=[("num_output", 1000),
                                          ("weight_filler", [("type", "gaussian"), ("std", 0.01)]),
                                          ("bias_filler", ZERO)]))
    out.append(_embed(vocab, hidden))
    words = ["embedded_input_sentence", "cont_sentence"]
    out += [_lstm("lstm1", words + ["fc8"], hidden, [("stage", "unfactored")]),
            _lstm("lstm2", ["lstm1", "cont_sentence"], hidden, [("stage", "unfactored"), ("stage", "2-layer")]),
            _lstm("lstm1", words, hidden, [("stage", "factored")]),
            _lstm("lstm2", ["lstm1", "cont_sentence", "fc8"], hidden, [("stage", "factored")]),
            _predict("lstm1", vocab, exclude=[("stage", "2-layer")]),
            _predict("lstm2", vocab, include=[("stage", "2-layer")])]
    out += _loss_and_accuracy("accuracy_param")
    return 'name: "lrcn_caffenet_to_lstm"\n' + "\n".join(out) + "\n"


__all__ = ["block", "enet", "fcn8s", "lrcn", "lstm_language_model", "pspnet50", "segnet", "segnet_basic"]


# -- SegNet (alexgkendall/SegNet-Tutorial Models/segnet_basic_train.prototxt) -----------------------
CAMVID_WEIGHTS = (0.2595, 0.1826, 4.5640, 0.1417, 0.9051, 0.3826, 9.6446, 1.8418, 0.6823, 6.2478, 7.3614)


def _seg_conv(name, bottom, n, k=7, pad=3):
    return layer(name, "Convolution", bottom, name, param=LR, convolution_param=[
        ("num_output", n), ("kernel_size", k)] + ([("pad", pad)] if pad else []) + [
        ("weight_filler", [("type", "msra")]), ("bias_filler", [("type", "constant")])])


def _seg_bn(name, top):
    """The SegNet fork's BN layer, in place."""
    return layer(name, "BN", top, top, bn_param=[("scale_filler", [("type", "constant"), ("value", 1)]),
                                                 ("shift_filler", [("type", "constant"), ("value", 0.001)])])


def segnet_basic(batch=4, classes=11):
    """Models/segnet_basic_train.prototxt: DenseImageData (read here as an Input of the shape
    ``data=synthetic:CxHxW`` gives), LRN, four 7x7 encoders (convolution, BN, ReLU, MAX pooling
    with its mask), four decoders (Upsample by the mask, 7x7 convolution, BN), the classifier,
    the class-weighted loss (CamVid's 11 weights, label 11 ignored) and Accuracy with its
    per-class top."""
    out = [layer("data", "DenseImageData", (), ["data", "label"], dense_image_data_param=[
        ("source", "/SegNet/CamVid/train.txt"), ("batch_size", batch), ("shuffle", True)]),
        layer("norm", "LRN", "data", "norm", lrn_param=[("local_size", 5), ("alpha", 0.0001), ("beta", 0.75)])]
    bottom = "norm"
    for i in range(1, 5):
        out += [_seg_conv(f"conv{i}", bottom, 64), _seg_bn(f"conv{i}_bn", f"conv{i}"),
                layer(f"relu{i}", "ReLU", f"conv{i}", f"conv{i}"),
                layer(f"pool{i}", "Pooling", f"conv{i}", [f"pool{i}", f"pool{i}_mask"], pooling_param=[
                    ("pool", "MAX"), ("kernel_size", 2), ("stride", 2)])]
        bottom = f"pool{i}"
    for i in range(4, 0, -1):
        up = [("scale", 2)] + ([("pad_out_h", True)] if i == 4 else [])
        out += [layer(f"upsample{i}", "Upsample", [bottom, f"pool{i}_mask"], f"upsample{i}", upsample_param=up),
                _seg_conv(f"conv_decode{i}", f"upsample{i}", 64), _seg_bn(f"conv_decode{i}_bn", f"conv_decode{i}")]
        bottom = f"conv_decode{i}"
    out += [_seg_conv("conv_classifier", bottom, classes, k=1, pad=0),
            layer("loss", "SoftmaxWithLoss", ["conv_classifier", "label"], "loss", loss_param=[
                ("weight_by_label_freqs", True), ("ignore_label", classes)]
                + [("class_weighting", w) for w in CAMVID_WEIGHTS[:classes]]),
            layer("accuracy", "Accuracy", ["conv_classifier", "label"], ["accuracy", "per_class_accuracy"])]
    return 'name: "segnet"\n' + "\n".join(out) + "\n"


# -- PSPNet (hszhao/PSPNet evaluation/prototxt/pspnet50_ADE20K_473.prototxt) -------------------------
def _psp_bn(name, top, lr=1):
    """PSPNet's BN: four blobs (scale, shift, then the statistics, not learned), a moving average."""
    return layer(name, "BN", top, top, param=([("lr_mult", lr), ("decay_mult", 0)],
                                              [("lr_mult", lr), ("decay_mult", 0)],
                                              [("lr_mult", 0), ("decay_mult", 0)], [("lr_mult", 0), ("decay_mult", 0)]),
                 bn_param=[("scale_filler", [("type", "constant"), ("value", 1)]),
                           ("shift_filler", [("type", "constant"), ("value", 0)]),
                           ("moving_average", True), ("decay", 0.05)])


def _psp_conv(name, bottom, n, k, s=1, pad=0, hole=1, lr=1, bias=False, relu=True):
    cp = [("num_output", n), ("pad", pad)] if pad or k > 1 else [("num_output", n), ("pad", 0)]
    cp += [("kernel_size", k), ("stride", s)]
    if hole > 1:
        cp.insert(2, ("hole", hole))
    cp.append(("weight_filler", [("type", "msra")]))
    if not bias:
        cp.append(("bias_term", False))
    out = [layer(name, "HoleConvolution" if hole > 1 else "Convolution", bottom, name,
                 param=([("lr_mult", lr), ("decay_mult", 1)],), convolution_param=cp), _psp_bn(f"{name}/bn", name, lr)]
    if relu:
        out.append(layer(f"{name}/relu", "ReLU", name, name))
    return out


def pspnet50(size=473, feature=60, classes=150, narrow=1, loss=False, batch=1):
    """evaluation/prototxt/pspnet50_ADE20K_473.prototxt: a dilated ResNet-50 with a three-conv
    stem (BN layers of PSPNet's fork, HoleConvolution for the dilated 3x3s), the pyramid pooling
    module (AVE pools of the ``feature`` map's whole, half, third and sixth, each 1x1 conv, BN,
    ReLU and Interp back to ``feature``), conv5_4, conv6 and Interp by 8. ``size`` and
    ``feature`` (473 and 60 in the file; 41 and 6 for a quick run) must agree:
    ``feature = ceil(ceil((size - 1) / 2 + 1) / 2) / 2``. ``narrow`` divides every width but the
    classes; ``loss`` adds a per-pixel label input and SoftmaxWithLoss (ignore 255)."""
    w = lambda c: c // narrow  # noqa: E731
    out = ['input: "data"\n' + "".join(f"input_dim: {d}\n" for d in (batch, 3, size, size))]
    if loss:
        out[0] += 'input: "label"\n' + "".join(f"input_dim: {d}\n" for d in (batch, 1, size, size))
    out += _psp_conv("conv1_1_3x3_s2", "data", w(64), 3, 2, 1)
    out += _psp_conv("conv1_2_3x3", "conv1_1_3x3_s2", w(64), 3, 1, 1)
    out += _psp_conv("conv1_3_3x3", "conv1_2_3x3", w(128), 3, 1, 1)
    out.append(layer("pool1_3x3_s2", "Pooling", "conv1_3_3x3", "pool1_3x3_s2", pooling_param=[
        ("pool", "MAX"), ("kernel_size", 3), ("stride", 2), ("pad", 1)]))
    bottom = "pool1_3x3_s2"
    for stage, (blocks, mid, hole) in enumerate([(3, 64, 1), (4, 128, 1), (6, 256, 2), (3, 512, 4)], start=2):
        for b in range(1, blocks + 1):
            tag, stride = f"conv{stage}_{b}", 2 if stage == 3 and b == 1 else 1
            out += _psp_conv(f"{tag}_1x1_reduce", bottom, w(mid), 1, stride)
            out += _psp_conv(f"{tag}_3x3", f"{tag}_1x1_reduce", w(mid), 3, 1, hole, hole)
            out += _psp_conv(f"{tag}_1x1_increase", f"{tag}_3x3", w(4 * mid), 1, relu=False)
            short = bottom
            if b == 1:
                out += _psp_conv(f"{tag}_1x1_proj", bottom, w(4 * mid), 1, stride, relu=False)
                short = f"{tag}_1x1_proj"
            out += [layer(tag, "Eltwise", [short, f"{tag}_1x1_increase"], tag, eltwise_param=[("operation", "SUM")]),
                    layer(f"{tag}/relu", "ReLU", tag, tag)]
            bottom = tag
    pyramid = []
    for level in (1, 2, 3, 6):
        name = f"conv5_3_pool{level}"
        out.append(layer(name, "Pooling", "conv5_3", name, pooling_param=[
            ("pool", "AVE"), ("kernel_size", feature // level), ("stride", feature // level)]))
        out += _psp_conv(f"{name}_conv", name, w(512), 1, lr=10)
        out.append(layer(f"{name}_interp", "Interp", f"{name}_conv", f"{name}_interp",
                         interp_param=[("height", feature), ("width", feature)]))
        pyramid.append(f"{name}_interp")
    out.append(layer("conv5_3_concat", "Concat", ["conv5_3"] + pyramid[::-1], "conv5_3_concat"))
    out += _psp_conv("conv5_4", "conv5_3_concat", w(512), 3, 1, 1, lr=10)
    out.append(layer("conv5_4/dropout", "Dropout", "conv5_4", "conv5_4", dropout_param=[("dropout_ratio", 0.1)]))
    out.append(layer("conv6", "Convolution", "conv5_4", "conv6", param=([("lr_mult", 10), ("decay_mult", 1)],
                                                                         [("lr_mult", 20), ("decay_mult", 1)]),
                     convolution_param=[("num_output", classes), ("kernel_size", 1), ("stride", 1),
                                        ("weight_filler", [("type", "msra")])]))
    out.append(layer("conv6_interp", "Interp", "conv6", "conv6_interp", interp_param=[("zoom_factor", 8)]))
    if loss:
        out.append(layer("loss", "SoftmaxWithLoss", ["conv6_interp", "label"], "loss",
                         loss_param=[("ignore_label", 255)]))
    return "#\n" + "\n".join(out) + "\n"


# -- ENet (TimoSaemann/ENet prototxts/enet_train_encoder_decoder.prototxt) -------------------------
def _enet_bn(name, bottom):
    """ENet's BN: the SegNet fork's, not in place (its top is its own name)."""
    return layer(name, "BN", bottom, name, param=([("lr_mult", 1), ("decay_mult", 1)],
                                                  [("lr_mult", 1), ("decay_mult", 0)]),
                 bn_param=[("scale_filler", [("type", "constant"), ("value", 1)]),
                           ("shift_filler", [("type", "constant"), ("value", 0.001)]), ("bn_mode", "LEARN")])


def _enet_conv(name, bottom, n, k=1, s=1, pad=0, bias=False, dilation=1, kernel_hw=None, deconv=False):
    cp = [("num_output", n), ("bias_term", bias)]
    if pad:
        cp.append(("pad", pad))
    if kernel_hw is None:
        cp.append(("kernel_size", k))
    cp.append(("stride", s))
    if not deconv:
        cp.append(("weight_filler", [("type", "msra")]))
    if dilation > 1:
        cp.append(("dilation", dilation))
    if kernel_hw is not None:
        cp += [("kernel_h", kernel_hw[0]), ("kernel_w", kernel_hw[1])]
    return layer(name, "Deconvolution" if deconv else "Convolution", bottom, name, convolution_param=cp)


def _enet_drop(name, bottom, p):
    return layer(name, "Python", bottom, name, python_param=[
        ("module", "spatial_dropout"), ("layer", "SpatialDropoutLayer"),
        ("param_str", "{'phase': 'TRAIN', 'p': '%s'}" % p)])


def _enet_block(tag, bottom, inner, out, p, act, kind="regular", dilation=1, skip_from=None, mask=None):
    """One bottleneck: 1x1 (2x2 stride 2 to go down, then 3x3), the middle conv (regular,
    dilated, asymmetric 5x1 then 1x5, or a 2x2 Deconvolution to go up), 1x1 to ``out``, spatial
    dropout, the side branch (MAX pool with mask and 1x1 going down; 1x1 and Upsample by the
    mask going up), Eltwise, activation (PReLU in the encoder, ReLU in the decoder)."""
    out_layers = []
    first = _enet_conv(f"conv{tag}_0", bottom, inner, *((2, 2) if kind == "down" else (1, 1)))
    out_layers += [first, _enet_bn(f"bn{tag}_0", f"conv{tag}_0"),
                   layer(f"prelu{tag}_0", act, f"bn{tag}_0", f"prelu{tag}_0")]
    middle = f"conv{tag}_1"
    if kind == "asym":
        out_layers += [_enet_conv(f"conv{tag}_1_a", f"prelu{tag}_0", inner, pad=1, kernel_hw=(5, 1)),
                       _enet_conv(middle, f"conv{tag}_1_a", inner, pad=1, bias=True, kernel_hw=(1, 5))]
    elif kind == "up":
        middle = f"deconv{tag}_1"
        out_layers.append(_enet_conv(middle, f"prelu{tag}_0", inner, 2, 2, bias=True, deconv=True))
    else:
        out_layers.append(_enet_conv(middle, f"prelu{tag}_0", inner, 3, 1, dilation if dilation > 1 else 1, True,
                                     dilation))
    out_layers += [_enet_bn(f"bn{tag}_1", middle), layer(f"prelu{tag}_1", act, f"bn{tag}_1", f"prelu{tag}_1"),
                   _enet_conv(f"conv{tag}_2", f"prelu{tag}_1", out), _enet_bn(f"bn{tag}_2", f"conv{tag}_2"),
                   _enet_drop(f"drop{tag}_3", f"bn{tag}_2", p)]
    side = skip_from
    if kind == "down":
        out_layers += [layer(f"pool{tag}_4", "Pooling", bottom, [f"pool{tag}_4", f"pool{tag}_4_mask"], pooling_param=[
            ("pool", "MAX"), ("kernel_size", 2), ("stride", 2)]),
            _enet_conv(f"conv{tag}_4", f"pool{tag}_4", out), _enet_bn(f"bn{tag}_4", f"conv{tag}_4")]
        side = f"bn{tag}_4"
    elif kind == "up":
        out_layers += [_enet_conv(f"conv{tag}_4", bottom, out), _enet_bn(f"bn{tag}_4", f"conv{tag}_4"),
                       layer(f"upsample{tag}_4", "Upsample", [f"bn{tag}_4", mask], f"upsample{tag}_4",
                             upsample_param=[("scale", 2)])]
        side = f"upsample{tag}_4"
    out_layers += [layer(f"eltwise{tag}_4", "Eltwise", [f"drop{tag}_3", side], f"eltwise{tag}_4"),
                   layer(f"prelu{tag}_4", act, f"eltwise{tag}_4", f"prelu{tag}_4")]
    return out_layers, f"prelu{tag}_4"


ENET_STAGE = [("regular", 1), ("dilated", 2), ("asym", 1), ("dilated", 4),
              ("regular", 1), ("dilated", 8), ("asym", 1), ("dilated", 16)]


def enet(batch=3, classes=19, height=512, width=1024):
    """prototxts/enet_train_encoder_decoder.prototxt: DenseImageData (``new_height`` x
    ``new_width``), the initial block (3x3 stride-2 conv concatenated with a MAX pool), five
    stages of bottlenecks (1.0 down + 4 regular, 2.0 down + 8 of regular, dilated 2/4/8/16 and
    asymmetric 5 convs, stage 3 the same eight, 4.0 up + 2, 5.0 up + 1) with the SegNet fork's BN,
    PReLU (encoder) and ReLU (decoder), spatial dropout as a Python layer, a final 2x2
    Deconvolution to the classes, the loss (255 ignored) and Accuracy with its per-class top."""
    out = [layer("data", "DenseImageData", (), ["data", "label"], dense_image_data_param=[
        ("source", "ENet/dataset/train_fine_2columns.txt"), ("batch_size", batch), ("shuffle", True),
        ("new_height", height), ("new_width", width), ("label_divide_factor", 1)]),
        _enet_conv("conv0_1", "data", 13, 3, 2, 1, True),
        layer("pool0_1", "Pooling", "data", "pool0_1",
              pooling_param=[("pool", "MAX"), ("kernel_size", 2), ("stride", 2)]),
        layer("concat0_1", "Concat", ["conv0_1", "pool0_1"], "concat0_1", concat_param=[("axis", 1)]),
        _enet_bn("bn0_1", "concat0_1"), layer("prelu0_1", "PReLU", "bn0_1", "prelu0_1")]
    block, bottom = _enet_block("1_0", "prelu0_1", 16, 64, 0.01, "PReLU", "down")
    out += block
    for i in range(1, 5):
        block, bottom = _enet_block(f"1_{i}", bottom, 16, 64, 0.01, "PReLU", skip_from=bottom)
        out += block
    block, bottom = _enet_block("2_0", bottom, 32, 128, 0.1, "PReLU", "down")
    out += block
    for stage in (2, 3):
        for i, (kind, dilation) in enumerate(ENET_STAGE, start=1):
            block, bottom = _enet_block(f"{stage}_{i}", bottom, 32, 128, 0.1, "PReLU",
                                        "regular" if kind == "dilated" else kind, dilation, skip_from=bottom)
            out += block
    decoder = ((4, (16, 64, "pool2_0_4_mask", 2)), (5, (4, 16, "pool1_0_4_mask", 1)))
    for stage, (inner, width_out, mask, regular) in decoder:
        block, bottom = _enet_block(f"{stage}_0", bottom, inner, width_out, 0.1, "ReLU", "up", mask=mask)
        out += block
        for i in range(1, regular + 1):
            block, bottom = _enet_block(f"{stage}_{i}", bottom, inner, width_out, 0.1, "ReLU", skip_from=bottom)
            out += block
    out += [_enet_conv("deconv6_0_0", bottom, classes, 2, 2, bias=True, deconv=True),
            layer("loss", "SoftmaxWithLoss", ["deconv6_0_0", "label"], "loss", loss_param=[
                ("ignore_label", 255), ("weight_by_label_freqs", False)]),
            layer("accuracy", "Accuracy", ["deconv6_0_0", "label"], ["accuracy", "per_class_accuracy"])]
    return 'name: "ENet"\n' + "\n".join(out) + "\n"


def _pooled(side, times):
    """A side after ``times`` MAX poolings of 2 (Caffe rounds up)."""
    for _ in range(times):
        side = -(-side // 2)
    return side


def segnet(batch=4, classes=11, height=360, width=480, narrow=1):
    """Models/segnet_train.prototxt: VGG-16's 13 convolutions as the encoder (each with the
    fork's BN and a ReLU, each MAX pooling with its mask), the mirrored decoder (Upsample by the
    masks, the first two with the sizes written for CamVid's 360x480, ``upsample_h``/``_w``:
    pool4's and pool3's; 3x3 convolutions with BN and ReLU), conv1_1_D to the classes, the
    class-weighted loss and Accuracy with its per-class top. ``narrow`` divides every width but
    the classes' (a test's quick training)."""
    out = [layer("data", "DenseImageData", (), ["data", "label"], dense_image_data_param=[
        ("source", "/SegNet/CamVid/train.txt"), ("batch_size", batch), ("shuffle", True)])]

    def conv_bn_relu(name, bottom, n, bn=True):
        cp = [("weight_filler", [("type", "msra")]), ("bias_filler", [("type", "constant")]),
              ("num_output", n), ("pad", 1), ("kernel_size", 3)]
        items = [layer(name, "Convolution", bottom, name, param=LR, convolution_param=cp)]
        if bn:
            relu_name = "relu" + name[4:]
            items += [_seg_bn(f"{name}_bn", name), layer(relu_name, "ReLU", name, name)]
        return items

    vgg = [(64 // narrow, 2), (128 // narrow, 2), (256 // narrow, 3), (512 // narrow, 3), (512 // narrow, 3)]
    bottom = "data"
    for stage, (n, convs) in enumerate(vgg, start=1):
        for i in range(1, convs + 1):
            out += conv_bn_relu(f"conv{stage}_{i}", bottom, n)
            bottom = f"conv{stage}_{i}"
        out.append(layer(f"pool{stage}", "Pooling", bottom, [f"pool{stage}", f"pool{stage}_mask"],
                         pooling_param=[("pool", "MAX"), ("kernel_size", 2), ("stride", 2)]))
        bottom = f"pool{stage}"
    for stage in range(5, 0, -1):
        n, convs = vgg[stage - 1]
        up = [("scale", 2)]
        if stage in (5, 4):  # the sizes of pool4 and pool3, written out (23x30 and 45x60 for 360x480)
            up += [("upsample_w", _pooled(width, stage - 1)), ("upsample_h", _pooled(height, stage - 1))]
        out.append(layer(f"upsample{stage}", "Upsample", [bottom, f"pool{stage}_mask"], f"pool{stage}_D",
                         upsample_param=up))
        bottom = f"pool{stage}_D"
        for i in range(convs, 0, -1):
            last = i == 1
            width_out = (vgg[stage - 2][0] if stage > 1 else classes) if last else n
            name = f"conv{stage}_{i}_D"
            out += conv_bn_relu(name, bottom, width_out, bn=not (stage == 1 and last))
            bottom = name
    out += [layer("loss", "SoftmaxWithLoss", [bottom, "label"], "loss", loss_param=[
        ("weight_by_label_freqs", True), ("ignore_label", classes)]
        + [("class_weighting", w) for w in CAMVID_WEIGHTS[:classes]]),
        layer("accuracy", "Accuracy", [bottom, "label"], ["accuracy", "per_class_accuracy"])]
    return 'name: "VGG_ILSVRC_16_layer"\n' + "\n".join(out) + "\n"
