"""File-system helpers shared by the modules that write files atomically (temp name, fsync, rename)."""

import os


def fsync_dir(dirname: str) -> None:
    """fsync the directory ``dirname`` so that a rename inside it survives a crash; errors are ignored (some file
    systems cannot open or sync a directory, and the rename itself has already happened)."""
    try:
        fd = os.open(dirname, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def stamped_name(filename: str, stamp: str, suffix: str) -> str:
    """``<filename>.<stamp><suffix>`` (e.g. ``baseline.pth.20261201-153000.bak``) that does not exist yet:
    ``-2``, ``-3``, ... is added to the stamp when two are made within one second."""
    name, k = f'{filename}.{stamp}{suffix}', 1
    while os.path.exists(name):
        k += 1
        name = f'{filename}.{stamp}-{k}{suffix}'
    return name
