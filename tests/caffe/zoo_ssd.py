"""SSD's detection nets written as their .prototxt files are, layer for layer: chuanqi305's
MobileNet-SSD (MobileNetSSD_deploy.prototxt: BatchNorm merged into biased convolutions;
MobileNetSSD_train.prototxt: AnnotatedData, BatchNorm + Scale, MultiBoxLoss) and weiliu89's
SSD300 (VGG_VOC0712_SSD_300x300 deploy.prototxt: VGG-16 with a dilated fc6, Normalize on
conv4_3). Generated here, as tests/caffe/zoo.py does for the classification zoo, since no model
zoo can be downloaded in the test environment; ``size`` and ``batch`` shrink them for tests."""

from zoo import layer

LR = ([("lr_mult", 1.0), ("decay_mult", 1.0)], [("lr_mult", 2.0), ("decay_mult", 0.0)])


class Quoted(str):
    """A string field written in quotes even when upper-case (``output_format: "VOC"``)."""

    def isupper(self):
        return False


VARIANCE = [("variance", v) for v in (0.1, 0.1, 0.2, 0.2)]
PERMUTE = [("order", o) for o in (0, 2, 3, 1)]


def conv(name, bottom, n, k, s=1, p=0, group=1, bias=True, filler="msra", dilation=1, top=None, write_pad=False):
    cp = [("num_output", n)] + ([("bias_term", False)] if not bias else [])
    cp += [("pad", p)] if p or write_pad else []
    cp += [("kernel_size", k)] + ([("stride", s)] if s != 1 or write_pad else [])
    cp += [("group", group), ("engine", "CAFFE")] if group != 1 else []
    cp += [("weight_filler", [("type", filler)])]
    cp += [("bias_filler", [("type", "constant"), ("value", 0.0)])] if bias else []
    cp += [("dilation", dilation)] if dilation != 1 else []
    return layer(name, "Convolution", bottom, top or name, param=LR if bias else LR[:1], convolution_param=cp)


def bn_scale(top):
    frozen = tuple([("lr_mult", 0), ("decay_mult", 0)] for _ in range(3))
    return "\n".join([
        layer(f"{top}/bn", "BatchNorm", top, top, param=frozen),
        layer(f"{top}/scale", "Scale", top, top, param=([("lr_mult", 0.1), ("decay_mult", 0.0)],
                                                          [("lr_mult", 0.2), ("decay_mult", 0.0)]),
              scale_param=[("filler", [("value", 1)]), ("bias_term", True), ("bias_filler", [("value", 0)])])])


def relu(name, top):
    return layer(name, "ReLU", top, top)


def head(source, n_loc, n_conf, prior, k=1, filler="msra"):
    """The loc and conf convolutions of a feature map, permuted and flattened, and its PriorBox."""
    out = []
    for kind, n in (("loc", n_loc), ("conf", n_conf)):
        name = f"{source}_mbox_{kind}"
        out += [conv(name, source, n, k, p=k // 2, filler=filler, write_pad=k == 3),
                layer(f"{name}_perm", "Permute", name, f"{name}_perm", permute_param=PERMUTE),
                layer(f"{name}_flat", "Flatten", f"{name}_perm", f"{name}_flat", flatten_param=[("axis", 1)])]
    out.append(layer(f"{source}_mbox_priorbox", "PriorBox", [source, "data"], f"{source}_mbox_priorbox",
                     prior_box_param=prior + [("flip", True), ("clip", False)] + VARIANCE + [("offset", 0.5)]))
    return out


def joins(sources):
    return [layer("mbox_loc", "Concat", [f"{s}_mbox_loc_flat" for s in sources], "mbox_loc",
                  concat_param=[("axis", 1)]),
            layer("mbox_conf", "Concat", [f"{s}_mbox_conf_flat" for s in sources], "mbox_conf",
                  concat_param=[("axis", 1)]),
            layer("mbox_priorbox", "Concat", [f"{s}_mbox_priorbox" for s in sources], "mbox_priorbox",
                  concat_param=[("axis", 2)])]


def detection_out(classes, top_k, keep, threshold, save=False):
    nms = [("nms_threshold", 0.45), ("top_k", top_k)]
    save_output = [("save_output_param", [("output_directory", "results/VOC2007/SSD_300x300/Main"),
                                          ("output_name_prefix", "comp4_det_test_"), ("output_format", Quoted("VOC")),
                                          ("label_map_file", "data/VOC0712/labelmap_voc.prototxt"),
                                          ("name_size_file", "data/VOC0712/test_name_size.txt"),
                                          ("num_test_image", 4952)])] if save else []
    return [layer("mbox_conf_reshape", "Reshape", "mbox_conf", "mbox_conf_reshape",
                  reshape_param=[("shape", [("dim", 0), ("dim", -1), ("dim", classes)])]),
            layer("mbox_conf_softmax", "Softmax", "mbox_conf_reshape", "mbox_conf_softmax",
                  softmax_param=[("axis", 2)]),
            layer("mbox_conf_flatten", "Flatten", "mbox_conf_softmax", "mbox_conf_flatten",
                  flatten_param=[("axis", 1)]),
            layer("detection_out", "DetectionOutput", ["mbox_loc", "mbox_conf_flatten", "mbox_priorbox"],
                  "detection_out",
                  include=[("phase", "TEST")],
                  detection_output_param=[("num_classes", classes), ("share_location", True),
                                          ("background_label_id", 0), ("nms_param", nms)] + save_output
                  + [("code_type", "CENTER_SIZE"), ("keep_top_k", keep), ("confidence_threshold", threshold)])]


def input_block(name, size, batch):
    return f'name: "{name}"\ninput: "data"\ninput_shape {{\n  dim: {batch}\n  dim: 3\n  dim: {size}\n  dim: {size}\n}}'


# -- MobileNet-SSD (chuanqi305) ---------------------------------------------------------------------
MOBILE = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1), (512, 1),
          (512, 1), (1024, 2), (1024, 1)]
