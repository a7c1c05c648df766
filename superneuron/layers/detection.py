"""The SSD fork's box layers (weiliu89/caffe): PriorBox (the default boxes of a feature map)
and DetectionOutput (decoding, per-class non-maximum suppression, the best ``keep_top_k``).

Keys are those of ``prior_box_param`` and ``detection_output_param`` flattened, as everywhere;
``nms_param``'s ``nms_threshold``, ``top_k`` and ``eta`` are keys of DetectionOutput itself.
Neither layer has a backward. DetectionOutput works on the host (NumPy), as the fork's CPU
path does: on a GPU its bottoms are copied to the host once a forward.
"""

import math

import numpy as np

from . import boxes
from .base import Cost, Key, Layer
from .join import shape_str
from .registry import register

FLT_MAX = float(np.finfo(np.float32).max)


def to_host(ctx, array):
    """``array`` as a NumPy array: itself on the CPU, a copy (a host sync) on a GPU."""
    if ctx.xp is np:
        return array
    return ctx.backend.to_host(array)


def _aspect_ratios(given, flip):
    """PriorBoxLayer's list: 1, then each new ratio (within 1e-6 of none before) and its
    inverse when ``flip``."""
    out = [1.0]
    for ar in given:
        if all(abs(ar - seen) >= 1e-6 for seen in out):
            out.append(ar)
            if flip:
                out.append(1.0 / ar)
    return out


