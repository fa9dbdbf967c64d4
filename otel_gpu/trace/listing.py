"""Which entries of a trace folder are trace files: the ``.json`` / ``.json.gz`` / ``.gz`` names
that are regular files (directly or through a link). Every other entry with such a name (a folder,
a named pipe, a device, a socket, a looping or dangling link) is skipped with a note saying why; a
named pipe is never opened (opening one blocks until something writes to it).
"""
from __future__ import annotations

import errno
import os
import stat

SUFFIXES = (".json", ".gz")


def _kind(mode: int) -> str | None:
    """Why an entry of this mode is not a trace file; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder, not a trace file"
    if stat.S_ISFIFO(mode):
        return "a named pipe (never opened: reading one waits for a writer)"
    if stat.S_ISSOCK(mode):
        return "a socket, not a trace file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a trace file"
    return "not a regular file"


def why_skipped(path: str) -> str | None:
    """Why ``path`` is not read as a trace file, None when it is one."""
    try:
        return _kind(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link that loops"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        return f"cannot be examined ({exc.strerror or exc})"


def list_traces(directory: str) -> tuple[list[str], list[str]]:
    """(trace files sorted by name, one note per skipped entry). Raises OSError when the folder
    itself cannot be listed."""
    files, notes = [], []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(SUFFIXES):
            continue
        path = os.path.join(directory, name)
        why = why_skipped(path)
        if why is None:
            files.append(path)
        else:
            notes.append(f"{path}: skipped, not analysed: {why}")
    return files, notes
