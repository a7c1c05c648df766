"""What the command-line tools share: the network arguments, loading, and failing cleanly."""

import sys

from ..errors import SNError


def net_arguments(parser):
    """Add NET.yaml, --batch, --set, --device, --memory, --policy, --offload-params,
    --placement, --host-memory and --workspace-limit to ``parser``."""
    parser.add_argument("net", metavar="NET.yaml", help="network file")
    parser.add_argument("--batch", type=int, metavar="N", help="batch size (overrides the file's)")
    parser.add_argument("--set", action="append", default=[], metavar="K=V",
                        help="override a network parameter, e.g. --set depth=152 (repeatable)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where to run (default cpu)")
    parser.add_argument("--memory", metavar="SIZE",
                        help="device memory budget for the arena, e.g. 12GiB or 500MB (default: the plan's peak)")
    from ..scheduler.placement import PLACEMENTS
    from ..scheduler.policy import POLICIES
    parser.add_argument("--policy", default="baseline", metavar="P",
                        help=f"memory policy: {', '.join(POLICIES)} (default baseline)")
    parser.add_argument("--offload-params", action="store_true",
                        help="keep parameters, gradients and optimiser state in host memory and update "
                             "there (adds +params to the policy; not with baseline)")
    parser.add_argument("--placement", default="dynamic", choices=PLACEMENTS,
                        help="allocator: dynamic best fit, or planned from lifetimes (default dynamic)")
    parser.add_argument("--host-memory", metavar="SIZE",
                        help="most host memory offloaded tensors may take, e.g. 32GiB (policies that "
                             "offload; default: unbounded)")
    parser.add_argument("--workspace-limit", metavar="SIZE",
                        help="largest workspace of any one algorithm choice, e.g. 8MiB (default: none; "
                             "the budget alone limits it)")


def policy_from_args(args):
    """The policy name: --policy, with ``+params`` for --offload-params."""
    from ..scheduler.policy import PARAMS
    policy = args.policy
    if getattr(args, "offload_params", False) and not policy.endswith(PARAMS):
        policy += PARAMS
    return policy


def sizes_from_args(args):
    """``(memory, host_memory, workspace_limit)`` in bytes from ``args`` (None where not given)."""
    from ..sizes import parse_size
    return tuple(parse_size(v) if v else None
                 for v in (args.memory, getattr(args, "host_memory", None), args.workspace_limit))


def load_spec_from_args(args):
    """The NetSpec named by ``args`` (with --set and --batch applied)."""
    from ..spec import load_spec, parse_overrides
    if args.batch is not None and args.batch < 1:
        raise SNError(f"--batch must be at least 1, got {args.batch}")
    return load_spec(args.net, overrides=parse_overrides(args.set), batch=args.batch)


def solver_from_args(args, spec):
    """The SolverConfig: --solver FILE, else the net file's ``solver:`` section, else defaults;
    then the command-line flags."""
    from ..optim import SolverConfig, load_solver, solver_from_mapping
    if getattr(args, "solver", None):
        solver = load_solver(args.solver)
    elif getattr(spec, "solver", None):
        solver = solver_from_mapping(spec.solver, spec.file, spec.solver_line)
    else:
        solver = SolverConfig()
    overrides = {}
    if getattr(args, "iters", None) is not None and solver.epochs is not None:
        solver = solver.with_overrides(epochs=None)  # --iters wins over the file's epochs
    for flag, key in (("lr", "base_lr"), ("iters", "max_iter"), ("epochs", "epochs"),
                      ("display", "display"),
                      ("test_interval", "test_interval"), ("snapshot_interval", "snapshot")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    if getattr(args, "snapshot", None) and not solver.snapshot and "snapshot" not in overrides:
        overrides["snapshot"] = 0
    return solver.with_overrides(**overrides) if overrides else solver


def fail(error, status=2):
    """Print a user error without a traceback; return the exit status."""
    print(f"error: {error}" if "\n" not in str(error) else f"error:\n{error}", file=sys.stderr)
    return status


def run_cli(parser, run, argv=None):
    """Parse ``argv`` with ``parser`` and call ``run(args)``; a user error becomes one line on
    stderr and exit status 2."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SNError as e:
        return fail(e)
