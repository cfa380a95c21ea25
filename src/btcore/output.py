"""The files btcore writes when asked to (a profile, the HTML page): regular
files only.  A FIFO would wait for a reader, a directory or a device cannot
hold the document, and a descriptor number is not a path."""
from __future__ import annotations

import errno
import os
import stat


def open_output(path) -> int:
    """A descriptor open for writing on the regular file path (made if it is
    missing), else OSError: a FIFO would wait for a reader (O_NONBLOCK: ENXIO
    instead), a directory or a device cannot hold the document."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ENXIO:   # a FIFO no process reads
            raise OSError(errno.EINVAL, "not a regular file: a FIFO", os.fspath(path)) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "a special file"
        raise OSError(errno.EINVAL, f"not a regular file: {kind}", os.fspath(path))
    os.set_blocking(fd, True)
    return fd


def check_output(path) -> None:
    """OSError unless path can be written as open_output() will (checked
    before a profile's recording, not after it): a regular file, or one that
    can be made there (made and removed again)."""
    existed = os.path.lexists(path)
    os.close(open_output(path))
    if not existed:
        os.unlink(path)
