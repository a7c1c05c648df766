"""superneuron: a Caffe-like deep-learning framework whose runtime owns every byte of device memory.

The Python API: ``load_net`` / ``Net`` (net.py), planned under one ``PlanOptions`` value
(options.py: the same options and defaults as the command-line tools' flags), with
``superneuron.optim.make_optimizer`` for training steps and ``superneuron.planning.plan`` for
plans without a run.
"""

__version__ = "0.1.0"

import sys

from . import planning  # noqa: E402,F401  (reachable after `import superneuron`)
from .train import optim, solver_config  # noqa: E402,F401

# Their names since the first README: `from superneuron.optim import make_optimizer` keeps working
# now that they live in train/.
sys.modules[__name__ + ".optim"] = optim
sys.modules[__name__ + ".solver_config"] = solver_config
from .errors import SNError, SpecError  # noqa: E402
from .net import Net, load_net  # noqa: E402
from .options import PlanOptions  # noqa: E402

__all__ = ["Net", "load_net", "PlanOptions", "SNError", "SpecError", "optim", "planning", "solver_config",
           "__version__"]
