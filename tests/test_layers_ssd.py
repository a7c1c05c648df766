"""The SSD fork's layers: PriorBox against boxes computed by hand from prior_box_layer.cpp's
formula, MultiBoxLoss's value against a loop-for-loop transcription of the fork's algorithm
(MatchBBox, ComputeConfLoss, MineHardExamples, the SmoothL1 and softmax losses) and its
gradient by float64 finite differences, SmoothL1 against PyTorch, DetectionOutput's
non-maximum suppression against a transcription of ApplyNMSFast (torchvision is not
installed here) and its fixed, padded top."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_harness import build, forward, gradcheck
from one_line import raises_one_line

from superneuron.errors import LayerError
from superneuron.layers import boxes
from superneuron.layers.multibox import smooth_l1, smooth_l1_grad

S2 = math.sqrt(2)


def test_priorbox_is_caffes_formula_by_hand():
    layer, _ = build("PriorBox", [(1, 8, 2, 2), (1, 3, 20, 20)], min_size=4.7, max_size=9.0,
                     aspect_ratio=[2.0, 2.0], variance=[0.1, 0.1, 0.2, 0.2])
    top = forward(layer, [np.zeros((1, 8, 2, 2)), np.zeros((1, 3, 20, 20))], {})[0]
    assert top.shape == (1, 2, 2 * 2 * 4 * 4)  # priors: min, sqrt(min*max), 2 and 1/2 (the repeat ignored)
    boxes_ = top[0, 0].reshape(2, 2, 4, 4)
    # cell (h 0, w 1): centre (15, 5), step 20 / 2; min_size 4.7 is Caffe's int 4
    want = np.array([[13, 3, 17, 7], [12, 2, 18, 8],  # 4 x 4, then sqrt(4 * 9) = 6
                     [15 - 2 * S2, 5 - S2, 15 + 2 * S2, 5 + S2],  # 4 sqrt2 x 4 / sqrt2: halves 2 sqrt2, sqrt2
                     [15 - S2, 5 - 2 * S2, 15 + S2, 5 + 2 * S2]]) / 20  # its flip
    np.testing.assert_allclose(boxes_[0, 1], want, atol=1e-7)
    np.testing.assert_allclose(boxes_[1, 0, 0], np.array([3, 13, 7, 17]) / 20, atol=1e-7)  # h before w
    np.testing.assert_array_equal(top[0, 1].reshape(-1, 4), np.tile([0.1, 0.1, 0.2, 0.2], (16, 1)))


def test_priorbox_step_img_size_clip_and_one_variance():
    layer, _ = build("PriorBox", [(2, 1, 3, 3), (2, 3, 7, 7)], min_size=10.0, step=8.0, img_size=24,
                     offset=0.0, clip=True)
    top = forward(layer, [np.zeros((2, 1, 3, 3)), np.zeros((2, 3, 7, 7))], {})[0]
    first, last = top[0, 0, :4], top[0, 0, -4:]
    np.testing.assert_allclose(first, [0, 0, 5 / 24, 5 / 24])  # centre 0: clipped at 0
    np.testing.assert_allclose(last, [11 / 24, 11 / 24, 21 / 24, 21 / 24])  # centre 16
    assert (top[0, 1] == np.float64(0.1)).all()


@pytest.mark.parametrize("cfg, message", [
    (dict(min_size=4.0, max_size=[3.0]), "greater than its min_size"),
    (dict(min_size=4.0, variance=[0.1, 0.2]), "one or four positive"),
    (dict(min_size=4.0, step=8.0, step_h=4.0), "step or step_h"),
])
def test_priorbox_errors(cfg, message):
    with raises_one_line(LayerError, match=message):
        build("PriorBox", [(1, 1, 2, 2), (1, 3, 8, 8)], **cfg)


# -- the fork's algorithm, loop for loop (bbox_util.cpp) ----------------------------------------------
def jaccard(a, b):
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return 0.0
    iw, ih = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    size = lambda r: 0.0 if r[2] < r[0] or r[3] < r[1] else (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    return iw * ih / (size(a) + size(b) - iw * ih)


def match_bbox(gts, preds, threshold):
    """MatchBBox (label -1, PER_PREDICTION), with its maps and loops."""
    index, best = [-1] * len(preds), [0.0] * len(preds)
    overlaps = {}
    for i, p in enumerate(preds):
        for j, g in enumerate(gts):
            o = jaccard(p, g)
            if o > 1e-6:
                best[i] = max(best[i], o)
                overlaps.setdefault(i, {})[j] = o
    pool = list(range(len(gts)))
    while pool:
        max_idx = max_gt = -1
        max_overlap = -1
        for i in sorted(overlaps):
            if index[i] != -1:
                continue
            for j in pool:
                if j in overlaps[i] and overlaps[i][j] > max_overlap:
                    max_idx, max_gt, max_overlap = i, j, overlaps[i][j]
        if max_idx == -1:
            break
        index[max_idx], best[max_idx] = max_gt, max_overlap
        pool.remove(max_gt)
    for i in sorted(overlaps):
        if index[i] != -1:
            continue
        max_gt, max_overlap = -1, -1
        for j in range(len(gts)):
            if j in overlaps[i] and overlaps[i][j] >= threshold and overlaps[i][j] > max_overlap:
                max_gt, max_overlap = j, overlaps[i][j]
        if max_gt != -1:
            index[i], best[i] = max_gt, max_overlap
    return index, best


def encode_center_size(p, v, g):
    pw, ph, pcx, pcy = p[2] - p[0], p[3] - p[1], (p[0] + p[2]) / 2, (p[1] + p[3]) / 2
    bw, bh, bcx, bcy = g[2] - g[0], g[3] - g[1], (g[0] + g[2]) / 2, (g[1] + g[3]) / 2
    return [(bcx - pcx) / pw / v[0], (bcy - pcy) / ph / v[1], math.log(bw / pw) / v[2], math.log(bh / ph) / v[3]]


def softmax_loss(scores, label):
    m = max(scores)
    s = sum(math.exp(x - m) for x in scores)
    return -math.log(max(math.exp(scores[label] - m) / s, np.finfo(np.float32).tiny))


def reference_loss(loc, conf, prior, label, classes, ratio=3.0, neg_overlap=0.5, threshold=0.5):
    """MultiBoxLoss's Forward_cpu with MAX_NEGATIVE mining, SMOOTH_L1, SOFTMAX, VALID."""
    n, p = loc.shape[0], prior.shape[2] // 4
    priors, var = prior[0, 0].reshape(p, 4), prior[0, 1].reshape(p, 4)
    gts = {}
    for row in label.reshape(-1, 8):
        if int(row[0]) != -1:
            gts.setdefault(int(row[0]), []).append((int(row[1]), list(row[3:7])))
    loc_sum = conf_sum = 0.0
    matches = 0
    for i in range(n):
        if i not in gts:
            continue
        g = gts[i]
        index, best = match_bbox([b for _, b in g], list(priors), threshold)
        scores = conf[i].reshape(p, classes)
        mine = []
        for m in range(p):
            lab = g[index[m]][0] if index[m] > -1 else 0
            mine.append(np.float32(softmax_loss(list(scores[m]), lab)))
        pos = [m for m in range(p) if index[m] > -1]
        eligible = [(mine[m], m) for m in range(p) if index[m] == -1 and best[m] < neg_overlap]
        count = min(int(len(pos) * ratio), len(eligible))
        eligible.sort(key=lambda t: -t[0])  # stable: Caffe's std::sort leaves ties to chance
        negs = sorted(m for _, m in eligible[:count])
        matches += len(pos)
        for m in pos:
            target = encode_center_size(priors[m], var[m], g[index[m]][1])
            for k in range(4):
                d = loc[i].reshape(p, 4)[m, k] - target[k]
                loc_sum += 0.5 * d * d if abs(d) < 1 else abs(d) - 0.5
            conf_sum += softmax_loss(list(scores[m]), g[index[m]][0])
        for m in negs:
            conf_sum += softmax_loss(list(scores[m]), 0)
    return (loc_sum + conf_sum) / max(1, matches)


