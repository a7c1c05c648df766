"""The layer registry: Caffe type names → layer classes, filled by ``@register`` beside each
class. Its own module, so that a layer module imports it without importing the package that
imports every layer module."""

import difflib

REGISTRY = {}


def register(cls):
    """Class decorator: make ``cls`` available under its class name as a YAML ``type``."""
    cls.type = cls.__name__
    REGISTRY[cls.type] = cls
    return cls


def layer_class(type_name):
    """The class registered as ``type_name``; KeyError with a suggestion when it is unknown."""
    try:
        return REGISTRY[type_name]
    except KeyError:
        known = sorted(t for t in REGISTRY if not REGISTRY[t].__dict__.get("INTERNAL", False))
        close = difflib.get_close_matches(str(type_name), known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known types: {', '.join(known)}"
        raise KeyError(f"unknown layer type '{type_name}'{hint}") from None
