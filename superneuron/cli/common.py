"""What the command-line tools share: the network arguments, loading, and failing cleanly."""

import os
import sys

from ..errors import SNError
from ..limits import MAX_BATCH, over
from ..netfile.rules import NetState, net_states
from ..netfile.spec import load_spec, parse_overrides
from ..options import LISTED, PLACEMENTS, PlanOptions
from ..train.solver_config import SolverConfig, load_solver, load_solver_prototxt, solver_from_mapping


def net_arguments(parser):
    """Add NET.yaml, --batch, --set, --device, --memory, --policy, --offload-params,
    --placement, --host-memory, --workspace-limit and --lossy to ``parser``."""
    parser.add_argument("net", metavar="NET.yaml", nargs="?",
                        help="network file (YAML, or Caffe's .prototxt); may be left out when "
                             "--solver is a Caffe solver.prototxt with net:")
    parser.add_argument("--batch", type=int, metavar="N", help="batch size (overrides the file's)")
    parser.add_argument("--set", action="append", default=[], metavar="K=V",
                        help="override a network parameter, e.g. --set depth=152 (repeatable)")
    parser.add_argument("--stage", action="append", default=[], metavar="NAME",
                        help="a stage of Caffe's NetState, for both phases (repeatable): layers whose "
                             "include/exclude rules name stages are chosen by it (default: the solver's "
                             "train_state/test_state, else none)")
    parser.add_argument("--level", type=int, default=None, metavar="N",
                        help="the level of Caffe's NetState, for both phases (default: the solver's, else 0)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where to run (default cpu)")
    parser.add_argument("--memory", metavar="SIZE",
                        help="device memory budget for the arena, e.g. 12GiB or 500MB (default: the plan's peak)")
    parser.add_argument("--policy", metavar="P",
                        help=f"memory policy: {', '.join(LISTED)} (default baseline; sn-train with "
                             f"--memory: auto)")
    parser.add_argument("--offload-params", action="store_true",
                        help="keep parameters, gradients and optimiser state in host memory and update "
                             "there (adds +params to the policy: any but baseline)")
    parser.add_argument("--placement", default="dynamic", choices=PLACEMENTS,
                        help="allocator: dynamic best fit, or planned from lifetimes (default dynamic)")
    parser.add_argument("--host-memory", metavar="SIZE",
                        help="most host memory offloaded tensors may take, e.g. 32GiB (policies that "
                             "offload; default: unbounded)")
    parser.add_argument("--workspace-limit", metavar="SIZE",
                        help="largest workspace of any one algorithm choice, e.g. 8MiB (default: none; "
                             "the budget alone limits it)")
    parser.add_argument("--lossy", choices=("fp16",), action="append", default=[], metavar="fp16",
                        help="also keep stashed feature maps in half precision between the forward and "
                             "the backward (Gist's delayed precision reduction; policies that encode: gist, and "
                             "optimal and auto, which may choose it)")
    parser.add_argument("--solver-time", type=float, default=None, metavar="SECONDS",
                        help="a cap on the optimal and auto policies' solving time (default: none; the solver's "
                             "work limits end it, so a plan is the same on every run; a cap that cuts it "
                             "short may not be)")


def options_from_args(args, policy=None, **changes):
    """The options.PlanOptions of ``args``: --policy (not given: ``policy``, and where that is
    None, ``auto`` under --memory, else ``baseline``) with --offload-params, --memory,
    --host-memory, --workspace-limit, --placement, --device, --lossy, --solver-time, and where
    the tool has them --bucket-size, --sync-bn and --cuda-graph; ``changes``: fields set besides (``ranks``).
    Checked once there: SNError, one line, for a bad size or name."""
    settings = {"policy": args.policy or policy, "budget": args.memory or None,
                "host_memory": getattr(args, "host_memory", None) or None,
                "workspace_limit": args.workspace_limit or None, "placement": args.placement,
                "device": args.device, "lossy": tuple(args.lossy), "solver_seconds": args.solver_time,
                "offload_params": getattr(args, "offload_params", False),
                "sync_bn": getattr(args, "sync_bn", False), "cuda_graph": getattr(args, "cuda_graph", False)}
    if getattr(args, "bucket_size", None):
        settings["bucket_bytes"] = args.bucket_size
    settings.update(changes)
    return PlanOptions.of(**settings)


def load_spec_from_args(args):
    """The NetSpec named by ``args`` (with --set and --batch applied)."""
    if args.net is None:
        args.net = _solver_net(args)
    check_batch(args.batch)
    data = getattr(args, "data", None)
    states = net_states_from_args(args)
    if data and str(args.net).lower().endswith(".prototxt"):
        # a Caffe net's Data layers read datasets we do not: they become synthetic data
        spec = load_spec(args.net, overrides=parse_overrides(args.set), batch=args.batch, data=data,
                         states=states)
        args.data = "synthetic"
        return spec
    return load_spec(args.net, overrides=parse_overrides(args.set), batch=args.batch, states=states)


