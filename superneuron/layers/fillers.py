"""Caffe's weight fillers: a filler named in a net file checked into a complete dict
(:func:`parse_filler`), and a parameter's initial values drawn from it (:func:`fill`)."""

import difflib
import math

import numpy as np

FILLERS = {"constant": {"value": 0.0}, "gaussian": {"std": 0.01, "mean": 0.0},
           "uniform": {"min": 0.0, "max": 1.0}, "xavier": {"variance_norm": "FAN_IN"},
           "msra": {"variance_norm": "FAN_IN"}, "bilinear": {}}
# Every field of Caffe's FillerParameter: Caffe reads them all for every filler and ignores what
# that filler does not use (bvlc_googlenet's xavier fillers carry a std), so we do too.
FILLER_FIELDS = ("type", "value", "min", "max", "mean", "std", "sparse", "variance_norm")
VARIANCE_NORMS = ("FAN_IN", "FAN_OUT", "AVERAGE")


def parse_filler(value):
    """``'msra'`` or ``{type: gaussian, std: 0.01}`` → a complete filler dict holding the
    options that filler uses. As in Caffe, no ``type`` means ``constant``, and a
    FillerParameter field the filler does not use is accepted and ignored."""
    if isinstance(value, str):
        value = {"type": value}
    if not isinstance(value, dict):
        raise ValueError(f"expected a filler name or {{type: ..., ...}}, got {value!r}")
    kind = value.get("type", "constant")
    if kind not in FILLERS:
        raise ValueError(f"unknown filler {kind!r}; known: {', '.join(FILLERS)}")
    out = dict(FILLERS[kind], type=kind)
    for k, v in value.items():
        if k == "type":
            continue
        if k not in FILLER_FIELDS:
            close = difflib.get_close_matches(str(k), FILLER_FIELDS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(FILLER_FIELDS[1:])}"
            raise ValueError(f"filler {kind!r} has no option {k!r}{hint}")
        if k == "variance_norm":
            if v not in VARIANCE_NORMS:
                raise ValueError(f"filler option 'variance_norm' expects one of {', '.join(VARIANCE_NORMS)}, "
                                 f"got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"filler option {k!r} expects a number, got {v!r}")
        elif not math.isfinite(v):
            raise ValueError(f"filler option {k!r} expects a finite number, got {v!r}")
        if k in FILLERS[kind]:  # what this filler does not use is ignored, as Caffe does
            out[k] = v if k == "variance_norm" else float(v)
    return out


def fill(rng, shape, filler, fan_in, fan_out, dtype):
    """Initial values for a parameter (Caffe's fillers; xavier and msra scale by the fan their
    ``variance_norm`` names: FAN_IN, FAN_OUT or their AVERAGE)."""
    kind = filler["type"]
    if kind == "constant":
        return np.full(shape, filler["value"], dtype=dtype)
    if kind == "gaussian":
        return (filler["mean"] + filler["std"] * rng.standard_normal(shape)).astype(dtype)
    if kind == "uniform":
        return rng.uniform(filler["min"], filler["max"], shape).astype(dtype)
    fan = {"FAN_IN": fan_in, "FAN_OUT": fan_out,
           "AVERAGE": (fan_in + fan_out) / 2.0}.get(filler.get("variance_norm", "FAN_IN"))
    if kind == "xavier":
        scale = np.sqrt(3.0 / max(fan, 1))
        return rng.uniform(-scale, scale, shape).astype(dtype)
    if kind == "msra":
        return (np.sqrt(2.0 / max(fan, 1)) * rng.standard_normal(shape)).astype(dtype)
    if kind == "bilinear":
        return bilinear(shape).astype(dtype)
    raise AssertionError(kind)


def bilinear(shape):
    """Caffe's bilinear filler: every (k, k) kernel of a 4-D weight the bilinear-interpolation
    kernel of an upsampling Deconvolution (FCN's, with stride ``f`` and kernel ``2f - f % 2``)."""
    if len(shape) != 4 or shape[-1] != shape[-2]:
        raise ValueError(f"the bilinear filler needs square 4-D weights, got {tuple(shape)}")
    k = shape[-1]
    f = math.ceil(k / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    ramp = 1 - np.abs(np.arange(k) / f - c)
    return np.broadcast_to(ramp[:, None] * ramp[None, :], shape).copy()
