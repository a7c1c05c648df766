"""A net's YAML-layout mapping (as :mod:`.prototxt` builds it) written as a YAML net file: one
line per layer, in the style of the nets in ``nets/``."""

import os

import yaml


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _flow(value):
    return yaml.safe_dump(_plain(value), default_flow_style=True, sort_keys=False, width=1 << 30).strip()


def tree_to_yaml(root, source=None):
    """The YAML text of ``root`` (keys ``name``, ``input``, ``layers``, ``solver``)."""
    lines = []
    if source:
        lines.append(f"# converted from {os.path.basename(str(source))} by sn-convert")
    if "name" in root:
        lines.append(yaml.safe_dump({"name": str(root["name"])}, width=1 << 30).strip())
    if "input" in root:
        lines.append(f"input: {_flow(root['input'])}")
    lines.append("layers:")
    for item in root["layers"]:
        lines.append(f"  - {_flow(item)}")
    if root.get("solver"):
        lines.append(f"solver: {_flow(root['solver'])}")
    return "\n".join(lines) + "\n"
