"""Caffe's text format (``.prototxt``) read with protobuf's ``text_format``, keeping where each
field was written so that problems found later point into the file.

``text_format`` parses and checks values (types, enum names, syntax). Before it runs, one sweep
with protobuf's own tokenizer records the line and column of every field (a :class:`Pos` tree
parallel to the message) and collects every field the schema lacks, so that a file with several
unknown fields gets them all in one error rather than one per run.
"""

import difflib

from google.protobuf import text_format

from ...errors import SpecError, where
from ...files import read_text_capped
from ...limits import MAX_NET_FILE_BYTES, MAX_SOLVER_FILE_BYTES


def read_text(path, what="network file"):
    """The text of ``path`` through the capped reader every network and solver file goes through
    (a regular UTF-8 file within its limit), or a one-line SpecError."""
    if what == "solver file":
        return read_text_capped(path, MAX_SOLVER_FILE_BYTES, what, "MAX_SOLVER_FILE_BYTES", SpecError)
    return read_text_capped(path, MAX_NET_FILE_BYTES, what, "MAX_NET_FILE_BYTES", SpecError)


class Pos:
    """Where a message was written (``line``, ``col``, 1-based) and each of its fields:
    ``fields[name]`` lists, per occurrence, ``(line, col, Pos of a message value or None,
    raw token of a scalar value or None)``."""

    __slots__ = ("line", "col", "fields")

    def __init__(self, line, col):
        self.line, self.col, self.fields = line, col, {}

    @property
    def mark(self):
        return (self.line, self.col)

    def at(self, name, i=0):
        """Where occurrence ``i`` of field ``name`` was written (the message's own place if not)."""
        found = self.fields.get(name, ())
        return found[min(i, len(found) - 1)][:2] if found else self.mark

    def child(self, name, i=0):
        """The Pos of occurrence ``i`` of message field ``name`` (an empty one where absent)."""
        found = self.fields.get(name, ())
        if i < len(found) and found[i][2] is not None:
            return found[i][2]
        return Pos(*self.at(name, i))

    def scalar(self, name):
        """The first value written for scalar field ``name``, unquoted; None if absent."""
        for _, _, _, raw in self.fields.get(name, ()):
            if raw is not None:
                return raw[1:-1] if raw[:1] in "'\"" else raw
        return None


class _Stop(Exception):
    """The sweep met text it cannot follow; text_format then reports it properly."""


def _sweep(tok, desc, node, unknown, top, depth):
    while not tok.AtEnd():
        if depth and tok.token in ("}", ">"):
            return
        line, col, name = tok._line + 1, tok._column + 1, tok.token
        if not name[:1].isalpha() and name[:1] != "_":
            raise _Stop
        tok.NextToken()
        field = desc.fields_by_name.get(name) if desc is not None else None
        if desc is not None and field is None:
            unknown.append((line, col, name, desc, top))
        sub, raw = None, None
        colon = tok.TryConsume(":")
        if tok.token in ("{", "<"):
            close = "}" if tok.token == "{" else ">"
            tok.NextToken()
            sub = Pos(line, col)
            inner = field.message_type if field is not None else None
            _sweep(tok, inner, sub, unknown, sub if depth == 0 else top, depth + 1)
            if not tok.TryConsume(close):
                raise _Stop
        elif not colon:
            raise _Stop
        elif tok.token == "[":
            while not tok.AtEnd() and tok.token != "]":
                if tok.token in ("{", "<"):
                    raise _Stop  # a list of messages: rare in Caffe's files; positions stop here
                tok.NextToken()
            tok.Consume("]")
        else:
            raw = tok.token
            tok.NextToken()
            while raw[:1] in "'\"" and tok.token[:1] in ("'", '"'):  # "a" "b" is one string
                tok.NextToken()
        node.fields.setdefault(name, []).append((line, col, sub, raw))
        if not tok.TryConsume(";"):
            tok.TryConsume(",")


def _layer_of(root, line, col):
    """``(name, type)`` of the top-level ``layer``/``layers`` block written at or before
    ``line:col`` (None, None outside any)."""
    best = None
    for key in ("layer", "layers"):
        for ln, cl, sub, _ in root.fields.get(key, ()):
            if (ln, cl) <= (line, col) and (best is None or (ln, cl) > best.mark) and sub is not None:
                best = sub
    if best is None:
        return None, None
    return best.scalar("name"), best.scalar("type")


def parse(text, message, file, what="layer"):
    """Parse ``text`` into ``message`` (a fresh protobuf message); return its :class:`Pos` tree.

    Every field the schema lacks is reported at once; then any problem text_format finds;
    each as ``file:line:col: layer 'name' (Type): ...``."""
    root, unknown = Pos(1, 1), []
    tok = text_format.Tokenizer(text.split("\n"))
    try:
        _sweep(tok, message.DESCRIPTOR, root, unknown, None, 0)
    except (_Stop, text_format.ParseError):
        pass  # text_format below says what is wrong there
    if unknown:
        problems = []
        for line, col, name, desc, top in unknown:
            known = [f.name for f in desc.fields]
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            layer, ltype = (top.scalar("name"), top.scalar("type")) if top is not None else (None, None)
            inside = f" in {_field_name(desc)}" if desc is not message.DESCRIPTOR else ""
            problems.append(where(file, line, col, layer if top is not None else None, ltype)
                            + f"unknown field '{name}'{inside}{hint}")
        raise SpecError(problems)
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        line, col = e.GetLine(), e.GetColumn()
        message_text = str(e)
        if line is not None and message_text.startswith(f"{line}:"):
            message_text = message_text.split(" : ", 1)[-1]
            if message_text.startswith("'") and "': " in message_text:  # it quotes the whole line
                message_text = message_text.split("': ", 1)[1]
        layer, ltype = _layer_of(root, line or 0, col or 0)
        raise SpecError(where(file, line, col, layer, ltype) + message_text) from None
    return root


def _field_name(desc):
    """A message type's usual field name: ConvolutionParameter → convolution_param."""
    name = desc.name
    special = {"LRNParameter": "lrn_param", "ELUParameter": "elu_param", "PReLUParameter": "prelu_param",
               "ReLUParameter": "relu_param", "TanHParameter": "tanh_param",
               "ArgMaxParameter": "argmax_param", "NetStateRule": "include/exclude",
               "ParamSpec": "param", "TransformationParameter": "transform_param",
               "V1LayerParameter": "layers", "LayerParameter": "layer"}
    if name in special:
        return special[name]
    if name.endswith("Parameter"):
        base = name[:-len("Parameter")]
        return "".join("_" + c.lower() if c.isupper() and i else c.lower()
                       for i, c in enumerate(base)) + "_param"
    return name
