"""The habits of Caffe's files that a Caffe user brings (issue 32): fillers that read every
FillerParameter field, a typeless filler, a Data layer with one top, and the like."""

import numpy as np
import pytest

from superneuron.layers.base import bilinear, fill, parse_filler


def test_filler_ignores_fields_it_does_not_use():
    # bvlc_googlenet: weight_filler { type: "xavier" std: 0.1 }; Caffe's xavier reads no std
    assert parse_filler({"type": "xavier", "std": 0.1}) == parse_filler("xavier")
    assert parse_filler({"type": "constant", "value": 2, "std": 3, "mean": 1}) == {"type": "constant", "value": 2.0}


def test_filler_without_type_is_constant():
    # MobileNet's Scale layers: filler { value: 1 }
    assert parse_filler({"value": 1}) == {"type": "constant", "value": 1.0}
    assert (fill(np.random.default_rng(0), (3,), parse_filler({"value": 1}), 1, 1, np.float32) == 1).all()


def test_filler_refuses_a_field_caffe_does_not_have():
    with pytest.raises(ValueError, match="no option 'sdt'; did you mean 'std'"):
        parse_filler({"type": "gaussian", "sdt": 1})
    with pytest.raises(ValueError, match="variance_norm"):
        parse_filler({"type": "xavier", "variance_norm": "FAN_SIDEWAYS"})


@pytest.mark.parametrize("norm, fan", [("FAN_IN", 40), ("FAN_OUT", 90), ("AVERAGE", 65)])
def test_xavier_variance_norm_picks_the_fan(norm, fan):
    # Caffe: xavier is U(-sqrt(3/n), sqrt(3/n)) with n the fan variance_norm names
    values = fill(np.random.default_rng(0), (200_000,), parse_filler({"type": "xavier", "variance_norm": norm}),
                  40, 90, np.float64)
    bound = np.sqrt(3.0 / fan)
    assert values.max() <= bound and values.max() > 0.99 * bound
    assert abs(values.var() - 1.0 / fan) < 0.02 / fan


def test_bilinear_filler_is_caffes_upsampling_kernel():
    # Caffe's BilinearFiller for kernel 4 (stride 2): the ramp 0.25, 0.75, 0.75, 0.25
    k = bilinear((2, 1, 4, 4))
    ramp = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(k[1, 0], np.outer(ramp, ramp))
    # kernel 2: f = 1, c = 0 → 1, 0 (stride 1: a copy)
    np.testing.assert_allclose(bilinear((1, 1, 2, 2))[0, 0], [[1, 0], [0, 0]])
