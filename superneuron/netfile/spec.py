"""Net files → NetSpec, the entry points: load_spec, loads_spec, prototxt_spec, spec_from_tree, --set's values.

A file has ``name``, ``params`` (defaults, replaced by ``--set``; each may use the ones before
it), ``input`` (top name → shape, batch first), ``templates`` (name → list of layers) and
``layers``. An item of a layer list is a layer (Caffe's keys, flattened), ``{use: template,
with: {args}}``, or ``{repeat: n, as: i, use: ... | layers: [...]}``. Strings may hold
``${expr}`` (see :mod:`superneuron.netfile.expr`); ``prev`` names the first top of the layer emitted
last. Every problem in a file is reported at once, each as
``file:line:col: layer 'name' (Type): what is wrong``. Graph-level checks (dangling bottoms,
shapes) belong to :mod:`superneuron.graph`, which reads the positions kept on each LayerSpec.
The work is done by loader.py (params, input, top-level keys), expand.py (templates and
repeats) and layer_check.py (each layer), into netspec.py's LayerSpec and NetSpec.
"""

from ..errors import SpecError
from ..files import read_text_capped
from ..limits import MAX_NET_FILE_BYTES
from .loader import Loader, plain
from .yaml_read import parse_yaml


def parse_overrides(items):
    """``["depth=152", "blocks=[3,8,36,3]"]`` → ``{"depth": 152, "blocks": [3, 8, 36, 3]}``
    (values are read as YAML, so numbers and lists keep their type)."""
    out, problems = {}, []
    for item in items or ():
        key, eq, text = str(item).partition("=")
        key = key.strip()
        if not eq or not key.isidentifier() or not text.strip():
            problems.append(f"--set {item!r}: expected NAME=VALUE, such as depth=50")
            continue
        try:  # with positions dropped; read as a file is, so an alias bomb is refused too
            out[key] = plain(parse_yaml(text, "--set"))
        except SpecError as e:
            why = str(e).split("invalid YAML: ", 1)[-1]
            problems.append(f"--set {item if len(item) <= 60 else item[:57] + '...'!r}: the value is not "
                            f"valid YAML ({why})")
    if problems:
        raise SpecError(problems)
    return out


def load_spec(path, overrides=None, batch=None, data=None, states=None):
    """Read, expand and check the network file at ``path``; a :class:`NetSpec` or SpecError.

    ``overrides`` (name → value, from ``--set``) replace entries of ``params:``; ``batch``
    replaces the first dimension of every input (and a Data layer's ``batch_size``).
    A Caffe ``.prototxt`` is read by :mod:`superneuron.netfile.caffe.prototxt` into the same spec;
    ``data="synthetic"`` replaces its Data layers with synthetic data of their shape.
    ``states`` (``{phase: rules.NetState}``, from ``--stage`` or a solver's ``train_state``
    and ``test_state``) chooses the layers whose include/exclude rules name stages or levels."""
    if str(path).lower().endswith(".prototxt"):
        # here, not at the top: Caffe's formats load protobuf, which costs start-up time
        from .caffe.textproto import read_text
        return prototxt_spec(read_text(path), str(path), overrides, batch, data, states=states)
    text = read_text_capped(path, MAX_NET_FILE_BYTES, "network file", error=SpecError)
    return loads_spec(text, str(path), overrides, batch, states)


def loads_spec(text, file="<net>", overrides=None, batch=None, states=None):
    """Like :func:`load_spec`, for YAML given as a string."""
    return Loader(file, overrides, batch, states).load(text)


def prototxt_spec(text, file="<net>", overrides=None, batch=None, data=None, loss=False, states=None):
    """The :class:`NetSpec` of a Caffe ``.prototxt``'s text, translated by
    :mod:`superneuron.netfile.caffe.prototxt` into the YAML layout and given every check a YAML net gets
    (``data``: ``synthetic[:CxHxW]`` replaces its Data layers; ``loss``: see ``add_loss``)."""
    # here, not at the top: Caffe's formats load protobuf, which costs start-up time
    from .caffe.prototxt import add_loss, prototxt_tree
    root = prototxt_tree(text, file, data)
    if loss:
        add_loss(root)
    return spec_from_tree(root, file, overrides, batch, states)


def spec_from_tree(root, file, overrides=None, batch=None, states=None):
    """A :class:`NetSpec` from an already-read file: a :class:`Map` of the YAML layout (the
    Caffe reader builds one, with the positions of its own file)."""
    return Loader(file, overrides, batch, states).load_root(root)
