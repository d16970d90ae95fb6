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
