"""SSD's MultiBoxLoss (weiliu89/caffe, multibox_loss_layer.cpp and bbox_util.cpp): the
localisation and confidence losses of the priors matched to each image's boxes.

Bottoms: ``loc`` (N, priors × 4), ``conf`` (N, priors × classes), the priors (PriorBox's
(1, 2, priors × 4)), and the ground truth in Caffe's annotated label blob (1, 1, boxes, 8),
one row per box ``[image, label, instance, xmin, ymin, xmax, ymax, difficult]``, rows of
image -1 skipped. Per image: the priors matched to its boxes by overlap (a bipartite pass,
then ``PER_PREDICTION`` at ``overlap_threshold``); with ``MAX_NEGATIVE`` mining the unmatched
priors overlapping no box by ``neg_overlap`` or more, ranked by their background loss, the
``neg_pos_ratio`` × positives hardest; the loss is

    (loc_weight × Σ_pos SmoothL1(loc − encode(box, prior)) + Σ_pos∪neg −log softmax(conf)[label])
    / normaliser

with the normaliser of ``normalization`` (VALID: the matches; FULL: N × priors; BATCH_SIZE:
N; NONE: 1), at least 1. The matching and mining run on the host (NumPy), as the fork runs
them on the CPU: on a GPU the bottoms are copied to the host once a forward and once a
backward, which matches again rather than keep state between the two.
"""

import math

import numpy as np

from . import boxes
from .base import Cost, Key, Layer
from .detection import to_host
from .join import shape_str
from .loss import normalization_in_force
from .registry import register

FLT_MIN = float(np.finfo(np.float32).tiny)
NORMALIZATIONS = ("FULL", "VALID", "BATCH_SIZE", "NONE")


def smooth_l1(d):
    """Caffe's SmoothL1 (the fork's): ``0.5 d²`` where ``|d| < 1``, else ``|d| − 0.5``."""
    a = np.abs(d)
    return np.where(a < 1, 0.5 * d * d, a - 0.5)


def smooth_l1_grad(d):
    """Its derivative: ``d`` where ``|d| < 1``, else ``sign(d)``."""
    return np.where(np.abs(d) < 1, d, np.sign(d))