EXTRAS = [(14, 256, 512), (15, 128, 256), (16, 128, 256), (17, 64, 128)]
RATIOS_2_3 = [("aspect_ratio", 2.0), ("aspect_ratio", 3.0)]
MOBILE_HEADS = [("conv11", 12, 63, [("min_size", 60.0), ("aspect_ratio", 2.0)]),
                ("conv13", 24, 126, [("min_size", 105.0), ("max_size", 150.0)] + RATIOS_2_3),
                ("conv14_2", 24, 126, [("min_size", 150.0), ("max_size", 195.0)] + RATIOS_2_3),
                ("conv15_2", 24, 126, [("min_size", 195.0), ("max_size", 240.0)] + RATIOS_2_3),
                ("conv16_2", 24, 126, [("min_size", 240.0), ("max_size", 285.0)] + RATIOS_2_3),
                ("conv17_2", 24, 126, [("min_size", 285.0), ("max_size", 300.0)] + RATIOS_2_3)]


def _mobile_body(train):
    """conv0 .. conv17_2: with BatchNorm and Scale after bias-free convolutions (train), or the
    deploy file's merged form (biased convolutions, no BatchNorm)."""
    out = []

    def unit(name, bottom, n, k, s=1, p=0, group=1):
        out.append(conv(name, bottom, n, k, s, p, group, bias=not train))
        if train:
            out.append(bn_scale(name))
        out.append(relu(f"{name}/relu", name))

    unit("conv0", "data", 32, 3, 2, 1)
    bottom, cin = "conv0", 32
    for i, (cout, stride) in enumerate(MOBILE, 1):
        unit(f"conv{i}/dw", bottom, cin, 3, stride, 1, group=cin)
        unit(f"conv{i}", f"conv{i}/dw", cout, 1)
        bottom, cin = f"conv{i}", cout
    for i, mid, cout in EXTRAS:
        unit(f"conv{i}_1", bottom, mid, 1)
        unit(f"conv{i}_2", f"conv{i}_1", cout, 3, 2, 1)
        bottom = f"conv{i}_2"
    return out


def mobilenet_ssd_deploy(size=300, batch=1):
    out = [input_block("MobileNet-SSD", size, batch)] + _mobile_body(train=False)
    for source, n_loc, n_conf, prior in MOBILE_HEADS:
        out += head(source, n_loc, n_conf, prior)
    out += joins([h[0] for h in MOBILE_HEADS]) + detection_out(21, 100, 100, 0.3)
    return "\n".join(out) + "\n"


