"""superneuron: a Caffe-like deep-learning framework whose runtime owns every byte of device memory."""

__version__ = "0.1.0"

from .errors import SNError, SpecError  # noqa: E402
from .net import Net, load_net  # noqa: E402

__all__ = ["Net", "load_net", "SNError", "SpecError", "__version__"]
