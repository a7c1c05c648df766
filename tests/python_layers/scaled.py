# A Python layer with a param_str and a phase: y = k x when training, x when testing.
import caffe


class Scaled(caffe.Layer):
    def setup(self, bottom, top):
        self.k = float(self.param_str or 1)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        k = self.k if self.phase == caffe.TRAIN else 1.0
        top[0].data[...] = k * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = self.k * top[0].diff


class Broken(caffe.Layer):
    def reshape(self, bottom, top):
        raise ValueError("no shape for you")


class HalfSquareLoss(caffe.Layer):
    """0.5 * sum(x^2), its gradient scaled by the top's diff (the loss weight), as a careful
    Python loss reads it: top[0].diff[0]."""

    def reshape(self, bottom, top):
        top[0].reshape(1)

    def forward(self, bottom, top):
        top[0].data[0] = 0.5 * (bottom[0].data ** 2).sum()

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = top[0].diff[0] * bottom[0].data
