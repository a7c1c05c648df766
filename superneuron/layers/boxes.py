"""Box arithmetic of the SSD fork (weiliu89/caffe, src/caffe/util/bbox_util.cpp), vectorised in
NumPy on the host: overlaps, the prior-to-ground-truth matching, encoding and decoding against
priors, and the greedy non-maximum suppression. Boxes are ``(..., 4)`` arrays of normalised
``[xmin, ymin, xmax, ymax]``.

Each function follows its Caffe function's rules, ties included, where NumPy's first-maximum
and stable sorts give the order Caffe's loops give (noted where they differ).
"""

import numpy as np

CODE_TYPES = ("CORNER", "CENTER_SIZE", "CORNER_SIZE")


def box_sizes(boxes):
    """Caffe's BBoxSize (normalised): width × height, 0 for an inverted box."""
    w, h = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    return np.where((w < 0) | (h < 0), 0, w * h)


def overlaps(a, b):
    """The ``(len(a), len(b))`` Jaccard overlaps (Caffe's JaccardOverlap): 0 where the boxes
    do not intersect with a positive area."""
    a, b = a[:, None, :], b[None, :, :]
    iw = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    ih = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0)
    union = box_sizes(a) + box_sizes(b) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / np.where(inter > 0, union, 1), 0)


def match(priors, truths, overlap_threshold, per_prediction=True):
    """Caffe's MatchBBox against every ground truth: ``(index, overlap)`` per prior, index -1
    where unmatched. First a bipartite pass (the most overlapped pair of an unmatched prior and
    an unmatched truth, until every truth has a prior or none overlaps: ties go to the lower
    prior, then the lower truth, as Caffe's loops find them); then, with ``per_prediction``,
    each unmatched prior takes its most overlapped truth if that overlap reaches the
    threshold. ``overlap`` is the prior's largest overlap (Caffe's match_overlaps)."""
    n = len(priors)
    index, best = np.full(n, -1, np.int64), np.zeros(n)
    if len(truths) == 0:
        return index, best
    ov = overlaps(priors, truths)
    positive = ov > 1e-6
    best = np.where(positive, ov, 0).max(axis=1)
    work = np.where(positive, ov, -1.0)
    for _ in range(len(truths)):
        i, j = np.unravel_index(np.argmax(work), work.shape)  # row-major first: Caffe's order
        if work[i, j] < 0:
            break
        index[i], best[i] = j, ov[i, j]
        work[i, :] = -1.0
        work[:, j] = -1.0
    if per_prediction:
        cand = np.where(positive & (ov >= overlap_threshold), ov, -1.0)
        j = np.argmax(cand, axis=1)
        take = (index == -1) & (cand[np.arange(n), j] >= 0)
        index[take] = j[take]
        best[take] = ov[take, j[take]]
    return index, best


def encode(priors, variances, truths, code_type):
    """Caffe's EncodeBBox with the variance in the box (variance_encoded_in_target false):
    the regression targets of ``truths`` against ``priors``, row by row."""
    pw, ph = priors[:, 2] - priors[:, 0], priors[:, 3] - priors[:, 1]
    if code_type == "CORNER":
        return (truths - priors) / variances
    if code_type == "CORNER_SIZE":
        return (truths - priors) / np.stack([pw, ph, pw, ph], axis=1) / variances
    pcx, pcy = (priors[:, 0] + priors[:, 2]) / 2, (priors[:, 1] + priors[:, 3]) / 2
    bw, bh = truths[:, 2] - truths[:, 0], truths[:, 3] - truths[:, 1]
    bcx, bcy = (truths[:, 0] + truths[:, 2]) / 2, (truths[:, 1] + truths[:, 3]) / 2
    with np.errstate(divide="ignore"):
        out = np.stack([(bcx - pcx) / pw, (bcy - pcy) / ph, np.log(bw / pw), np.log(bh / ph)], axis=1)
    return out / variances


def decode(priors, variances, loc, code_type, variance_in_target=False):
    """Caffe's DecodeBBox (no clipping): boxes from the predicted offsets ``loc``."""
    v = np.ones_like(variances) if variance_in_target else variances
    pw, ph = priors[:, 2] - priors[:, 0], priors[:, 3] - priors[:, 1]
    if code_type == "CORNER":
        return priors + v * loc
    if code_type == "CORNER_SIZE":
        return priors + v * loc * np.stack([pw, ph, pw, ph], axis=1)
    pcx, pcy = (priors[:, 0] + priors[:, 2]) / 2, (priors[:, 1] + priors[:, 3]) / 2
    cx, cy = v[:, 0] * loc[:, 0] * pw + pcx, v[:, 1] * loc[:, 1] * ph + pcy
    w, h = np.exp(v[:, 2] * loc[:, 2]) * pw, np.exp(v[:, 3] * loc[:, 3]) * ph
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def nms(boxes, scores, score_threshold, nms_threshold, top_k=-1, eta=1.0):
    """Caffe's ApplyNMSFast: the indices kept, best first. Candidates score above
    ``score_threshold``, sorted by score (stable: ties keep the lower index first), the first
    ``top_k``; a candidate is kept when its overlap with every kept box is at most the
    threshold, which ``eta`` < 1 lowers after each keep while above 0.5."""
    cand = np.flatnonzero(scores > score_threshold)
    cand = cand[np.argsort(-scores[cand], kind="stable")]
    if top_k > -1:
        cand = cand[:top_k]
    kept, threshold = [], nms_threshold
    for i in cand:
        if kept and overlaps(boxes[i:i + 1], boxes[kept]).max() > threshold:
            continue
        kept.append(int(i))
        if eta < 1 and threshold > 0.5:
            threshold *= eta
    return kept
