"""Reading and writing the files users name, within :mod:`superneuron.limits`, with one-line errors.

A path given on the command line may be anything: a folder, a FIFO that nobody writes (reading
it would wait for ever), ``/dev/zero`` (endless), ``/dev/full`` (every write fails), a huge or
binary file. These functions look at the path first and refuse what is not a regular file,
read at most a given number of bytes, and report a write that did not reach the file, so that
every such case is an :class:`SNError` naming the path and what is wrong, never a hang or a
traceback. A second reader of network files (a Caffe prototxt importer) calls
:func:`read_text_capped` as the YAML reader does.
"""

import errno
import os
import stat

from .errors import SNError
from .limits import over

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _kind(mode):
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _position(data, index):
    """1-based ``(line, column)`` of byte ``index`` of ``data``."""
    line = data.count(b"\n", 0, index) + 1
    return line, index - (data.rfind(b"\n", 0, index) + 1) + 1


def read_text_capped(path, limit, what="file", limit_name="MAX_NET_FILE_BYTES", error=SNError):
    """The text (UTF-8) of the regular file at ``path``, of at most ``limit`` bytes.

    ``error`` (an SNError class: SpecError for network files), one line naming the path (and line
    and column for bad bytes), when the path is missing or unreadable, a folder, a FIFO, a device
    or a socket, larger than ``limit`` (named ``limit_name`` in the message), or holds a NUL byte
    or bytes that are not UTF-8."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{p}: is a folder; the {what} must be a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{p}: is {_kind(st.st_mode)}; the {what} must be a regular file")
    if st.st_size > limit:
        raise error(f"{p}: " + over(f"the {what} of", st.st_size, limit, limit_name, " bytes"))
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    if len(data) > limit:  # it grew since the stat
        raise error(f"{p}: " + over(f"the {what} of more than", limit, limit, limit_name, " bytes"))
    nul = data.find(b"\0")
    if nul >= 0:
        line, col = _position(data, nul)
        raise error(f"{p}:{line}:{col}: a NUL byte; the {what} must be text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, col = _position(data, e.start)
        raise error(f"{p}:{line}:{col}: byte 0x{data[e.start]:02x} is not UTF-8; the {what} must be "
                      f"UTF-8 text") from None


def check_output_path(path, what="output file"):
    """SNError now, before any work, if ``path`` cannot be an output file: a folder, or in a
    folder that does not exist."""
    p = os.fspath(path)
    if os.path.isdir(p):
        raise SNError(f"{p}: is a folder; the {what} must be a file")
    parent = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(parent):
        raise SNError(f"{p}: cannot write the {what}: no folder {parent}")


def _open_fd(path, flags, what):
    """A blocking file descriptor for writing ``path``, opened without waiting on a FIFO that
    nothing reads (that is an error)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, flags | os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o666)
    except OSError as e:
        why = "a FIFO that nothing reads" if e.errno == errno.ENXIO else (e.strerror or str(e))
        raise SNError(f"{p}: cannot write the {what}: {why}") from None
    try:
        import fcntl
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except (ImportError, OSError):  # no fcntl (Windows): O_NONBLOCK means nothing there either
        pass
    return fd


def write_bytes(path, data, what="output file"):
    """Write ``data`` to ``path`` (created or emptied) and make sure it got there: flushed, and
    fsync'ed when it is a regular file. SNError naming the path on any failure: a folder, a
    missing folder, a full disk, ``/dev/full``, a FIFO that nothing reads."""
    p = os.fspath(path)
    fd = _open_fd(p, os.O_TRUNC, what)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                os.fsync(f.fileno())
    except OSError as e:
        raise SNError(f"{p}: cannot write the {what}: {e.strerror or e}") from None


class LineFile:
    """A text file that lines are appended to (a JSONL log), opened at once: a folder, a missing
    folder or a FIFO that nothing reads is an SNError naming ``path``, and so is a line that
    cannot be written (a full disk, ``/dev/full``)."""

    def __init__(self, path, what="log"):
        self.path, self.what = os.fspath(path), what
        if os.path.isdir(self.path):
            raise SNError(f"{self.path}: is a folder; the {what} must be a file")
        self.file = os.fdopen(_open_fd(self.path, os.O_APPEND, what), "a", encoding="utf-8")

    def write_line(self, line):
        """Append ``line`` and a newline, flushed."""
        try:
            self.file.write(line + "\n")
            self.file.flush()
        except OSError as e:
            raise SNError(f"{self.path}: cannot write the {self.what}: {e.strerror or e}") from None

    def close(self):
        try:
            self.file.close()
        except OSError:  # every line was flushed (and reported) already
            pass