def annotated_data(size, batch, mean=(127.5,) * 3, scale=0.007843):
    tp = ([("scale", scale)] if scale else []) + [("mirror", True)] + [("mean_value", m) for m in mean] + [
        ("resize_param", [("prob", 1.0), ("resize_mode", "WARP"), ("height", size), ("width", size),
                          ("interp_mode", "LINEAR"), ("interp_mode", "AREA")]),
        ("emit_constraint", [("emit_type", "CENTER")]),
        ("distort_param", [("brightness_prob", 0.5), ("brightness_delta", 32.0), ("contrast_prob", 0.5),
                           ("contrast_lower", 0.5), ("contrast_upper", 1.5), ("hue_prob", 0.5), ("hue_delta", 18.0),
                           ("saturation_prob", 0.5), ("saturation_lower", 0.5), ("saturation_upper", 1.5),
                           ("random_order_prob", 0.0)]),
        ("expand_param", [("prob", 0.5), ("max_expand_ratio", 4.0)])]
    samplers = tuple([("sampler", [("min_scale", 0.3), ("max_scale", 1.0), ("min_aspect_ratio", 0.5),
                                   ("max_aspect_ratio", 2.0)]),
                      ("sample_constraint", [("min_jaccard_overlap", j)]), ("max_sample", 1), ("max_trials", 50)]
                     for j in (0.1, 0.3, 0.5, 0.7, 0.9))
    adp = [("batch_sampler", [("max_sample", 1), ("max_trials", 1)])] + [("batch_sampler", s) for s in samplers]
    adp.append(("label_map_file", "../../data/VOC0712/labelmap.prototxt"))
    return layer("data", "AnnotatedData", (), ["data", "label"], include=[("phase", "TRAIN")], transform_param=tp,
                 data_param=[("source", "/home/yaochuanqi/data/VOCdevkit/VOC0712/lmdb/VOC0712_trainval_lmdb/"),
                             ("batch_size", batch), ("backend", "LMDB")],
                 annotated_data_param=adp)


def multibox_loss(classes=21, train_only=True):
    phase = {"include": [("phase", "TRAIN")]} if train_only else {}
    return layer("mbox_loss", "MultiBoxLoss", ["mbox_loc", "mbox_conf", "mbox_priorbox", "label"], "mbox_loss",
                 **phase, propagate_down=(True, True, False, False),
                 loss_param=[("normalization", "VALID")],
                 multibox_loss_param=[("loc_loss_type", "SMOOTH_L1"), ("conf_loss_type", "SOFTMAX"),
                                      ("loc_weight", 1.0),
                                      ("num_classes", classes), ("share_location", True),
                                      ("match_type", "PER_PREDICTION"), ("overlap_threshold", 0.5),
                                      ("use_prior_for_matching", True), ("background_label_id", 0),
                                      ("use_difficult_gt", True), ("neg_pos_ratio", 3.0), ("neg_overlap", 0.5),
                                      ("code_type", "CENTER_SIZE"), ("ignore_cross_boundary_bbox", False),
                                      ("mining_type", "MAX_NEGATIVE")])


def mobilenet_ssd_train(size=300, batch=32):
    out = ['name: "MobileNet-SSD"', annotated_data(size, batch)] + _mobile_body(train=True)
    for source, n_loc, n_conf, prior in MOBILE_HEADS:
        out += head(source, n_loc, n_conf, prior)
    out += joins([h[0] for h in MOBILE_HEADS]) + [multibox_loss()]
    return "\n".join(out) + "\n"


# -- SSD300 (weiliu89's VGG_VOC0712_SSD_300x300 deploy.prototxt) -------------------------------------
SSD300_HEADS = [("conv4_3_norm", 16, 84, [("min_size", 30.0), ("max_size", 60.0), ("aspect_ratio", 2), ("step", 8)]),
                ("fc7", 24, 126, [("min_size", 60.0), ("max_size", 111.0), ("aspect_ratio", 2), ("aspect_ratio", 3),
                                  ("step", 16)]),
                ("conv6_2", 24, 126, [("min_size", 111.0), ("max_size", 162.0), ("aspect_ratio", 2),
                                      ("aspect_ratio", 3),
                                      ("step", 32)]),
                ("conv7_2", 24, 126, [("min_size", 162.0), ("max_size", 213.0), ("aspect_ratio", 2),
                                      ("aspect_ratio", 3),
                                      ("step", 64)]),
                ("conv8_2", 16, 84, [("min_size", 213.0), ("max_size", 264.0), ("aspect_ratio", 2), ("step", 100)]),
                ("conv9_2", 16, 84, [("min_size", 264.0), ("max_size", 315.0), ("aspect_ratio", 2), ("step", 300)])]


