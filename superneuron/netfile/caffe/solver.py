"""Caffe ``solver.prototxt`` → our :class:`~superneuron.train.solver_config.SolverConfig`, and the net file
it names (``net:``, resolved beside the solver file).

Keys that change training map onto ours (``base_lr``, ``lr_policy`` with ``inv``, ``exp`` and
``sigmoid``, ``gamma``, ``power``, ``stepsize``, ``stepvalue``, ``momentum``, ``momentum2``,
``delta``, ``rms_decay``, ``weight_decay``, ``regularization_type``, ``clip_gradients``, ``max_iter``,
``test_iter``, ``test_interval``, ``display``, ``average_loss``, ``iter_size`` (gradient
accumulation), ``snapshot``, ``snapshot_prefix``, ``type`` or the old ``solver_type``: SGD,
Nesterov, Adam, AdaGrad, RMSProp, AdaDelta). AdaGrad and RMSProp refuse a momentum, as Caffe
does. Keys that only say how Caffe runs (``solver_mode``, ``device_id``, ``debug_info``, ...)
are accepted and have no effect here; any key we cannot honour is an error naming its line,
never silently dropped.
"""

import os

from ...errors import SpecError, where
from . import caffe_pb2
from .textproto import parse, read_text

DIRECT = ("base_lr", "lr_policy", "gamma", "power", "stepsize", "momentum", "momentum2", "delta",
          "rms_decay", "weight_decay", "regularization_type", "clip_gradients", "max_iter", "test_interval", "display",
          "average_loss", "snapshot", "snapshot_prefix", "iter_size")
NO_EFFECT = ("solver_mode", "device_id", "debug_info", "test_compute_loss", "test_initialization",
             "snapshot_after_train", "snapshot_format", "layer_wise_reduce", "snapshot_diff")
TYPES = {"SGD": "SGD", "Nesterov": "Nesterov", "Adam": "Adam", "AdaGrad": "AdaGrad", "RMSProp": "RMSProp",
         "AdaDelta": "AdaDelta", "NESTEROV": "Nesterov", "ADAM": "Adam", "ADAGRAD": "AdaGrad",
         "RMSPROP": "RMSProp", "ADADELTA": "AdaDelta"}
NO_MOMENTUM = ("AdaGrad", "RMSProp")  # Caffe's CHECK: "Momentum cannot be used with AdaGrad"


def solver_mapping(path, find_net=True):
    """``(mapping of our solver keys, their lines, net path or None)`` of a Caffe solver file.
    ``find_net=False``: the net is named elsewhere (on the command line, which wins over the
    solver's ``net:``, as in ``caffe train``), so a ``net:`` path missing here is no error
    and None is returned for it."""
    file = str(path)
    param = caffe_pb2.SolverParameter()
    pos = parse(read_text(path, "solver file"), param, file)
    mapping, lines, problems = {}, {}, []

    def at(name):
        return where(file, *pos.at(name))

    for field, value in param.ListFields():
        name = field.name
        if name in DIRECT:
            mapping[name] = _f32(value) if field.type == field.TYPE_FLOAT else value
        elif name == "stepvalue":
            mapping["stepvalue"] = list(value)
        elif name == "test_iter":
            if len(set(value)) > 1:
                problems.append(at(name) + "one test net only: give one test_iter")
            mapping["test_iter"] = value[0]
        elif name in ("type", "solver_type"):
            spelled = value if name == "type" else field.enum_type.values_by_number[value].name
            if spelled not in TYPES and spelled != "SGD":
                problems.append(at(name) + f"solver type {spelled} is not supported "
                                "(SGD, Nesterov, Adam, AdaGrad, RMSProp, AdaDelta)")
                continue
            mapping["type"] = TYPES.get(spelled, "SGD")
        elif name in ("net", "random_seed", "train_state", "test_state") or name in NO_EFFECT:
            continue  # train_state/test_state choose the net's layers: solver_states
        else:
            problems.append(at(name) + f"'{name}' is not supported (give the net with 'net:')")
        if name in mapping or name in ("type", "solver_type"):
            lines["type" if name == "solver_type" else name] = pos.at(name)[0]
    if mapping.get("type") in NO_MOMENTUM and mapping.get("momentum"):
        problems.append(at("momentum") + f"momentum cannot be used with {mapping['type']} (Caffe refuses it too)")
    if problems:
        raise SpecError(problems)
    for key, default in (("momentum", 0.0), ("weight_decay", 0.0), ("lr_policy", None)):
        if key not in mapping and default is not None:
            mapping[key] = default  # Caffe's defaults where they differ from ours
    if "lr_policy" not in mapping:
        raise SpecError(where(file, 1) + "lr_policy is required (Caffe has no default): fixed, step, ...")
    found = param.HasField("net") and find_net
    return mapping, lines, (resolve_net(param.net, file, pos.at("net")) if found else None)


def solver_states(path):
    """``(train, test)``: the solver's ``train_state`` and first ``test_state`` as
    ``(level, frozenset of stages)``, each None where not given (Caffe's NetState)."""
    param = caffe_pb2.SolverParameter()
    parse(read_text(path, "solver file"), param, str(path))
    train = (param.train_state.level, frozenset(param.train_state.stage)) if param.HasField("train_state") else None
    test = param.test_state[0] if param.test_state else None
    return train, test and (test.level, frozenset(test.stage))


def resolve_net(net, solver_file, mark):
    """The net file a solver names: beside the solver file, else as written (Caffe reads it
    from the working folder), else its file name beside the solver (a model zoo's
    ``examples/mnist/...`` paths moved with the solver)."""
    here = os.path.dirname(os.path.abspath(solver_file))
    tried = [os.path.join(here, net), net, os.path.join(here, os.path.basename(net))]
    for path in tried:
        if os.path.isfile(path):
            return os.path.relpath(path) if not os.path.isabs(net) else path
    raise SpecError(where(solver_file, *mark) + f"net '{net}' not found (looked for "
                    + ", ".join(dict.fromkeys(tried)) + ")")


def _f32(value):
    return float(str(__import__("numpy").float32(value)))
