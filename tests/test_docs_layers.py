"""The layer list of docs/net-files.md (the README points to it) names every layer type a net
file may use, and every type told apart as not supported, with the error a user gets."""

import os
import re

from superneuron.layers import REGISTRY, layer_class
from superneuron.layers.registry import UNSUPPORTED

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "net-files.md")


def _named():
    return set(re.findall(r"`(\w+)`", open(DOC).read()))


def test_every_registered_layer_type_is_listed():
    public = {t for t, cls in REGISTRY.items() if not cls.__dict__.get("INTERNAL", False)}
    missing = sorted(public - _named())
    assert not missing, f"docs/net-files.md does not list {missing}"


def test_every_unsupported_type_is_listed_with_the_error_it_gives():
    text = open(DOC).read()
    missing = sorted(set(UNSUPPORTED) - _named())
    assert not missing, f"docs/net-files.md does not list {missing} as not supported"
    for origin in set(UNSUPPORTED.values()):
        name = next(t for t, o in UNSUPPORTED.items() if o == origin)
        try:
            layer_class(name)
        except KeyError as e:
            said = e.args[0]
        assert said.split("(", 1)[1] in text, said  # what follows the type's name, as the table shows it