def _ssd300_body():
    out, bottom = [], "data"
    for b, (n, reps) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], 1):
        for r in range(1, reps + 1):
            name = f"conv{b}_{r}"
            out += [conv(name, bottom, n, 3, p=1, filler="xavier", dilation=1), relu(f"relu{b}_{r}", name)]
            bottom = name
        if b < 5:
            out.append(layer(f"pool{b}", "Pooling", bottom, f"pool{b}",
                             pooling_param=[("pool", "MAX"), ("kernel_size", 2), ("stride", 2)]))
            bottom = f"pool{b}"
    out += [layer("pool5", "Pooling", "conv5_3", "pool5",
                  pooling_param=[("pool", "MAX"), ("kernel_size", 3), ("stride", 1), ("pad", 1)]),
            conv("fc6", "pool5", 1024, 3, p=6, filler="xavier", dilation=6), relu("relu6", "fc6"),
            conv("fc7", "fc6", 1024, 1, filler="xavier"), relu("relu7", "fc7")]
    bottom = "fc7"
    for i, mid, cout, s, p in ((6, 256, 512, 2, 1), (7, 128, 256, 2, 1), (8, 128, 256, 1, 0), (9, 128, 256, 1, 0)):
        out += [conv(f"conv{i}_1", bottom, mid, 1, filler="xavier", write_pad=True),
                relu(f"conv{i}_1_relu", f"conv{i}_1"),
                conv(f"conv{i}_2", f"conv{i}_1", cout, 3, s, p, filler="xavier", write_pad=True),
                relu(f"conv{i}_2_relu", f"conv{i}_2")]
        bottom = f"conv{i}_2"
    out.append(layer("conv4_3_norm", "Normalize", "conv4_3", "conv4_3_norm",
                     norm_param=[("across_spatial", False), ("scale_filler", [("type", "constant"), ("value", 20)]),
                                 ("channel_shared", False)]))
    for source, n_loc, n_conf, prior in SSD300_HEADS:
        out += head(source, n_loc, n_conf, prior, k=3, filler="xavier")
    return out + joins([h[0] for h in SSD300_HEADS])


def ssd300_deploy(size=300, batch=1):
    out = [input_block("VGG_VOC0712_SSD_300x300_deploy", size, batch)] + _ssd300_body()
    return "\n".join(out + detection_out(21, 400, 200, 0.01, save=True)) + "\n"


def ssd300_train(size=300, batch=32):
    """VGG_VOC0712_SSD_300x300's train.prototxt: AnnotatedData (Caffe's BGR means, no scale),
    the deploy file's layers, MultiBoxLoss."""
    out = ['name: "VGG_VOC0712_SSD_300x300_train"', annotated_data(size, batch, (104, 117, 123), None)]
    return "\n".join(out + _ssd300_body() + [multibox_loss()]) + "\n"


def tiny_ssd(size=16, batch=2, classes=4):
    """A small net of SSD's shape, for the policy-invariance test: a trunk, two feature maps
    with loc and conf heads, PriorBox, the joins, MultiBoxLoss."""
    out = [f'name: "tiny-ssd"\ninput: "data"\ninput_shape {{ dim: {batch} dim: 3 dim: {size} dim: {size} }}\n'
           f'input: "label"\ninput_shape {{ dim: 1 dim: 1 dim: {batch * 2} dim: 8 }}',
           conv("c1", "data", 8, 3, 2, 1), relu("c1/relu", "c1"),
           conv("c2", "c1", 8, 3, 2, 1), bn_scale("c2"), relu("c2/relu", "c2")]
    heads = [("c1", 12, 3 * classes, [("min_size", 4.0), ("aspect_ratio", 2.0)]),  # 3 priors a cell
             ("c2", 16, 4 * classes, [("min_size", 8.0), ("max_size", 12.0), ("aspect_ratio", 2.0)])]  # 4
    for source, n_loc, n_conf, prior in heads:
        out += head(source, n_loc, n_conf, prior, k=3)
    out += joins([h[0] for h in heads])
    out.append(multibox_loss(classes, train_only=False))
    return "\n".join(out) + "\n"
