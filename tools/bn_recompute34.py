"""Issue 34's quarter with BatchNorm recomputed from its saved statistics, side by side: the
optimal plan's estimate against liveness's, H100 cost model, batch 32, as

    sn-plan nets/resnet.yaml --set depth=D --batch 32 --device gpu --policy optimal --memory B

plans it, B a fraction of liveness's arena (``near``: 1.1 times the lower bound sn-plan prints
for liveness), in one of three forms: ``now`` (this tree), ``forward`` (this tree with a
Recompute priced as its forward: the model's BatchNorm passes counted, the cheaper
recomputation not), and, run from a checkout of the tree before (``--tree DIR``), that tree.

    python tools/bn_recompute34.py resnet101 1/4 --form now [--tree /tmp/before] [--json OUT] [--state-over 1.0]
"""

import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("net")
p.add_argument("fraction")
p.add_argument("--form", choices=("now", "forward"), default="now")
p.add_argument("--tree", help="plan with the superneuron of this checkout instead")
p.add_argument("--json", help="append one line of JSON here")
p.add_argument("--state-over", type=float,
               help="solve the programs with the state (then the parameters) on the host where the plan is over "
                    "this many times liveness's time (optimal.STATE_OVER; default its own)")
args = p.parse_args()
root = args.tree or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(root, "tools"), root]

from optimal_table import lowered_net  # noqa: E402

from superneuron.planning import plan  # noqa: E402
from superneuron.scheduler import optimal  # noqa: E402
from superneuron.scheduler.cost import CostModel  # noqa: E402

if args.state_over is not None:
    optimal.STATE_OVER = args.state_over
if args.form == "forward":
    CostModel.recompute_seconds = lambda self, layer, algo: self.algo_seconds(layer, "forward", algo)
base, live, live_seconds, model = lowered_net(args.net, 32, CostModel("gpu"))
# (as optimal_gap.py's main: not imported from there, since --tree runs the tools of a tree
# that may not have it)
if args.fraction == "near":
    budget = round(live.lower_bound_bytes * 1.10)
else:
    num, _, den = args.fraction.partition("/")
    budget = round(live.arena_bytes * float(num) / float(den or 1))
memo, start = {}, time.process_time()
schedule, planned = plan(base, "optimal", budget=budget, cost=model, memo=memo)
cpu = time.process_time() - start
seconds = model.iteration_seconds(schedule)
row = {"net": args.net, "fraction": args.fraction, "form": "before" if args.tree else args.form,
       "budget": budget, "liveness_ms": live_seconds * 1e3, "ms": seconds * 1e3,
       "ratio": seconds / live_seconds, "fits": planned.fits(budget), "winner": memo["optimal"]["winner"],
       "cpu_seconds": round(cpu, 1)}
print(json.dumps(row))
if args.json:
    with open(args.json, "a") as f:
        f.write(json.dumps(row) + "\n")
