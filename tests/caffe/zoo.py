"""Model-zoo nets written as their .prototxt files are (Kaiming He's ResNet deploy files, the
VGG team's V1 deploy file, DeepScale's SqueezeNet 1.1, shicai's DenseNet-121 and MobileNet v1,
BVLC's CaffeNet, AlexNet and GoogLeNet train_val, an Inception-v3 deploy file): the files are
generated here, in the same layout, since no model zoo can be downloaded in the test environment."""


QUOTED = ("name", "type", "bottom", "top", "source")  # strings; other upper-case words are enums


class Enum(str):
    """An enum value written bare, such as V1's ``type: CONVOLUTION``."""


def _q(key, value):
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and (key in QUOTED or not value.isupper()):
        return f'"{value}"'
    return str(value)


def block(kind, body, indent=0):
    """A text-format block ``kind { ... }`` from a list of (key, value) or (key, [sub-items])."""
    pad = "  " * indent
    lines = [f"{pad}{kind} {{"]
    for key, value in body:
        if isinstance(value, list):
            lines.append(block(key, value, indent + 1))
        else:
            lines.append(f"{pad}  {key}: {_q(key, value)}")
    lines.append(f"{pad}}}")
    return "\n".join(lines)


def layer(name, ltype, bottom=(), top=(), **params):
    body = [("name", name), ("type", ltype)]
    body += [("bottom", b) for b in ([bottom] if isinstance(bottom, str) else bottom)]
    body += [("top", t) for t in ([top] if isinstance(top, str) else top)]
    for key, value in params.items():
        if isinstance(value, tuple):  # repeated blocks, such as param { } param { }
            body += [(key, v) for v in value]
        else:
            body.append((key, value))
    return block("layer", body)


def conv(name, bottom, top, n, k, s=1, p=0, bias=True, group=1, filler="msra"):
    cp = [("num_output", n), ("kernel_size", k)]
    if p:
        cp.append(("pad", p))
    if s != 1:
        cp.append(("stride", s))
    if group != 1:
        cp.append(("group", group))
    if not bias:
        cp.append(("bias_term", False))
    cp.append(("weight_filler", [("type", filler)]))
    return layer(name, "Convolution", bottom, top, convolution_param=cp)


def bn_scale(name, scale_name, top, stats=True):
    return "\n".join([
        layer(name, "BatchNorm", top, top, batch_norm_param=[("use_global_stats", stats)]),
        layer(scale_name, "Scale", top, top, scale_param=[("bias_term", True)])])


def relu(name, top):
    return layer(name, "ReLU", top, top)


def pool(name, bottom, top, method, k=None, s=1, p=0, glob=False):
    pp = [("pool", method)]
    if glob:
        pp.append(("global_pooling", True))
    else:
        pp += [("kernel_size", k), ("stride", s)] + ([("pad", p)] if p else [])
    return layer(name, "Pooling", bottom, top, pooling_param=pp)


def old_input(name, shape):
    return f'name: "{name}"\ninput: "data"\n' + "".join(f"input_dim: {d}\n" for d in shape)


def input_layer(shape):
    return layer("data", "Input", (), "data", input_param=[("shape", [("dim", d) for d in shape])])