def log_softmax(x):
    """``log softmax`` over the last axis, shifted by the maximum."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@register
class MultiBoxLoss(Layer):
    """SSD's training loss over priors matched to ground-truth boxes; see the module's text.
    Supported: ``share_location``, ``use_prior_for_matching``, SOFTMAX confidences, SMOOTH_L1
    or L2 localisation, any ``code_type`` with the variance in the box, mining NONE or
    MAX_NEGATIVE; the other settings are refused by name."""

    KEYS = {"num_classes": Key("int"), "loc_loss_type": Key("str", "SMOOTH_L1", choices=("SMOOTH_L1", "L2")),
            "conf_loss_type": Key("str", "SOFTMAX", choices=("SOFTMAX", "LOGISTIC")),
            "loc_weight": Key("float", 1.0), "share_location": Key("bool", True),
            "match_type": Key("str", "PER_PREDICTION", choices=("BIPARTITE", "PER_PREDICTION")),
            "overlap_threshold": Key("float", 0.5), "use_prior_for_matching": Key("bool", True),
            "background_label_id": Key("int", 0), "use_difficult_gt": Key("bool", True),
            "do_neg_mining": Key("bool", None), "neg_pos_ratio": Key("float", 3.0),
            "neg_overlap": Key("float", 0.5), "code_type": Key("str", "CORNER", choices=boxes.CODE_TYPES),
            "encode_variance_in_target": Key("bool", False), "map_object_to_agnostic": Key("bool", False),
            "ignore_cross_boundary_bbox": Key("bool", False), "bp_inside": Key("bool", False),
            "mining_type": Key("str", "MAX_NEGATIVE", choices=("NONE", "MAX_NEGATIVE", "HARD_EXAMPLE")),
            "sample_size": Key("int", 64), "use_prior_for_nms": Key("bool", False),
            "normalization": Key("str", None, choices=NORMALIZATIONS),
            "normalize": Key("bool", None, doc="Caffe's older switch: true is VALID, false BATCH_SIZE")}
    BOTTOMS = (4, 4)
    LABEL_BOTTOMS = (2, 3)
    LOSS = True

    REFUSED = {"conf_loss_type": "LOGISTIC", "share_location": False, "use_prior_for_matching": False,
               "encode_variance_in_target": True, "map_object_to_agnostic": True,
               "ignore_cross_boundary_bbox": True, "bp_inside": True, "mining_type": "HARD_EXAMPLE"}

    def setup(self, bottom_shapes):
        loc, conf, prior, label = (tuple(s) for s in bottom_shapes)
        cfg = self.cfg
        for key, value in self.REFUSED.items():
            if cfg[key] == value:
                self.fail(f"{key}: {str(value).lower() if isinstance(value, bool) else value} is not supported")
        mining = cfg["mining_type"] != "NONE"
        if cfg["do_neg_mining"] is not None and cfg["do_neg_mining"] != mining:
            self.fail(f"do_neg_mining {str(cfg['do_neg_mining']).lower()} contradicts mining_type {cfg['mining_type']}")
        c = cfg["num_classes"]
        if c < 1 or not 0 <= cfg["background_label_id"] < c:
            self.fail(f"num_classes ({c}) must be at least 1 and background_label_id "
                      f"({cfg['background_label_id']}) one of them")
        if mining and cfg["neg_pos_ratio"] <= 0:
            self.fail(f"neg_pos_ratio must be positive, got {cfg['neg_pos_ratio']}")
        if len(prior) != 3 or prior[:2] != (1, 2) or prior[2] % 4:
            self.fail(f"the third bottom must be PriorBox's (1, 2, priors * 4), got {shape_str(prior)}")
        p, n = prior[2] // 4, loc[0] if loc else 0
        if len(loc) < 2 or math.prod(loc[1:]) != p * 4 or len(conf) < 2 or conf[0] != n \
                or math.prod(conf[1:]) != p * c:
            self.fail(f"for {p} priors and {c} classes loc and conf must be (N, {p * 4}) and (N, {p * c}), "
                      f"got {shape_str(loc)} and {shape_str(conf)}")
        if len(label) < 1 or label[-1] != 8:
            self.fail(f"the label must be Caffe's annotated boxes (1, 1, boxes, 8), got {shape_str(label)}")
        self.n, self.p, self.c = n, p, c
        return [()]

    @property
    def normalization(self):
        """The normalization in force: ``normalization``, else ``normalize``'s, else VALID."""
        return normalization_in_force(self.cfg, "VALID")

    def backward_reads(self):
        return (0, 1, 2, 3), ()

    def cost(self):
        e = self.n * self.p * (self.c + 4)
        return Cost(10.0 * e, 6.0 * e, float(e * self.dtype.itemsize), float(2 * e * self.dtype.itemsize))

    # -- the fork's algorithm, on host arrays ----------------------------------------------
    def truths(self, label):
        """``{image: (boxes (k, 4), labels (k,))}`` of the label blob (Caffe's GetGroundTruth)."""
        rows = label.reshape(-1, 8).astype(np.float64)
        out = {}
        for row in rows:
            item = int(row[0])
            if item == -1:
                continue
            cls = int(row[1])
            if cls == self.cfg["background_label_id"] or not 0 <= cls < self.c:
                self.fail(f"a ground-truth box of image {item} has label {cls}: labels are the "
                          f"{self.c} classes but the background ({self.cfg['background_label_id']})")
            if not self.cfg["use_difficult_gt"] and row[7]:
                continue
            out.setdefault(item, ([], []))
            out[item][0].append(row[3:7])
            out[item][1].append(cls)
        return {i: (np.array(b).reshape(-1, 4), np.array(c, dtype=np.int64)) for i, (b, c) in out.items()}

    def plan(self, conf, prior, label):
        """The fork's matching and mining: ``(matched, target, chosen, encoded, normaliser)``:
        ``matched`` (N, P) bool (positives), ``target`` (N, P) their class (background
        elsewhere), ``chosen`` (N, P) bool (the priors in the confidence loss), ``encoded``
        (matches, 4) the positives' regression targets in (image, prior) order."""
        cfg, (n, p, c) = self.cfg, (self.n, self.p, self.c)
        priors = prior[0, 0].reshape(p, 4).astype(np.float64)
        variances = prior[0, 1].reshape(p, 4).astype(np.float64)
        truths = self.truths(label)
        matched = np.zeros((n, p), bool)
        target = np.full((n, p), cfg["background_label_id"], np.int64)
        has_truth = np.zeros(n, bool)
        overlap = np.zeros((n, p))
        encoded = []
        for i in range(n):
            if i not in truths:
                continue
            box, cls = truths[i]
            per_prediction = cfg["match_type"] == "PER_PREDICTION"
            index, overlap[i] = boxes.match(priors, box, cfg["overlap_threshold"], per_prediction)
            has_truth[i] = True
            matched[i] = index > -1
            target[i, matched[i]] = cls[index[matched[i]]]
            pos = np.flatnonzero(matched[i])
            encoded.append(boxes.encode(priors[pos], variances[pos], box[index[pos]], cfg["code_type"]))
        if cfg["mining_type"] == "NONE":
            chosen = np.ones((n, p), bool)  # every prior, images without boxes too (as background)
        else:
            chosen = matched.copy()
            # the mining loss: -log p[target], as Caffe's ComputeConfLoss (floats, clamped)
            logp = log_softmax(conf.reshape(n, p, c).astype(np.float64))
            picked = np.take_along_axis(logp, target[:, :, None], axis=2)[:, :, 0]
            loss = np.minimum(-picked, -math.log(FLT_MIN)).astype(np.float32)
            for i in np.flatnonzero(has_truth):
                eligible = np.flatnonzero(~matched[i] & (overlap[i] < cfg["neg_overlap"]))
                count = min(int(matched[i].sum() * np.float32(cfg["neg_pos_ratio"])), len(eligible))
                hardest = eligible[np.argsort(-loss[i, eligible], kind="stable")[:count]]
                chosen[i, hardest] = True
        matches = int(matched.sum())
        mode = self.normalization
        normaliser = max(1, {"VALID": matches, "FULL": n * p, "BATCH_SIZE": n, "NONE": 1}[mode])
        encoded = np.concatenate(encoded) if encoded else np.zeros((0, 4))
        return matched, target, chosen, encoded, normaliser

    def _diff(self, loc, matched, encoded):
        return loc.reshape(self.n, self.p, 4).astype(np.float64)[matched] - encoded

    def loss(self, loc, conf, prior, label):
        """The loss (a float) of host arrays."""
        matched, target, chosen, encoded, normaliser = self.plan(conf, prior, label)
        d = self._diff(loc, matched, encoded)
        loc_sum = (smooth_l1(d) if self.cfg["loc_loss_type"] == "SMOOTH_L1" else 0.5 * d * d).sum()
        logp = log_softmax(conf.reshape(self.n, self.p, self.c).astype(np.float64))
        picked = np.take_along_axis(logp, target[:, :, None], axis=2)[:, :, 0]
        conf_sum = np.minimum(-picked, -math.log(FLT_MIN))[chosen].sum()  # Caffe's max(prob, FLT_MIN)
        return (self.cfg["loc_weight"] * loc_sum + conf_sum) / normaliser

    def gradients(self, loc, conf, prior, label, weight=1.0):
        """``(dloc, dconf)`` (float64, the bottoms' shapes) of host arrays, times ``weight``."""
        (n, p, c), cfg = (self.n, self.p, self.c), self.cfg
        matched, target, chosen, encoded, normaliser = self.plan(conf, prior, label)
        d = self._diff(loc, matched, encoded)
        dloc = np.zeros((n, p, 4))
        dloc[matched] = (smooth_l1_grad(d) if cfg["loc_loss_type"] == "SMOOTH_L1" else d) \
            * (weight * cfg["loc_weight"] / normaliser)
        prob = np.exp(log_softmax(conf.reshape(n, p, c).astype(np.float64)))
        np.put_along_axis(prob, target[:, :, None], np.take_along_axis(prob, target[:, :, None], 2) - 1, 2)
        prob *= (chosen * (weight / normaliser))[:, :, None]
        return dloc.reshape(loc.shape), prob.reshape(conf.shape)

    # -- the layer ----------------------------------------------------------------------------
    def forward(self, ctx, bottoms, tops, params):
        tops[0][...] = self.loss(*(to_host(ctx, b) for b in bottoms))

    def backward(self, ctx, bottoms, tops, top_grads, bottom_grads, params, param_grads):
        if bottom_grads[0] is None and bottom_grads[1] is None:
            return
        weight = float(to_host(ctx, top_grads[0]))
        dloc, dconf = self.gradients(*(to_host(ctx, b) for b in bottoms), weight=weight)
        for dx, value in zip(bottom_grads[:2], (dloc, dconf)):
            if dx is not None:
                ctx.load(dx, value)
