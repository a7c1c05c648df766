"""Caffe's per-layer rules: the phases a layer runs in (``include``/``exclude``) and its
per-blob ``param:`` blocks; read by the spec loader, with errors as ValueError texts."""

from .layers.base import Key

PHASES = frozenset({"TRAIN", "TEST"})


def phases_of(include, exclude):
    """The phases a layer runs in from Caffe's ``include``/``exclude`` rules (a mapping
    ``{phase: TRAIN}`` or a list of them): any include rule that matches puts it in, any exclude
    rule that matches leaves it out. Raises ValueError naming what is wrong."""
    def rules(value, key):
        items = value if isinstance(value, list) else [value]
        out = []
        for rule in items:
            if not isinstance(rule, dict) or set(rule) != {"phase"}:
                raise ValueError(f"'{key}': expected {{phase: TRAIN}} or {{phase: TEST}} (or a list of "
                                 f"them); stage and level rules are not supported, got {rule!r}")
            if rule["phase"] not in PHASES:
                raise ValueError(f"'{key}': phase must be TRAIN or TEST, got {rule['phase']!r}")
            out.append(rule["phase"])
        return set(out)
    phases = set(PHASES)
    if include is not None:
        phases = rules(include, "include")
    if exclude is not None:
        phases -= rules(exclude, "exclude")
    if not phases:
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