# -- ResNet (Kaiming He's deploy files: BN with global stats, Scale) -------------------------------
def resnet(depth=50, size=224, batch=1, groups=1, group_width=64):
    """Kaiming He's ResNet deploy files: ResNet-50's conv1 has a bias, ResNet-101's and -152's
    have ``bias_term: false``; their stages of more than three blocks name them res3a, res3b1,
    res3b2, ... (ResNet-50's res3a .. res3d). With ``groups`` > 1, ResNeXt (grouped 3x3
    convolutions ``groups`` × ``group_width`` wide, no bias on conv1, as torchvision's)."""
    blocks = {50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}[depth]
    name = f"ResNet-{depth}" if groups == 1 else f"ResNeXt-{depth}-{groups}x{group_width}d"
    out = [old_input(name, (batch, 3, size, size))]
    out += [conv("conv1", "data", "conv1", 64, 7, 2, 3, bias=groups == 1 and depth == 50),
            bn_scale("bn_conv1", "scale_conv1", "conv1"),
            relu("conv1_relu", "conv1"), pool("pool1", "conv1", "pool1", "MAX", 3, 2)]
    bottom = "pool1"
    for stage, count in enumerate(blocks):
        width, out_width = groups * group_width * 2 ** stage, 256 * 2 ** stage
        for i in range(count):
            lettered = depth == 50 or count <= 3 or i == 0
            tag = f"{stage + 2}{chr(ord('a') + i) if lettered else 'b' + str(i)}"
            stride = 2 if i == 0 and stage > 0 else 1
            if i == 0:
                short = f"res{tag}_branch1"
                out += [conv(short, bottom, short, out_width, 1, stride, bias=False),
                        bn_scale(f"bn{tag}_branch1", f"scale{tag}_branch1", short)]
            else:
                short = bottom
            prev = bottom
            for part, (n, k, s, p) in zip("abc", [(width, 1, stride, 0), (width, 3, 1, 1), (out_width, 1, 1, 0)]):
                name = f"res{tag}_branch2{part}"
                out += [conv(name, prev, name, n, k, s, p, bias=False, group=groups if part == "b" else 1),
                        bn_scale(f"bn{tag}_branch2{part}", f"scale{tag}_branch2{part}", name)]
                if part != "c":
                    out.append(relu(f"{name}_relu", name))
                prev = name
            out += [layer(f"res{tag}", "Eltwise", [short, prev], f"res{tag}"), relu(f"res{tag}_relu", f"res{tag}")]
            bottom = f"res{tag}"
    out += [pool("pool5", bottom, "pool5", "AVE", 7 if size == 224 else size // 32, 1),
            layer("fc1000", "InnerProduct", "pool5", "fc1000", inner_product_param=[("num_output", 1000)]),
            layer("prob", "Softmax", "fc1000", "prob")]
    return "\n".join(out) + "\n"


# -- VGG-16 (the VGG team's deploy file: V1 `layers` with enum types) -------------------------------
def v1(name, ltype, bottom, top, **params):
    """A V1 ``layers { }`` block: the type an enum, the fields in the VGG file's order."""
    return block("layers", [("bottom", bottom), ("top", top), ("name", name), ("type", Enum(ltype))]
                 + list(params.items()))


def vgg16(size=224, batch=1):
    out = [old_input("VGG_ILSVRC_16_layers", (batch, 3, size, size))]
    bottom, cfg = "data", [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    for b, (n, reps) in enumerate(cfg, 1):
        for r in range(1, reps + 1):
            name = f"conv{b}_{r}"
            out.append(v1(name, "CONVOLUTION", bottom, name,
                          convolution_param=[("num_output", n), ("pad", 1), ("kernel_size", 3)]))
            out.append(v1(f"relu{b}_{r}", "RELU", name, name))
            bottom = name
        out.append(v1(f"pool{b}", "POOLING", bottom, f"pool{b}",
                      pooling_param=[("pool", "MAX"), ("kernel_size", 2), ("stride", 2)]))
        bottom = f"pool{b}"
    for i, n in ((6, 4096), (7, 4096), (8, 1000)):
        out.append(v1(f"fc{i}", "INNER_PRODUCT", bottom, f"fc{i}", inner_product_param=[("num_output", n)]))
        bottom = f"fc{i}"
        if i < 8:
            out.append(v1(f"relu{i}", "RELU", bottom, bottom))
            out.append(v1(f"drop{i}", "DROPOUT", bottom, bottom, dropout_param=[("dropout_ratio", 0.5)]))
    out.append(v1("prob", "SOFTMAX", "fc8", "prob"))
    return "\n".join(out) + "\n"


# -- SqueezeNet 1.1 (DeepScale's deploy file) --------------------------------------------------------
def squeezenet(size=227, batch=1):
    out = ['name: "SqueezeNet_v1.1"', input_layer((batch, 3, size, size)),
           conv("conv1", "data", "conv1", 64, 3, 2, filler="xavier"), relu("relu_conv1", "conv1"),
           pool("pool1", "conv1", "pool1", "MAX", 3, 2)]
    bottom = "pool1"
    for i, (sq, ex) in zip(range(2, 10), [(16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192),
                                          (64, 256), (64, 256)]):
        f = f"fire{i}"
        out += [conv(f"{f}/squeeze1x1", bottom, f"{f}/squeeze1x1", sq, 1, filler="xavier"),
                relu(f"{f}/relu_squeeze1x1", f"{f}/squeeze1x1"),
                conv(f"{f}/expand1x1", f"{f}/squeeze1x1", f"{f}/expand1x1", ex, 1, filler="xavier"),
                relu(f"{f}/relu_expand1x1", f"{f}/expand1x1"),
                conv(f"{f}/expand3x3", f"{f}/squeeze1x1", f"{f}/expand3x3", ex, 3, p=1, filler="xavier"),
                relu(f"{f}/relu_expand3x3", f"{f}/expand3x3"),
                layer(f"{f}/concat", "Concat", [f"{f}/expand1x1", f"{f}/expand3x3"], f"{f}/concat")]
        bottom = f"{f}/concat"
        if i in (3, 5):
            out.append(pool(f"pool{i}", bottom, f"pool{i}", "MAX", 3, 2))
            bottom = f"pool{i}"
    out += [layer("drop9", "Dropout", bottom, bottom, dropout_param=[("dropout_ratio", 0.5)]),
            conv("conv10", bottom, "conv10", 1000, 1, filler="gaussian"), relu("relu_conv10", "conv10"),
            pool("pool10", "conv10", "pool10", "AVE", glob=True), layer("prob", "Softmax", "pool10", "prob")]
    return "\n".join(out) + "\n"


# -- DenseNet-121 and MobileNet v1 (shicai's deploy files) -------------------------------------------
def densenet121(size=224, batch=1):
    out = ['name: "DENSENET_121"', input_layer((batch, 3, size, size)),
           conv("conv1", "data", "conv1", 64, 7, 2, 3, bias=False), bn_scale("conv1/bn", "conv1/scale", "conv1"),
           relu("relu1", "conv1"), pool("pool1", "conv1", "pool1", "MAX", 3, 2, 1)]
    bottom, channels = "pool1", 64
    for b, count in enumerate([6, 12, 24, 16], 2):
        for i in range(1, count + 1):
            x = f"conv{b}_{i}"
            out += [layer(f"{x}/x1/bn", "BatchNorm", bottom, f"{x}/x1/bn",
                          batch_norm_param=[("eps", 1e-5)]),
                    layer(f"{x}/x1/scale", "Scale", f"{x}/x1/bn", f"{x}/x1/bn", scale_param=[("bias_term", True)]),
                    relu(f"relu{b}_{i}/x1", f"{x}/x1/bn"),
                    conv(f"{x}/x1", f"{x}/x1/bn", f"{x}/x1", 128, 1, bias=False),
                    bn_scale(f"{x}/x2/bn", f"{x}/x2/scale", f"{x}/x1"), relu(f"relu{b}_{i}/x2", f"{x}/x1"),
                    conv(f"{x}/x2", f"{x}/x1", f"{x}/x2", 32, 3, p=1, bias=False),
                    layer(f"concat_{b}_{i}", "Concat", [bottom, f"{x}/x2"], f"concat_{b}_{i}")]
            bottom, channels = f"concat_{b}_{i}", channels + 32
        t = f"conv{b}_blk"
        out += [layer(f"{t}/bn", "BatchNorm", bottom, f"{t}/bn"),
                layer(f"{t}/scale", "Scale", f"{t}/bn", f"{t}/bn", scale_param=[("bias_term", True)]),
                relu(f"relu{b}_blk", f"{t}/bn")]
        if b < 5:
            channels //= 2
            out += [conv(t, f"{t}/bn", t, channels, 1, bias=False), pool(f"pool{b}", t, f"pool{b}", "AVE", 2, 2)]
            bottom = f"pool{b}"
        else:
            bottom = f"{t}/bn"
    out += [pool("pool5", bottom, "pool5", "AVE", glob=True), conv("fc6", "pool5", "fc6", 1000, 1),
            layer("prob", "Softmax", "fc6", "prob")]
    return "\n".join(out) + "\n"


def mobilenet(size=224, batch=1):
    out = ['name: "MOBILENET"', input_layer((batch, 3, size, size)),
           conv("conv1", "data", "conv1", 32, 3, 2, 1, bias=False), bn_scale("conv1/bn", "conv1/scale", "conv1"),
           relu("relu1", "conv1")]
    bottom, cin = "conv1", 32
    plan = [("2_1", 64, 1), ("2_2", 128, 2), ("3_1", 128, 1), ("3_2", 256, 2), ("4_1", 256, 1), ("4_2", 512, 2),
            ("5_1", 512, 1), ("5_2", 512, 1), ("5_3", 512, 1), ("5_4", 512, 1), ("5_5", 512, 1), ("5_6", 1024, 2),
            ("6", 1024, 1)]
    for tag, cout, stride in plan:
        dw, sep = f"conv{tag}/dw", f"conv{tag}/sep"
        out += [conv(dw, bottom, dw, cin, 3, stride, 1, bias=False, group=cin),
                bn_scale(f"{dw}/bn", f"{dw}/scale", dw), relu(f"relu{tag}/dw", dw),
                conv(sep, dw, sep, cout, 1, bias=False), bn_scale(f"{sep}/bn", f"{sep}/scale", sep),
                relu(f"relu{tag}/sep", sep)]
        bottom, cin = sep, cout
    out += [pool("pool6", bottom, "pool6", "AVE", glob=True), conv("fc7", "pool6", "fc7", 1000, 1),
            layer("prob", "Softmax", "fc7", "prob")]
    return "\n".join(out) + "\n"


# -- BVLC's train_val files: data layers in both phases, accuracy in TEST --------------------------
def _data(crop, train_batch, test_batch, mean=(104, 117, 123)):
    out = []
    for phase, batch, lmdb in (("TRAIN", train_batch, "train"), ("TEST", test_batch, "val")):
        tp = [("mirror", phase == "TRAIN"), ("crop_size", crop)] + [("mean_value", m) for m in mean]
        out.append(layer("data", "Data", (), ["data", "label"], include=[("phase", phase)], transform_param=tp,
                         data_param=[("source", f"examples/imagenet/ilsvrc12_{lmdb}_lmdb"), ("batch_size", batch),
                                     ("backend", "LMDB")]))
    return out


LR = (([("lr_mult", 1), ("decay_mult", 1)], [("lr_mult", 2), ("decay_mult", 0)]))


def _conv_tv(name, bottom, n, k, s=1, p=0, group=1, std=0.01, bias=0.0):
    cp = [("num_output", n), ("kernel_size", k)] + ([("pad", p)] if p else []) + ([("stride", s)] if s != 1 else [])
    cp += ([("group", group)] if group != 1 else []) + [("weight_filler", [("type", "gaussian"), ("std", std)]),
                                                       ("bias_filler", [("type", "constant"), ("value", bias)])]
    return layer(name, "Convolution", bottom, name, param=LR, convolution_param=cp)


def _fc(name, bottom, n, std=0.005, bias=0.1):
    return layer(name, "InnerProduct", bottom, name, param=LR, inner_product_param=[
        ("num_output", n), ("weight_filler", [("type", "gaussian"), ("std", std)]),
        ("bias_filler", [("type", "constant"), ("value", bias)])])


def _lrn(name, bottom, top):
    return layer(name, "LRN", bottom, top, lrn_param=[("local_size", 5), ("alpha", 0.0001), ("beta", 0.75)])


def alexnet(caffenet=False, crop=227, batch=256):
    """bvlc_alexnet (norm before pool) or bvlc_reference_caffenet (pool before norm)."""
    out = [f'name: "{"CaffeNet" if caffenet else "AlexNet"}"'] + _data(crop, batch, 50)
    out += [_conv_tv("conv1", "data", 96, 11, 4), relu("relu1", "conv1")]
    first, second = (("pool1", "norm1") if caffenet else ("norm1", "pool1"))
    out += ([pool("pool1", "conv1", "pool1", "MAX", 3, 2), _lrn("norm1", "pool1", "norm1")] if caffenet else
            [_lrn("norm1", "conv1", "norm1"), pool("pool1", "norm1", "pool1", "MAX", 3, 2)])
    out += [_conv_tv("conv2", second, 256, 5, p=2, group=2, bias=0.1), relu("relu2", "conv2")]
    out += ([pool("pool2", "conv2", "pool2", "MAX", 3, 2), _lrn("norm2", "pool2", "norm2")] if caffenet else
            [_lrn("norm2", "conv2", "norm2"), pool("pool2", "norm2", "pool2", "MAX", 3, 2)])
    last = "norm2" if caffenet else "pool2"
    out += [_conv_tv("conv3", last, 384, 3, p=1), relu("relu3", "conv3"),
            _conv_tv("conv4", "conv3", 384, 3, p=1, group=2, bias=0.1), relu("relu4", "conv4"),
            _conv_tv("conv5", "conv4", 256, 3, p=1, group=2, bias=0.1), relu("relu5", "conv5"),
            pool("pool5", "conv5", "pool5", "MAX", 3, 2)]
    bottom = "pool5"
    for i in (6, 7):
        out += [_fc(f"fc{i}", bottom, 4096), relu(f"relu{i}", f"fc{i}"),
                layer(f"drop{i}", "Dropout", f"fc{i}", f"fc{i}", dropout_param=[("dropout_ratio", 0.5)])]
        bottom = f"fc{i}"
    out += [_fc("fc8", "fc7", 1000, std=0.01, bias=0.0),
            layer("accuracy", "Accuracy", ["fc8", "label"], "accuracy", include=[("phase", "TEST")]),
            layer("loss", "SoftmaxWithLoss", ["fc8", "label"], "loss")]
    del first
    return "\n".join(out) + "\n"


def _inception(name, bottom, n1, n3r, n3, n5r, n5, npool):
    p = f"inception_{name}"
    out = [_conv_tv(f"{p}/1x1", bottom, n1, 1, std=0.03, bias=0.2), relu(f"{p}/relu_1x1", f"{p}/1x1"),
           _conv_tv(f"{p}/3x3_reduce", bottom, n3r, 1, std=0.09, bias=0.2),
           relu(f"{p}/relu_3x3_reduce", f"{p}/3x3_reduce"),
           _conv_tv(f"{p}/3x3", f"{p}/3x3_reduce", n3, 3, p=1, std=0.03, bias=0.2), relu(f"{p}/relu_3x3", f"{p}/3x3"),
           _conv_tv(f"{p}/5x5_reduce", bottom, n5r, 1, std=0.2, bias=0.2),
           relu(f"{p}/relu_5x5_reduce", f"{p}/5x5_reduce"),
           _conv_tv(f"{p}/5x5", f"{p}/5x5_reduce", n5, 5, p=2, std=0.03, bias=0.2), relu(f"{p}/relu_5x5", f"{p}/5x5"),
           pool(f"{p}/pool", bottom, f"{p}/pool", "MAX", 3, 1, 1),
           _conv_tv(f"{p}/pool_proj", f"{p}/pool", npool, 1, std=0.1, bias=0.2),
           relu(f"{p}/relu_pool_proj", f"{p}/pool_proj"),
           layer(f"{p}/output", "Concat", [f"{p}/1x1", f"{p}/3x3", f"{p}/5x5", f"{p}/pool_proj"], f"{p}/output")]
    return out, f"{p}/output"


INCEPTIONS = [("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64), "pool3",
              ("4a", 192, 96, 208, 16, 48, 64), "loss1", ("4b", 160, 112, 224, 24, 64, 64),
              ("4c", 128, 128, 256, 24, 64, 64), ("4d", 112, 144, 288, 32, 64, 64), "loss2",
              ("4e", 256, 160, 320, 32, 128, 128), "pool4", ("5a", 256, 160, 320, 32, 128, 128),
              ("5b", 384, 192, 384, 48, 128, 128)]


def _aux(tag, bottom):
    return [pool(f"{tag}/ave_pool", bottom, f"{tag}/ave_pool", "AVE", 5, 3),
            _conv_tv(f"{tag}/conv", f"{tag}/ave_pool", 128, 1, std=0.08, bias=0.2),
            relu(f"{tag}/relu_conv", f"{tag}/conv"),
            _fc(f"{tag}/fc", f"{tag}/conv", 1024, std=0.02, bias=0.2), relu(f"{tag}/relu_fc", f"{tag}/fc"),
            layer(f"{tag}/drop_fc", "Dropout", f"{tag}/fc", f"{tag}/fc", dropout_param=[("dropout_ratio", 0.7)]),
            _fc(f"{tag}/classifier", f"{tag}/fc", 1000, std=0.0009765625, bias=0.0),
            layer(f"{tag}/loss", "SoftmaxWithLoss", [f"{tag}/classifier", "label"], f"{tag}/loss1", loss_weight=0.3),
            layer(f"{tag}/top-1", "Accuracy", [f"{tag}/classifier", "label"], f"{tag}/top-1",
                  include=[("phase", "TEST")]),
            layer(f"{tag}/top-5", "Accuracy", [f"{tag}/classifier", "label"], f"{tag}/top-5",
                  include=[("phase", "TEST")], accuracy_param=[("top_k", 5)])]


def googlenet(crop=224, batch=32):
    """bvlc_googlenet's train_val: both phases, the two auxiliary classifiers with loss_weight 0.3."""
    out = ['name: "GoogleNet"'] + _data(crop, batch, 50)
    out += [_conv_tv("conv1/7x7_s2", "data", 64, 7, 2, 3, std=0.1, bias=0.2), relu("conv1/relu_7x7", "conv1/7x7_s2"),
            pool("pool1/3x3_s2", "conv1/7x7_s2", "pool1/3x3_s2", "MAX", 3, 2),
            _lrn("pool1/norm1", "pool1/3x3_s2", "pool1/norm1"),
            _conv_tv("conv2/3x3_reduce", "pool1/norm1", 64, 1, std=0.1, bias=0.2),
            relu("conv2/relu_3x3_reduce", "conv2/3x3_reduce"),
            _conv_tv("conv2/3x3", "conv2/3x3_reduce", 192, 3, p=1, std=0.03, bias=0.2),
            relu("conv2/relu_3x3", "conv2/3x3"),
            _lrn("conv2/norm2", "conv2/3x3", "conv2/norm2"),
            pool("pool2/3x3_s2", "conv2/norm2", "pool2/3x3_s2", "MAX", 3, 2)]
    bottom = "pool2/3x3_s2"
    for item in INCEPTIONS:
        if item in ("pool3", "pool4"):
            out.append(pool(f"{item}/3x3_s2", bottom, f"{item}/3x3_s2", "MAX", 3, 2))
            bottom = f"{item}/3x3_s2"
        elif item in ("loss1", "loss2"):
            out += _aux(item, bottom)
        else:
            layers, bottom = _inception(item[0], bottom, *item[1:])
            out += layers
    out += [pool("pool5/7x7_s1", bottom, "pool5/7x7_s1", "AVE", 7 if crop == 224 else crop // 32, 1),
            layer("pool5/drop_7x7_s1", "Dropout", "pool5/7x7_s1", "pool5/7x7_s1",
                  dropout_param=[("dropout_ratio", 0.4)]),
            _fc("loss3/classifier", "pool5/7x7_s1", 1000, std=0.01, bias=0.0),
            layer("loss3/loss3", "SoftmaxWithLoss", ["loss3/classifier", "label"], "loss3/loss3", loss_weight=1),
            layer("loss3/top-1", "Accuracy", ["loss3/classifier", "label"], "loss3/top-1", include=[("phase", "TEST")]),
            layer("loss3/top-5", "Accuracy", ["loss3/classifier", "label"], "loss3/top-5", include=[("phase", "TEST")],
                  accuracy_param=[("top_k", 5)])]
    return "\n".join(out) + "\n"


# -- Inception-v3 (a deploy file in the model zoos' layout: every convolution without bias, then
# BatchNorm with global stats and Scale, asymmetric kernels as kernel_h/kernel_w) ----------------
def _conv_bn(name, bottom, n, kh, kw=None, s=1, ph=0, pw=None, stats=True):
    kw, pw = kh if kw is None else kw, ph if pw is None else pw
    cp = [("num_output", n), ("bias_term", False)]
    cp += [("kernel_size", kh)] if kh == kw else [("kernel_h", kh), ("kernel_w", kw)]
    if ph == pw:
        cp += [("pad", ph)] if ph else []
    else:
        cp += [("pad_h", ph), ("pad_w", pw)]
    cp += [("stride", s)] if s != 1 else []
    cp.append(("weight_filler", [("type", "xavier")]))
    return "\n".join([layer(name, "Convolution", bottom, name, convolution_param=cp),
                      bn_scale(f"{name}_bn", f"{name}_scale", name, stats), relu(f"{name}_relu", name)])


def _chain(prefix, bottom, convs, stats=True):
    """Convolutions one after another; ``(tag, n, kh, kw, stride, ph, pw)`` each; the last top."""
    out = []
    for tag, n, kh, kw, s, ph, pw in convs:
        name = f"{prefix}/{tag}"
        out.append(_conv_bn(name, bottom, n, kh, kw, s, ph, pw, stats))
        bottom = name
    return out, bottom


def _v3_module(name, bottom, branches, pool=None, pool_proj=0, stats=True):
    """One Inception-v3 module: conv ``branches`` (lists of chain tuples, a list of two lists
    for a split end as in 7b/7c), a pool branch (``AVE`` with a 1x1 projection, or ``MAX``
    3x3 stride 2), concatenated."""
    out, tops = [], []
    for i, chain in enumerate(branches):
        if isinstance(chain, tuple):  # a stem, then two convolutions side by side
            stem, ends = chain
            text, top = _chain(f"{name}/b{i}", bottom, stem, stats)
            out += text
            for j, end in enumerate(ends):
                text, end_top = _chain(f"{name}/b{i}_{j}", top, end, stats)
                out += text
                tops.append(end_top)
        else:
            text, top = _chain(f"{name}/b{i}", bottom, chain, stats)
            out += text
            tops.append(top)
    if pool == "AVE":
        out.append(pool_fn(f"{name}/pool", bottom, "AVE", 3, 1, 1))
        text, top = _chain(f"{name}/pool", f"{name}/pool", [("proj", pool_proj, 1, 1, 1, 0, 0)], stats)
        out += text
        tops.append(top)
    else:
        out.append(pool_fn(f"{name}/pool", bottom, "MAX", 3, 2, 0))
        tops.append(f"{name}/pool")
    out.append(layer(f"{name}/concat", "Concat", tops, f"{name}/concat"))
    return out, f"{name}/concat"


def pool_fn(name, bottom, method, k, s, p):
    return pool(name, bottom, name, method, k, s, p)


def _c(tag, n, kh, kw=None, s=1, ph=0, pw=None):
    return (tag, n, kh, kh if kw is None else kw, s, ph, ph if pw is None else pw)


def inception_v3(size=299, batch=1, global_stats=True):
    """Inception-v3 (Szegedy et al. 2016, torchvision's layout) without the auxiliary classifier;
    ``global_stats`` False gives BatchNorm batch statistics, as a train file has."""
    out = [old_input("Inception-v3", (batch, 3, size, size))]
    text, top = _chain("stem", "data", [_c("conv1_3x3_s2", 32, 3, s=2), _c("conv2_3x3", 32, 3),
                                        _c("conv3_3x3", 64, 3, ph=1)], global_stats)
    out += text + [pool_fn("pool1", top, "MAX", 3, 2, 0)]
    text, top = _chain("stem", "pool1", [_c("conv4_1x1", 80, 1), _c("conv5_3x3", 192, 3)], global_stats)
    out += text + [pool_fn("pool2", top, "MAX", 3, 2, 0)]
    top = "pool2"
    for name, proj in (("mixed_5b", 32), ("mixed_5c", 64), ("mixed_5d", 64)):  # InceptionA
        text, top = _v3_module(name, top, [
            [_c("1x1", 64, 1)], [_c("5x5_reduce", 48, 1), _c("5x5", 64, 5, ph=2)],
            [_c("3x3_reduce", 64, 1), _c("3x3_1", 96, 3, ph=1), _c("3x3_2", 96, 3, ph=1)]], "AVE", proj, global_stats)
        out += text
    text, top = _v3_module("mixed_6a", top, [  # InceptionB: 35 -> 17
        [_c("3x3_s2", 384, 3, s=2)],
        [_c("3x3_reduce", 64, 1), _c("3x3_1", 96, 3, ph=1), _c("3x3_s2", 96, 3, s=2)]], stats=global_stats)
    out += text
    for name, c7 in (("mixed_6b", 128), ("mixed_6c", 160), ("mixed_6d", 160), ("mixed_6e", 192)):  # C
        text, top = _v3_module(name, top, [
            [_c("1x1", 192, 1)],
            [_c("7x7_reduce", c7, 1), _c("1x7", c7, 1, 7, pw=3, ph=0), _c("7x1", 192, 7, 1, ph=3, pw=0)],
            [_c("7x7dbl_reduce", c7, 1), _c("7x1_1", c7, 7, 1, ph=3, pw=0), _c("1x7_1", c7, 1, 7, ph=0, pw=3),
             _c("7x1_2", c7, 7, 1, ph=3, pw=0), _c("1x7_2", 192, 1, 7, ph=0, pw=3)]], "AVE", 192, global_stats)
        out += text
    text, top = _v3_module("mixed_7a", top, [  # InceptionD: 17 -> 8
        [_c("3x3_reduce", 192, 1), _c("3x3_s2", 320, 3, s=2)],
        [_c("7x7x3_reduce", 192, 1), _c("1x7", 192, 1, 7, ph=0, pw=3), _c("7x1", 192, 7, 1, ph=3, pw=0),
         _c("3x3_s2", 192, 3, s=2)]], stats=global_stats)
    out += text
    split = [_c("1x3", 384, 1, 3, ph=0, pw=1)], [_c("3x1", 384, 3, 1, ph=1, pw=0)]
    for name in ("mixed_7b", "mixed_7c"):  # InceptionE: split ends
        text, top = _v3_module(name, top, [
            [_c("1x1", 320, 1)], ([_c("3x3_reduce", 384, 1)], split),
            ([_c("3x3dbl_reduce", 448, 1), _c("3x3dbl", 384, 3, ph=1)], split)], "AVE", 192, global_stats)
        out += text
    out += [pool("pool3", top, "pool3", "AVE", glob=True),
            layer("fc1000", "InnerProduct", "pool3", "fc1000", inner_product_param=[("num_output", 1000)]),
            layer("prob", "Softmax", "fc1000", "prob")]
    return "\n".join(out) + "\n"
