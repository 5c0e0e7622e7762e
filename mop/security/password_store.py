"""Password files on disk: read one as text, replace one atomically (`mop passwd`).

The format itself is `mop.security.passwords`; this module only moves its text to and from
files. Bytes that are not UTF-8 survive a round trip (surrogate escapes), so editing one user
never changes another user's line.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

ENCODING = "utf-8"
ERRORS = "surrogateescape"
# A password file holds hashes that can be attacked offline: only its owner reads a new one.
NEW_FILE_MODE = 0o600


def read_password_file(path: str | os.PathLike[str]) -> str:
    """The text of the file at `path` (FileNotFoundError and other OSErrors pass through)."""
    return Path(path).read_bytes().decode(ENCODING, ERRORS)


def write_password_file(path: str | os.PathLike[str], text: str) -> None:
    """Replace the file at `path` with `text`, atomically: readers see the old file or the new
    one, never a part. A new file gets mode 0600; a replaced one keeps its mode. A symbolic
    link is followed, so the file it points to is replaced and the link stays."""
    target = Path(os.path.realpath(path))
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            # mkstemp made the file 0600 already; an existing file's mode is kept.
            os.fchmod(file.fileno(), NEW_FILE_MODE if mode is None else mode)
            file.write(text.encode(ENCODING, ERRORS))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable: the directory entry is the directory's data."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