def ssd_case(rng, classes=4, batch=3):
    """Priors of two maps, random predictions and a few boxes (an image without any, a padding row)."""
    pb1, _ = build("PriorBox", [(1, 1, 4, 4), (1, 3, 32, 32)], min_size=8.0, aspect_ratio=2.0)
    pb2, _ = build("PriorBox", [(1, 1, 2, 2), (1, 3, 32, 32)], min_size=14.0, max_size=22.0, aspect_ratio=2.0)
    feats = [np.zeros((1, 1, 4, 4)), np.zeros((1, 3, 32, 32))]
    prior = np.concatenate([forward(pb1, feats, {})[0], forward(pb2, [np.zeros((1, 1, 2, 2)), feats[1]], {})[0]],
                           axis=2)
    p = prior.shape[2] // 4
    rows = [[0, 1, 0, .1, .1, .4, .5, 0], [0, 3, 1, .5, .45, .95, .9, 0], [0, 2, 2, .3, .3, .55, .6, 1],
            [2, 2, 0, .05, .6, .35, .95, 0], [-1, 0, 0, 0, 0, 0, 0, 0]]
    label = np.array(rows, dtype=np.float64).reshape(1, 1, -1, 8)
    loc = 0.5 * rng.standard_normal((batch, p * 4))
    conf = rng.standard_normal((batch, p * classes))
    return loc, conf, prior, label


