"""Caffe's per-layer rules: the phases a layer runs in (``include``/``exclude``, with Caffe's
NetState: phase, level and stages) and its per-blob ``param:`` blocks; read by the spec
loader, with errors as ValueError texts."""

from dataclasses import dataclass

from ..layers.base import Key

PHASES = frozenset({"TRAIN", "TEST"})
RULE_FIELDS = ("phase", "min_level", "max_level", "stage", "not_stage")


@dataclass(frozen=True)
class NetState:
    """Caffe's NetState of one phase: a ``level`` and the ``stages`` it is in (the solver's
    ``train_state``/``test_state``, or ``--stage``)."""

    level: int = 0
    stages: frozenset = frozenset()


def net_states(stages=(), level=0, train=None, test=None):
    """``{phase: NetState}``: ``train``/``test`` (NetStates, from a solver) where given, else
    ``stages`` and ``level`` for both phases."""
    both = NetState(level, frozenset(stages))
    return {"TRAIN": train or both, "TEST": test or both}


def _matches(rule, phase, state):
    """Whether a NetStateRule holds in ``phase`` under ``state`` (Caffe's StateMeetsRule)."""
    if "phase" in rule and rule["phase"] != phase:
        return False
    if "min_level" in rule and state.level < rule["min_level"]:
        return False
    if "max_level" in rule and state.level > rule["max_level"]:
        return False
    if any(s not in state.stages for s in rule.get("stage", ())):
        return False
    return not any(s in state.stages for s in rule.get("not_stage", ()))


def _rules(value, key):
    """The NetStateRules of ``include`` or ``exclude`` as dicts (stage lists as tuples);
    ValueError naming what is wrong."""
    items = value if isinstance(value, list) else [value]
    out = []
    for rule in items:
        if not isinstance(rule, dict) or not rule or not set(rule) <= set(RULE_FIELDS):
            raise ValueError(f"'{key}': expected rules such as {{phase: TRAIN}} or {{stage: deploy}} "
                             f"(fields: {', '.join(RULE_FIELDS)}), got {rule!r}")
        rule = dict(rule)
        if "phase" in rule and rule["phase"] not in PHASES:
            raise ValueError(f"'{key}': phase must be TRAIN or TEST, got {rule['phase']!r}")
        for field in ("min_level", "max_level"):
            if field in rule and (isinstance(rule[field], bool) or not isinstance(rule[field], int)):
                raise ValueError(f"'{key}': {field} must be an integer, got {rule[field]!r}")
        for field in ("stage", "not_stage"):
            if field in rule:
                names = rule[field] if isinstance(rule[field], (list, tuple)) else [rule[field]]
                if not all(isinstance(n, str) for n in names):
                    raise ValueError(f"'{key}': {field} must be a name or a list of names, got {rule[field]!r}")
                rule[field] = tuple(names)
        out.append(rule)
    return out


def phases_of(include, exclude, states=None):
    """The phases a layer runs in from Caffe's ``include``/``exclude`` rules (a mapping such as
    ``{phase: TRAIN}`` or ``{stage: deploy, min_level: 1}``, or a list of them) under ``states``
    (``{phase: NetState}``, default level 0 and no stage): any include rule that holds puts it in,
    any exclude rule that holds leaves it out, as Caffe's FilterNet. An empty set where stage or
    level rules leave the layer out of both phases (the net has it in another stage); a
    ValueError naming what is wrong, and for phase rules alone that leave it in no phase."""
    states = states or net_states()
    inc = None if include is None else _rules(include, "include")
    exc = [] if exclude is None else _rules(exclude, "exclude")
    phases = set()
    for phase in PHASES:
        state = states[phase]
        if (inc is None or any(_matches(r, phase, state) for r in inc)) \
                and not any(_matches(r, phase, state) for r in exc):
            phases.add(phase)
    if not phases and all(set(r) <= {"phase"} for r in (inc or []) + exc):
        raise ValueError("the layer runs in no phase (its include and exclude leave none)")
    return frozenset(phases)


def param_blocks(value):
    """Caffe's ``param: [{lr_mult: 1, decay_mult: 1}, {lr_mult: 2, decay_mult: 0}]`` (one
    block per parameter, in order) → ``(lr_mults, decay_mults)``; a missing mult is 1."""
    items = value if isinstance(value, list) else [value]
    lr, decay = [], []
    for block in items:
        if not isinstance(block, dict) or not set(block) <= {"lr_mult", "decay_mult", "name"}:
            raise ValueError(f"'param': expected a list of {{lr_mult: x, decay_mult: y}}, got {block!r}")
        if "name" in block:
            raise ValueError("'param': shared parameters (param name) are not supported; give "
                             "each layer its own parameters")
        lr.append(block.get("lr_mult", 1.0))
        decay.append(block.get("decay_mult", 1.0))
    key = Key("floats")
    return key.convert(lr) if lr else (), key.convert(decay) if decay else ()
