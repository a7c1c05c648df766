"""superneuron: a Caffe-like deep-learning framework whose runtime owns every byte of device memory.

The Python API: ``load_net`` / ``Net`` (net.py), planned under one ``PlanOptions`` value
(options.py: the same options and defaults as the command-line tools' flags), with
``superneuron.optim.make_optimizer`` for training steps and ``superneuron.planning.plan`` for
plans without a run.
"""

__version__ = "0.1.0"

from . import optim, planning, solver_config  # noqa: E402,F401  (reachable after `import superneuron`)
from .errors import SNError, SpecError  # noqa: E402
from .net import Net, load_net  # noqa: E402
from .options import PlanOptions  # noqa: E402

__all__ = ["Net", "load_net", "PlanOptions", "SNError", "SpecError", "optim", "planning", "solver_config",
           "__version__"]