def test_match_is_caffes_match_bbox(rng):
    priors = np.sort(rng.uniform(0, 1, (60, 2, 2)), axis=1).transpose(0, 2, 1).reshape(60, 4)[:, [0, 2, 1, 3]]
    truths = np.array([[.1, .1, .5, .5], [.4, .4, .9, .8], [.0, .6, .3, .95]])
    index, best = boxes.match(priors, truths, 0.3)
    want_index, want_best = match_bbox(list(truths), list(priors), 0.3)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(best, want_best, rtol=1e-12)
    assert (index > -1).sum() > 3  # the bipartite three and more


def test_multibox_loss_is_the_forks_algorithm(rng):
    loc, conf, prior, label = ssd_case(rng)
    layer, _ = build("MultiBoxLoss", [loc.shape, conf.shape, prior.shape, label.shape], num_classes=4,
                     code_type="CENTER_SIZE", normalization="VALID")
    got = forward(layer, [loc, conf, prior, label], {})[0]
    assert np.isclose(got, reference_loss(loc, conf, prior, label, 4), rtol=1e-12)
    matched, _, chosen, _, normaliser = layer.plan(conf, prior, label)
    assert normaliser == matched.sum() >= 3 and chosen.sum() > matched.sum()  # negatives mined
    assert not chosen[1].any()  # an image without boxes adds nothing (Caffe skips it)


@pytest.mark.parametrize("cfg", [dict(code_type="CENTER_SIZE"), dict(code_type="CORNER", mining_type="NONE",
                                                                     normalization="FULL", loc_weight=2.0),
                                 dict(code_type="CORNER_SIZE", loc_loss_type="L2", normalize=False)])
def test_multibox_loss_gradient_by_finite_differences(rng, cfg):
    loc, conf, prior, label = ssd_case(rng)
    layer, _ = build("MultiBoxLoss", [loc.shape, conf.shape, prior.shape, label.shape], num_classes=4, **cfg)
    _, grads, _ = gradcheck(layer, [loc, conf, prior, label], {}, rtol=1e-6)
    assert np.abs(grads[0]).max() > 0 and np.abs(grads[1]).max() > 0


