"""YAML read with positions: plain values whose mappings and lists (:class:`Map`, :class:`Seq`)
remember the line and column of every key and item, so that a problem found later (after a
network file's ``${expr}`` are expanded: superneuron.netfile.expr) can still point into the file; and
the count of what a file's aliases expand to, bounded (MAX_YAML_NODES); and tags: a tag YAML's
safe schema does not define (``!!python/object/apply:...``, ``!mytag``) is an error at its
position, never dropped (a list or a mapping would otherwise keep its items and lose the tag).
"""

import yaml

from ..errors import SpecError, where
from ..limits import MAX_YAML_NODES, over


class Map(dict):
    """A YAML mapping that remembers where it, each key and each value were written."""

    mark = (0, 0)

    def __init__(self, *args):
        super().__init__(*args)
        self.keymarks, self.valmarks = {}, {}

    def copy(self):
        out = Map(self)
        out.mark, out.keymarks, out.valmarks = self.mark, self.keymarks, self.valmarks
        return out

    def key_at(self, key):
        return self.keymarks.get(key, self.mark)

    def value_at(self, key):
        return self.valmarks.get(key, self.mark)


class Seq(list):
    """A YAML sequence that remembers where it and each item were written."""

    mark = (0, 0)

    def __init__(self, *args):
        super().__init__(*args)
        self.marks = []

    def copy(self):
        out = Seq(self)
        out.mark, out.marks = self.mark, self.marks
        return out

    def at(self, i):
        return self.marks[i] if i < len(self.marks) else self.mark


def _mark(node):
    return node.start_mark.line + 1, node.start_mark.column + 1


def parse_yaml(text, file="<net>"):
    """Plain Python values (Map/Seq carrying positions) from YAML ``text``; SpecError if invalid,
    or if its aliases expand it past MAX_YAML_NODES."""
    try:
        loader = yaml.SafeLoader(text)  # it checks the characters at once
    except yaml.reader.ReaderError as e:
        raise SpecError(_reader_error(text, e, file)) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        count_nodes(node, file)
        check_tags(node, file)
        return _plain(loader, node, file)
    except yaml.reader.ReaderError as e:
        raise SpecError(_reader_error(text, e, file)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        what = " ".join(p for p in (e.context, e.problem) if p)
        raise SpecError(where(file, line, col) + f"invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise SpecError(where(file) + f"invalid YAML: {_first_line(e)}") from None
    except ValueError as e:  # a scalar YAML reads but Python refuses (an integer of 5000 digits)
        raise SpecError(where(file) + f"invalid YAML: {_first_line(e)}") from None
    except RecursionError:  # an anchor that contains itself
        raise SpecError(where(file) + "invalid YAML: nested too deeply (a recursive anchor?)") from None
    finally:
        loader.dispose()


def _first_line(e):
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _reader_error(text, e, file):
    """``file:line:col: invalid YAML: ...`` for a character YAML does not allow (a control character)."""
    if isinstance(e.character, int):
        pos = e.position
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        return where(file, line, col) + f"invalid YAML: character #x{e.character:04x} is not allowed ({e.reason})"
    return where(file) + f"invalid YAML: {e.reason}"


def _children(node):
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return ()


def count_nodes(root, file="<yaml>"):
    """How many nodes the YAML ``root`` stands for once its aliases are expanded (each node is
    visited once, so this takes the time of the file, not of the expansion); SpecError past
    MAX_YAML_NODES (an "alias bomb") or for an alias inside its own anchor."""
    sizes, open_, todo = {}, set(), [(root, False)]
    while todo:
        node, done = todo.pop()
        key = id(node)
        if done:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes[id(k)] for k in _children(node))
            if sizes[key] > MAX_YAML_NODES:
                line, col = _mark(node)
                raise SpecError(where(file, line, col) + "invalid YAML: " + over(
                    "a value whose aliases expand it to", sizes[key], MAX_YAML_NODES, "MAX_YAML_NODES",
                    " nodes"))
        elif key not in sizes:
            if key in open_:
                raise SpecError(where(file, *_mark(node)) + "invalid YAML: an alias inside its own anchor")
            open_.add(key)
            todo.append((node, True))
            todo.extend((k, False) for k in _children(node) if id(k) not in sizes)
    return sizes[id(root)]


YAML_TAG = "tag:yaml.org,2002:"
# the tags a plain mapping or list may carry; a scalar's are those of YAML's safe schema
COLLECTION_TAGS = {yaml.SequenceNode: YAML_TAG + "seq", yaml.MappingNode: YAML_TAG + "map"}
SCALAR_TAGS = frozenset(t for t in yaml.SafeLoader.yaml_constructors
                        if t is not None and t not in (YAML_TAG + "seq", YAML_TAG + "map", YAML_TAG + "omap",
                                                       YAML_TAG + "pairs", YAML_TAG + "set"))


def _tag_name(tag):
    return "!!" + tag[len(YAML_TAG):] if tag.startswith(YAML_TAG) else tag


def check_tags(root, file="<yaml>"):
    """SpecError at the first node (in the file's order) whose tag YAML's safe schema does not
    define for a plain value (``!!python/...``, a local ``!tag``), or which makes a mapping or
    list something else (``!!set``, ``!!omap``): a tag is never silently dropped."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        allowed = COLLECTION_TAGS.get(type(node))
        if node.tag != allowed and (allowed is not None or node.tag not in SCALAR_TAGS):
            raise SpecError(where(file, *_mark(node)) + f"invalid YAML: tag '{_tag_name(node.tag)}' is not "
                            f"allowed (only plain values, lists and mappings, as YAML's safe schema reads "
                            f"them: no !!python/... or custom !tags)")
        todo.extend(reversed(_children(node)))


def _plain(loader, node, file):
    if isinstance(node, yaml.SequenceNode):
        out = Seq(_plain(loader, n, file) for n in node.value)
        out.mark, out.marks = _mark(node), [_mark(n) for n in node.value]
        return out
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # YAML merge keys (<<: *anchor)
        out = Map()
        out.mark = _mark(node)
        for knode, vnode in node.value:
            key = _plain(loader, knode, file)
            if isinstance(key, (list, dict)):
                raise SpecError(where(file, *_mark(knode)) + "a key must be a plain name")
            if key in out:
                raise SpecError(where(file, *_mark(knode)) + f"duplicate key '{key}'")
            out[key] = _plain(loader, vnode, file)
            out.keymarks[key], out.valmarks[key] = _mark(knode), _mark(vnode)
        return out
    return loader.construct_object(node)