def net_states_from_args(args):
    """``{phase: NetState}`` from --stage and --level, else a Caffe solver.prototxt's
    ``train_state``/``test_state``, else None (level 0, no stage)."""
    stages, level = getattr(args, "stage", None) or (), getattr(args, "level", None)
    if stages or level is not None:
        return net_states(stages, level or 0)
    solver = getattr(args, "solver", None)
    if solver and str(solver).lower().endswith(".prototxt"):
        from ..netfile.caffe.solver import solver_states  # late: protobuf's start-up cost
        train, test = solver_states(solver)
        if train or test:
            return net_states(train=train and NetState(*train), test=test and NetState(*test))
    return None


def check_batch(batch):
    """SNError unless ``--batch`` (None: not given) is in 1 .. MAX_BATCH."""
    if batch is not None and batch < 1:
        raise SNError(f"--batch must be at least 1, got {batch}")
    if batch is not None and batch > MAX_BATCH:
        raise SNError(over("--batch", batch, MAX_BATCH, "MAX_BATCH"))


def _solver_net(args):
    """The net a Caffe solver.prototxt names (``--solver`` without NET), as ``caffe train`` does."""
    solver = getattr(args, "solver", None)
    if solver and str(solver).lower().endswith(".prototxt"):
        net = load_solver_prototxt(solver)[1]
        if net is not None:
            return net
        raise SNError(f"{solver}: the solver names no net (net:); give the network file")
    raise SNError("give the network file (NET.yaml or MODEL.prototxt)")


def solver_from_args(args, spec):
    """The SolverConfig: --solver FILE, else the net file's ``solver:`` section, else defaults;
    then the command-line flags."""
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
                      ("test_interval", "test_interval"), ("snapshot_interval", "snapshot"),
                      ("iter_size", "iter_size")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    if getattr(args, "snapshot", None) and not solver.snapshot and "snapshot" not in overrides:
        overrides["snapshot"] = 0
    return solver.with_overrides(**overrides) if overrides else solver


def fail(error, status=2):
    """Print a user error without a traceback (status 130: that Ctrl-C stopped the tool);
    return the exit status."""
    print(error_text(error, status), file=sys.stderr)
    return status


def error_text(error, status=2, prefix=""):
    """What tells ``error``: ``error: MESSAGE`` (``error:`` on a line of its own before a
    message of several lines), or the bare message for status 130; ``prefix`` (``rank 1: ``)
    goes before the message."""
    text = f"{prefix}{error}"
    if status == 130:
        return text
    return f"error: {text}" if "\n" not in text else f"error:\n{text}"


def run_cli(parser, run, argv=None, fail=fail):
    """Parse ``argv`` with ``parser`` and call ``run(args)``; a user error becomes one line on
    stderr and exit status 2. Output piped into a reader that stops (``| head``) ends the tool
    quietly with status 141, as SIGPIPE ends a C tool, instead of a BrokenPipeError.

    ``fail(error, status)`` tells a user error, Ctrl-C (status 130) or a usage error (then
    SystemExit with its status, as argparse's); the default prints it (sn-train's ranks
    gather them first, to say once what every rank hit)."""
    parser.error = lambda message: _usage_error(parser, message, fail)
    args = parser.parse_args(argv)
    try:
        check_no_blank_values(parser, args)
        status = run(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at the exit
        return status
    except SNError as e:
        return fail(e)
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except MemoryError:
        return fail("out of memory (a batch, size or data set too large for this machine?)")
    except KeyboardInterrupt:  # Ctrl-C outside training (which snapshots and says so itself)
        return fail("interrupted", 130)


def check_no_blank_values(parser, args):
    """SNError for an option (or argument) given an empty or blank value (``--policy ""``): it
    would otherwise mean the default, a file named by spaces, or nothing, silently. The message
    lists what the option takes: its choices, else its help (the policies, the data sources)."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        given = value if isinstance(value, list) else [value]
        if not any(isinstance(v, str) and not v.strip() for v in given):
            continue
        name = "/".join(action.option_strings) or action.metavar or action.dest
        if action.choices:
            raise SNError(f"{name} is empty; expected one of {', '.join(map(str, action.choices))}")
        what = " ".join((action.help or "").split())
        raise SNError(f"{name} is empty; expected {action.metavar or action.dest.upper()}"
                      + (f" ({what})" if what and "%(" not in what else ""))


def _usage_error(parser, message, fail):
    """argparse's error, as one line (argparse prints the whole usage first) and status 2."""
    sys.exit(fail(f"{message} (see {parser.prog} --help)", 2))


def _silence_stdout():
    """Point stdout at /dev/null, so that flushing it at exit cannot raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout without a file (in tests): nothing to flush
        pass
