"""Output files written whole or not at all.

A command that fails while it writes (a full disk, a file-size limit, Ctrl-C) must not leave a
CSV that ends mid-row or a PNG cut short where the user's file was: a truncated file looks like
a result. :func:`whole_file` writes to a hidden file beside the target and renames it over the
target only when everything was written, so the target holds either the new contents or what
it held before.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    """The process's file-creation mask (read by setting it, then putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def whole_file(path: str | Path, mode: str = "w", **kw: Any) -> Iterator[IO[Any]]:
    """``open(path, mode, **kw)``, except that the target changes only when the block ends
    without an error. A regular file (or no file yet) is written to a hidden ``.NAME.*.part``
    file in the target's folder, given the target's permissions (a new file: the usual ones
    under the umask) and renamed over it; a link is followed, so the link stays a link and its
    file gets the contents. A named pipe or a device (``/dev/stdout``) cannot be replaced and is
    written in place."""
    target = Path(os.path.realpath(path))
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, mode, **kw) as f:
            yield f
        return
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, mode, **kw) as f:
            yield f
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
