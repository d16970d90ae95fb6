"""File-system helpers: atomic writes, emptying a folder, stamped backup names. No torch here."""

import contextlib
import os
import shutil

TMP_SUFFIX = '.tmp'  # atomic_write's temporary name: ``<filename>.tmp`` in the same folder (same file system)


def fsync_dir(dirname: str) -> None:
    """fsync ``dirname`` so a rename in it survives a crash; errors ignored (not every FS can)."""
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


@contextlib.contextmanager
def atomic_write(filename, *, fsync: bool = True):
    """Context manager yielding a binary file at ``<filename>.tmp``, flushed, fsynced (unless ``fsync=False``)
    and renamed over ``filename`` (folder fsynced), or removed when the block raises. Not for concurrent writers."""
    filename = os.path.abspath(os.fspath(filename))
    dirname = os.path.dirname(filename)
    os.makedirs(dirname, exist_ok=True)
    tmp = filename + TMP_SUFFIX
    try:
        with open(tmp, 'wb') as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, filename)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if fsync:
        fsync_dir(dirname)


def atomic_write_bytes(data: bytes, filename, *, fsync: bool = True) -> None:
    """Write ``data`` to ``filename`` atomically (``atomic_write``). Raises OSError."""
    with atomic_write(filename, fsync=fsync) as f:
        f.write(data)


def atomic_copy(src, dst, *, keep_times: bool = False) -> None:
    """Copy ``src`` to ``dst`` atomically (``keep_times``: mode and times too); OSError leaves ``dst`` as it was."""
    with open(src, 'rb') as source, atomic_write(dst) as f:
        shutil.copyfileobj(source, f, 1 << 20)
        if keep_times:
            f.flush()  # nothing may be written after the times are set
            shutil.copystat(src, f.name)


#: A config or checkpoint in a folder to empty means it is the run's own: emptying is refused.
FOREIGN_SUFFIXES = ('.toml', '.pth')


def foreign_files(directory, keep=()) -> list[str]:
    """Paths under ``directory`` (not ``keep`` at its top, links not followed) ending in ``FOREIGN_SUFFIXES``."""
    found = []
    for root, dirs, files in os.walk(directory):
        if root == directory:
            dirs[:] = [d for d in dirs if d not in keep]
            files = [f for f in files if f not in keep]
        found += [os.path.join(root, f) for f in files + dirs if f.endswith(FOREIGN_SUFFIXES)]
    return sorted(found)


def empty_dir(directory, keep=()) -> None:
    """Make ``directory`` an empty folder but for ``keep`` (created when missing, replacing a link). Raises OSError,
    also (nothing removed) when it is a file or holds a ``.toml`` or ``.pth`` file."""
    directory = os.fspath(directory)
    if os.path.isdir(directory) and not os.path.islink(directory):
        foreign = foreign_files(directory, keep)
        if foreign:
            raise OSError(
                f'refusing to empty {directory}: it holds {len(foreign)} config or checkpoint file(s) '
                f'({", ".join(foreign[:3])[:300]}); point the folder key at a folder of its own')
        for name in os.listdir(directory):
            if name in keep:
                continue
            entry = os.path.join(directory, name)
            if os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry)
            else:
                os.remove(entry)
        return
    if os.path.islink(directory):
        os.remove(directory)  # the link, not what it points to
    elif os.path.lexists(directory):
        raise OSError(f'refusing to empty {directory}: it is a file, not a folder; point the folder key at a folder')
    os.makedirs(directory)


def stamped_name(filename: str, stamp: str, suffix: str) -> str:
    """A new ``<filename>.<stamp><suffix>`` (``-2``, ``-3``, ... added within one second)."""
    name, k = f'{filename}.{stamp}{suffix}', 1
    while os.path.exists(name):
        k += 1
        name = f'{filename}.{stamp}-{k}{suffix}'
    return name
