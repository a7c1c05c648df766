"""sn-convert: a Caffe ``.prototxt`` net written as the equivalent YAML net file, so that a user
can start from a model-zoo file and go on with our templates and ``${}`` parameters.

    sn-convert lenet_train_test.prototxt --data synthetic:1x28x28 -o lenet.yaml
    sn-convert ResNet-50-deploy.prototxt --add-loss -o resnet50.yaml
    sn-convert lenet_solver.prototxt -o lenet_solver.yaml    # a file named *solver*: a solver
    sn-convert snaps/LeNet_iter_500.npz --net lenet.yaml -o lenet.caffemodel
    sn-convert lenet.yaml -o lenet.prototxt                  # and back: a YAML net as a prototxt

The YAML plans and trains exactly as the prototxt does (``sn-plan`` prints the same figures).
"""

import argparse
import os
import sys

from ..errors import SNError
from ..graph import Graph
from ..net import Net
from ..netfile.caffe.prototxt import add_loss, is_prototxt, prototxt_tree
from ..netfile.caffe.prototxt_out import spec_to_prototxt
from ..netfile.caffe.solver import solver_mapping
from ..netfile.caffe.textproto import read_text
from ..netfile.caffe.weights import write_caffemodel
from ..netfile.caffe.yaml_out import tree_to_yaml
from ..netfile.spec import load_spec, spec_from_tree
from ..train import snapshot as snap
from ..train.optim import make_optimizer
from ..train.solver_config import SolverConfig, solver_from_mapping
from .common import run_cli


def build_parser():
    p = argparse.ArgumentParser(prog="sn-convert", description="Write a Caffe .prototxt net as a YAML net file, "
                                "or a YAML net as a .prototxt.")
    p.add_argument("net", metavar="MODEL.prototxt",
                   help="Caffe net (NetParameter text format), a solver.prototxt, a YAML net (written as "
                        "a .prototxt), or a snapshot .npz")
    p.add_argument("--net", dest="from_net", metavar="NET",
                   help="with a snapshot SNAPSHOT.npz: the net it was trained from (then -o MODEL.caffemodel)")
    p.add_argument("-o", "--output", metavar="MODEL.yaml", help="where to write (default: standard output)")
    p.add_argument("--add-loss", action="store_true",
                   help="for deploy files: add a label input and replace the final Softmax by SoftmaxWithLoss")
    p.add_argument("--data", metavar="synthetic[:CxHxW]",
                   help="write the Data layers as synthetic data of their shape (Caffe's datasets are not read)")
    return p


def main(argv=None):
    return run_cli(build_parser(), run, argv)


def run(args):
    if str(args.net).lower().endswith(".npz"):
        return _snapshot_to_caffemodel(args)
    if args.from_net:
        raise SNError("--net is for converting a snapshot (.npz) to a .caffemodel")
    if str(args.net).lower().endswith((".yaml", ".yml")):
        text, count = _yaml_to_prototxt(args)
        return _write(args, text, count)
    if not is_prototxt(args.net):
        raise SNError(f"{args.net}: sn-convert reads Caffe .prototxt files, YAML nets and our snapshots (.npz)")
    if "solver" in os.path.basename(args.net).lower():
        text, count = _solver_yaml(args.net), None
    else:
        root = prototxt_tree(read_text(args.net), args.net, args.data)
        if args.add_loss:
            add_loss(root)
        spec_from_tree(root, args.net)  # every check a YAML net gets, before anything is written
        text, count = tree_to_yaml(root, source=args.net), len(root["layers"])
    return _write(args, text, count)


def _yaml_to_prototxt(args):
    """A YAML net (templates, repeats and ${} expanded) as a Caffe .prototxt's text."""
    if args.add_loss or args.data:
        raise SNError("--add-loss and --data are for converting a .prototxt to YAML")
    spec = load_spec(args.net)
    Graph(spec)  # every check a net gets, before anything is written
    return spec_to_prototxt(spec), len(spec.layers)


def _write(args, text, count):
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise SNError(f"cannot write '{args.output}': {e.strerror or e}") from None
    print(f"wrote {args.output}" + (f" ({count} layers)" if count is not None else ""), file=sys.stderr)
    return 0


def _snapshot_to_caffemodel(args):
    """A snapshot of ours, checked whole, written as the .caffemodel of its net's weights."""
    if not args.from_net or not args.output:
        raise SNError("a snapshot converts with --net NET (the net it was trained from) and -o MODEL.caffemodel")
    spec = load_spec(args.from_net)
    errors = []
    # the snapshot names its solver; its state arrays are checked against each kind in turn
    kinds = [SolverConfig(), SolverConfig(momentum=0.0)] + [
        SolverConfig(type=kind) for kind in ("Nesterov", "Adam", "AdaGrad", "RMSProp", "AdaDelta")]
    for solver in kinds:
        net = Net(spec, optimizer=make_optimizer(solver))
        identity = {"net": net.graph.name, "fingerprint": snap.fingerprint(net), "solver": solver.type}
        try:
            _, arrays = snap.read(args.net, snap.expected_arrays(net), identity)
            break
        except snap.BadSnapshot as e:
            errors.append(str(e))
    else:
        raise SNError(errors[0])
    params = {key.split(":", 1)[1]: a for key, a in arrays.items() if key.startswith("param:")}
    write_caffemodel(net, args.output, params)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _solver_yaml(path):
    """A Caffe solver.prototxt (its file name says solver) as our solver YAML."""
    import yaml

    mapping, lines, net = solver_mapping(path)
    solver_from_mapping(mapping, str(path), lines)  # checked before anything is written
    head = f"# converted from {os.path.basename(str(path))} by sn-convert\n"
    if net:
        head += f"# net: {net} (give it to sn-train as the network file)\n"
    return head + yaml.safe_dump(mapping, sort_keys=False)


if __name__ == "__main__":
    sys.exit(main())
