"""superneuron: a Caffe-like deep-learning framework whose runtime owns every byte of device memory."""

__version__ = "0.1.0"