@register
class PriorBox(Layer):
    """The default boxes of SSD at every cell of the first bottom's map, for an image the size
    of the second bottom (or ``img_size``/``img_h``, ``img_w``): per cell, a square of
    ``min_size``, a square of ``sqrt(min_size * max_size)`` when ``max_size`` is given, then a
    box per aspect ratio other than 1 (and its inverse with ``flip``); centres at
    ``(cell + offset) * step``, the step the image over the map unless ``step`` is given.
    The top is ``(1, 2, H * W * priors * 4)``: the boxes, then their ``variance``. It depends
    on shapes only, so it is computed once, at set-up, and the forward copies it."""

    KEYS = {"min_size": Key("floats", doc="box sizes in pixels, one or more"),
            "max_size": Key("floats", (), doc="one per min_size, each larger: adds a square of sqrt(min*max)"),
            "aspect_ratio": Key("floats", ()), "flip": Key("bool", True), "clip": Key("bool", False),
            "variance": Key("floats", (), doc="one or four positive numbers; none: 0.1"),
            "img_size": Key("int", 0), "img_h": Key("int", 0), "img_w": Key("int", 0),
            "step": Key("float", 0.0), "step_h": Key("float", 0.0), "step_w": Key("float", 0.0),
            "offset": Key("float", 0.5)}
    BOTTOMS = (2, 2)
    LABEL_BOTTOMS = (0, 1)
    BACKWARD = False
    CHEAP = True

    def _check(self):
        cfg = self.cfg
        mins, maxs = cfg["min_size"], cfg["max_size"]
        if not mins or min(mins) <= 0:
            self.fail("min_size must be given, each positive")
        if maxs and len(maxs) != len(mins):
            self.fail(f"{len(maxs)} max_size for {len(mins)} min_size: give one per min_size, or none")
        if any(b <= a for a, b in zip(mins, maxs)):
            self.fail("each max_size must be greater than its min_size")
        if len(cfg["variance"]) not in (0, 1, 4) or any(v <= 0 for v in cfg["variance"]):
            self.fail(f"variance: give one or four positive numbers, got {list(cfg['variance'])}")
        if cfg["img_size"] and (cfg["img_h"] or cfg["img_w"]):
            self.fail("give img_size or img_h and img_w, not both")
        if cfg["step"] and (cfg["step_h"] or cfg["step_w"]):
            self.fail("give step or step_h and step_w, not both")
        if min(cfg["img_size"], cfg["img_h"], cfg["img_w"], cfg["step"], cfg["step_h"], cfg["step_w"]) < 0:
            self.fail("img_size, img_h, img_w and the steps must not be negative")

    def setup(self, bottom_shapes):
        feature, image = (tuple(s) for s in bottom_shapes)
        if len(feature) != 4 or len(image) != 4:
            self.fail(f"expects a feature map and an image, both (N, C, H, W), got {shape_str(feature)} "
                      f"and {shape_str(image)}")
        self._check()
        cfg = self.cfg
        self.ratios = _aspect_ratios(cfg["aspect_ratio"], cfg["flip"])
        self.per_cell = len(self.ratios) * len(cfg["min_size"]) + len(cfg["max_size"])
        self.priors = self._priors(feature[2:], image[2:])
        return [self.priors.shape]

    def _priors(self, feature, image):
        """The top's values (float64, then the layer's dtype): Caffe's loop, in its order."""
        cfg = self.cfg
        fh, fw = feature
        img_h, img_w = (cfg["img_h"], cfg["img_w"]) if cfg["img_h"] or cfg["img_w"] else \
            ((cfg["img_size"],) * 2 if cfg["img_size"] else image)
        if img_h <= 0 or img_w <= 0:
            self.fail("img_h and img_w must both be positive")
        step_h, step_w = (cfg["step_h"], cfg["step_w"]) if cfg["step_h"] or cfg["step_w"] else \
            ((cfg["step"],) * 2 if cfg["step"] else (img_h / fh, img_w / fw))
        if step_h <= 0 or step_w <= 0:
            self.fail("step_h and step_w must both be positive")
        sizes = []  # (width, height) per prior of a cell
        for s, lo in enumerate(cfg["min_size"]):
            lo = int(lo)  # Caffe keeps min_size and max_size as ints here
            sizes.append((lo, lo))
            if cfg["max_size"]:
                side = math.sqrt(lo * int(cfg["max_size"][s]))
                sizes.append((side, side))
            for ar in self.ratios:  # the ssd branch's min_size * sqrt(ar), as SSD's models were trained
                if abs(ar - 1.0) >= 1e-6:
                    sizes.append((lo * math.sqrt(ar), lo / math.sqrt(ar)))
        wh = np.array(sizes, dtype=np.float64)  # (per_cell, 2)
        # centres as Caffe computes them, in float32
        cx = ((np.arange(fw, dtype=np.float32) + np.float32(cfg["offset"])) * np.float32(step_w)).astype(np.float64)
        cy = ((np.arange(fh, dtype=np.float32) + np.float32(cfg["offset"])) * np.float32(step_h)).astype(np.float64)
        cx, cy = np.meshgrid(cx, cy)  # (fh, fw)
        cx, cy = cx[:, :, None], cy[:, :, None]
        out = np.stack([(cx - wh[:, 0] / 2) / img_w, (cy - wh[:, 1] / 2) / img_h,
                        (cx + wh[:, 0] / 2) / img_w, (cy + wh[:, 1] / 2) / img_h], axis=-1).reshape(-1)
        if cfg["clip"]:
            out = np.clip(out, 0.0, 1.0)
        variance = cfg["variance"] or (0.1,)
        var = np.broadcast_to(np.asarray(variance, dtype=np.float64), (out.size // 4, 4)).reshape(-1)
        return np.stack([out, var])[None].astype(self.dtype)

    def backward_reads(self):
        return (), ()

    def cost(self):
        n = self.priors.size * self.dtype.itemsize
        return Cost(0.0, 0.0, float(n), 0.0)

    def forward(self, ctx, bottoms, tops, params):
        tops[0][...] = self.constant(ctx.xp, "priors", self.priors, self.dtype)  # uploaded once

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        pass  # priors depend on shapes only


@register
class DetectionOutput(Layer):
    """SSD's detections: each image's ``loc`` offsets decoded against the priors, then for each
    class but the background, the boxes scoring above ``confidence_threshold`` (its best
    ``top_k``) through non-maximum suppression at ``nms_threshold`` (``eta``: Caffe's
    adaptive threshold), then the image's best ``keep_top_k`` over all classes. The second
    bottom holds probabilities (the deploy files' Softmax before it).

    Each detection is a row ``[image, label, score, xmin, ymin, xmax, ymax]``, as Caffe's.
    Caffe's top has as many rows as there are detections; our shapes are planned before any
    forward, so the top has a fixed number of rows, ``keep_top_k`` per image (or, without it,
    ``top_k`` or every prior, per class), the detections first (by image, then label, then
    score, as Caffe writes them) and the rest rows of -1, which Caffe's readers skip
    (item -1). With no detection at all, the first row of each image is ``[image, -1, ...]``,
    as Caffe's. ``save_output_param``'s keys are read and nothing is written to files."""

    KEYS = {"num_classes": Key("int"), "share_location": Key("bool", True),
            "background_label_id": Key("int", 0), "nms_threshold": Key("float", 0.3),
            "top_k": Key("int", -1), "eta": Key("float", 1.0),
            "code_type": Key("str", "CORNER", choices=boxes.CODE_TYPES),
            "variance_encoded_in_target": Key("bool", False), "keep_top_k": Key("int", -1),
            "confidence_threshold": Key("float", -FLT_MAX), "visualize": Key("bool", False),
            "visualize_threshold": Key("float", 0.0), "save_file": Key("str", ""),
            **{k: Key("str", "", doc="save_output_param's: read, not acted on")
               for k in ("output_directory", "output_name_prefix", "output_format", "label_map_file",
                         "name_size_file")},
            "num_test_image": Key("int", 0, doc="save_output_param's: read, not acted on")}
    BOTTOMS = (3, 3)
    LABEL_BOTTOMS = (0, 1, 2)
    BACKWARD = False

    def setup(self, bottom_shapes):
        loc, conf, prior = (tuple(s) for s in bottom_shapes)
        cfg = self.cfg
        if not cfg["share_location"]:
            self.fail("share_location false is not supported (one box per prior for all classes)")
        if cfg["visualize"]:
            self.fail("visualize is not supported (it draws on the images with OpenCV)")
        c = cfg["num_classes"]
        if c < 1:
            self.fail(f"num_classes must be at least 1, got {c}")
        if len(prior) != 3 or prior[:2] != (1, 2) or prior[2] % 4:
            self.fail(f"the third bottom must be PriorBox's (1, 2, priors * 4), got {shape_str(prior)}")
        p, n = prior[2] // 4, loc[0]
        if math.prod(loc[1:]) != p * 4 or len(conf) < 1 or conf[0] != n or math.prod(conf[1:]) != p * c:
            self.fail(f"for {p} priors and {c} classes the bottoms must be (N, {p * 4}) and (N, {p * c}), "
                      f"got {shape_str(loc)} and {shape_str(conf)}")
        if cfg["keep_top_k"] < -1 or cfg["top_k"] < -1 or cfg["keep_top_k"] == 0:
            self.fail("keep_top_k and top_k must be positive, or -1 for all (the top has a fixed keep_top_k "
                      "rows per image, the rows beyond the detections -1)")
        if not 0 < cfg["eta"] <= 1:
            self.fail(f"eta must be in (0, 1], got {cfg['eta']}")
        self.n, self.p, self.c = n, p, c
        classes = c - (0 <= cfg["background_label_id"] < c)
        per_class = p if cfg["top_k"] == -1 else min(cfg["top_k"], p)
        self.rows = classes * per_class
        if cfg["keep_top_k"] > -1:
            self.rows = min(self.rows, cfg["keep_top_k"])
        return [(1, 1, max(n * self.rows, n), 7)]

    def backward_reads(self):
        return (), ()

    def cost(self):
        n = (self.n * self.p * (4 + self.c) + 8 * self.p) * self.dtype.itemsize
        return Cost(float(self.n * self.p * self.c * 8), 0.0, float(n), 0.0)

    def detect(self, loc, conf, prior):
        """The ``(rows, 7)`` float64 detections of host arrays (before padding)."""
        cfg, (n, p, c) = self.cfg, (self.n, self.p, self.c)
        priors, variances = prior[0, 0].reshape(p, 4).astype(np.float64), prior[0, 1].reshape(p, 4).astype(np.float64)
        loc = loc.reshape(n, p, 4).astype(np.float64)
        conf = conf.reshape(n, p, c)
        out = []
        for i in range(n):
            found = boxes.decode(priors, variances, loc[i], cfg["code_type"], cfg["variance_encoded_in_target"])
            picks = []  # (score, label, index) in Caffe's order: label, then NMS order
            for label in range(c):
                if label == cfg["background_label_id"]:
                    continue
                scores = conf[i, :, label].astype(np.float32)  # Caffe keeps scores as floats
                kept = boxes.nms(found, scores, np.float32(cfg["confidence_threshold"]), cfg["nms_threshold"],
                                 cfg["top_k"], cfg["eta"])
                picks += [(float(scores[j]), label, j) for j in kept]
            if -1 < cfg["keep_top_k"] < len(picks):
                order = sorted(range(len(picks)), key=lambda k: -picks[k][0])[:cfg["keep_top_k"]]
                chosen = [picks[k] for k in order]  # best first, then regrouped by label
                picks = sorted(chosen, key=lambda t: t[1])  # stable: by label, score order kept
            out += [[i, label, score, *found[j]] for score, label, j in picks]
        return np.array(out, dtype=np.float64).reshape(-1, 7)

    def forward(self, ctx, bottoms, tops, params):
        found = self.detect(*(to_host(ctx, b) for b in bottoms))
        top = np.full(tops[0].shape[2:], -1.0, dtype=self.dtype)
        if len(found):
            top[:len(found)] = found
        else:  # Caffe's fake result per image
            top[:self.n, 0] = np.arange(self.n)
        ctx.load(tops[0], top.reshape(tops[0].shape))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        pass  # inference only