def test_smooth_l1_is_pytorchs(rng):
    d = torch.tensor(rng.standard_normal(200) * 2, requires_grad=True)
    want = F.smooth_l1_loss(d, torch.zeros_like(d), reduction="sum", beta=1.0)
    want.backward()
    x = d.detach().numpy()
    assert np.isclose(smooth_l1(x).sum(), want.item(), rtol=1e-12)
    np.testing.assert_allclose(smooth_l1_grad(x), d.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("cfg, label_row, message", [
    (dict(mining_type="HARD_EXAMPLE"), None, "mining_type: HARD_EXAMPLE is not supported"),
    (dict(share_location=False), None, "share_location: false is not supported"),
    ({}, [0, 0, 0, .1, .1, .5, .5, 0], "has label 0: labels are the 4 classes but the background"),
])
def test_multibox_loss_errors(rng, cfg, label_row, message):
    loc, conf, prior, label = ssd_case(rng)
    with raises_one_line(LayerError, match=message):
        layer, _ = build("MultiBoxLoss", [loc.shape, conf.shape, prior.shape, label.shape], num_classes=4, **cfg)
        label[0, 0, 0] = label_row
        forward(layer, [loc, conf, prior, label], {})


def test_multibox_loss_shapes_are_checked():
    with raises_one_line(LayerError, match=r"loc and conf must be \(N, 16\) and \(N, 12\)"):
        build("MultiBoxLoss", [(2, 16), (2, 16), (1, 2, 16), (1, 1, 3, 8)], num_classes=3)


# -- DetectionOutput -----------------------------------------------------------------------------------
def nms_fast(bxs, scores, score_threshold, nms_threshold, top_k, eta=1.0):
    """ApplyNMSFast, loop for loop."""
    pairs = sorted([(s, i) for i, s in enumerate(scores) if s > score_threshold], key=lambda t: -t[0])
    if top_k > -1:
        pairs = pairs[:top_k]
    kept, adaptive = [], nms_threshold
    for _, i in pairs:
        keep = True
        for k in kept:
            keep = jaccard(bxs[i], bxs[k]) <= adaptive
            if not keep:
                break
        if keep:
            kept.append(i)
            if eta < 1 and adaptive > 0.5:
                adaptive *= eta
    return kept


def test_nms_is_apply_nms_fast(rng):
    centre = rng.uniform(0.2, 0.8, (80, 2))
    half = rng.uniform(0.05, 0.2, (80, 2))
    bxs = np.concatenate([centre - half, centre + half], axis=1)
    scores = rng.uniform(0, 1, 80).astype(np.float32)
    for thr, top_k, eta in ((0.45, -1, 1.0), (0.3, 20, 1.0), (0.7, 50, 1.0), (0.9, -1, 0.9)):
        kept = boxes.nms(bxs, scores, 0.1, thr, top_k, eta)
        assert kept == nms_fast(list(bxs), list(scores), 0.1, thr, top_k, eta) and 3 < len(kept) < 80


def test_detection_output_rows_are_caffes_padded_to_keep_top_k(rng):
    loc, conf, prior, _ = ssd_case(rng, classes=3, batch=2)
    p = prior.shape[2] // 4
    probs = np.exp(conf.reshape(2, p, 3))
    probs /= probs.sum(axis=2, keepdims=True)
    layer, _ = build("DetectionOutput", [loc.shape, (2, p * 3), prior.shape], num_classes=3, code_type="CENTER_SIZE",
                     nms_threshold=0.45, top_k=10, keep_top_k=12, confidence_threshold=0.3)
    top = forward(layer, [loc, probs.reshape(2, -1), prior], {})[0]
    assert top.shape == (1, 1, 2 * 12, 7)
    rows = top[0, 0]
    real = rows[rows[:, 0] > -1]
    assert (rows[len(real):] == -1).all() and 0 < len(real) <= 24
    for i in range(2):  # each image: its detections by label, then score, the best 12 of the NMS's
        mine = real[real[:, 0] == i]
        found = boxes.decode(prior[0, 0].reshape(p, 4), prior[0, 1].reshape(p, 4), loc[i].reshape(p, 4), "CENTER_SIZE")
        want = []
        for label in (1, 2):
            scores = probs[i, :, label].astype(np.float32)
            want += [(scores[k], label, k) for k in nms_fast(list(found), list(scores), 0.3, 0.45, 10)]
        want = sorted(sorted(want, key=lambda t: -t[0])[:12], key=lambda t: t[1])
        np.testing.assert_allclose(mine[:, 1:3], [[lab, s] for s, lab, _ in want], rtol=1e-6)
        np.testing.assert_allclose(mine[:, 3:], [found[k] for _, _, k in want], rtol=1e-6)


def test_detection_output_with_nothing_found_gives_caffes_fake_rows(rng):
    loc, conf, prior, _ = ssd_case(rng, classes=3, batch=2)
    p = prior.shape[2] // 4
    layer, _ = build("DetectionOutput", [loc.shape, (2, p * 3), prior.shape], num_classes=3, keep_top_k=5,
                     confidence_threshold=2.0)
    rows = forward(layer, [loc, np.full((2, p * 3), 1 / 3), prior], {})[0][0, 0]
    np.testing.assert_array_equal(rows[:2, 0], [0, 1])
    assert (rows[:2, 1:] == -1).all() and (rows[2:] == -1).all()
