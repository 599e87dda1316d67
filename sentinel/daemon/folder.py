"""The engine's private socket folder, made and checked without following a symlink.

The default folder under ``/tmp`` has a predictable name, so another user of the machine
can plant something there first: a symlink to a folder of theirs or of ours, a folder of
their own, a file. Every step here works on the entry itself (``lstat``, ``O_NOFOLLOW``
on an ``O_DIRECTORY`` descriptor, ``fchmod`` through it), so nothing planted is followed,
chmodded or emptied; anything that is not our own real folder is refused with one line.
"""

from __future__ import annotations

import os
import stat
import tempfile


class UnsafeFolder(PermissionError):
    """The socket folder (or a socket path in it) is not ours to use; ``str()`` is one line."""


def default_socket_path() -> str:
    """``$XDG_RUNTIME_DIR/sentinel/engine.sock`` when that folder is ours (systemd and
    logind make it, 0700, per user), else ``<tmp>/sentinel-<uid>/engine.sock``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.lstat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            return os.path.join(runtime, "sentinel", "engine.sock")
    return os.path.join(tempfile.gettempdir(), f"sentinel-{os.getuid()}", "engine.sock")


def private_folder(path: str) -> bool:
    """Make ``path`` a folder only we can enter (0700), or accept it if it already is ours.

    Its parents are created as needed (they are the caller's choice of path); the folder
    itself must be a real directory, not a symlink, owned by this uid. A folder of ours
    with looser permissions is tightened through its own descriptor.

    Returns:
        True if this call created the folder.

    Raises:
        UnsafeFolder: the entry is a symlink, not a folder, or another user's.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    created = True
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        created = False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # ELOOP: a symlink; ENOTDIR: a file
        st = _lstat(path)
        what = "a symlink" if st is not None and stat.S_ISLNK(st.st_mode) else "not a folder"
        owner = f" (planted by uid {st.st_uid})" if st is not None and st.st_uid != os.getuid() else ""
        raise UnsafeFolder(f"refusing the socket folder {path}: it is {what}{owner}; "
                           "remove it or choose another --socket path") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise UnsafeFolder(f"refusing the socket folder {path}: it belongs to uid {st.st_uid}, "
                               f"not to uid {os.getuid()}; remove it or choose another --socket path")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return created


def clear_stale_socket(path: str) -> None:
    """Remove a socket left at ``path`` by an engine that died; leave anything else alone.

    Raises:
        UnsafeFolder: something other than a socket is there.
    """
    st = _lstat(path)
    if st is None:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UnsafeFolder(f"refusing the socket path {path}: something other than a socket is there")
    os.unlink(path)


def remove_folder(path: str) -> None:
    """Remove the folder if it is empty (best effort: a socket of another process may remain)."""
    try:
        os.rmdir(path)
    except OSError:
        pass


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None
