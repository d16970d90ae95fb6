"""The ``{config_dir}`` prefix, and that no emptied folder may hold the config or run state (docs/operations.md)."""

from __future__ import annotations

import glob
import os

from mortal.config_keys import table_name

CONFIG_DIR = '{config_dir}'
NOT_EXPANDED = (('online', 'remote', 'token'),)  # a secret: a value that merely starts with {config_dir} stays so


def config_folder(path: str | os.PathLike) -> str:
    """The absolute folder of the config file ``path`` as given (a symbolic link to the file is not followed)."""
    return os.path.dirname(os.path.abspath(os.fspath(path)))


def expands(value: str) -> bool:
    """Whether the string ``value`` starts with ``{config_dir}`` followed by its end or a path separator."""
    after = value[len(CONFIG_DIR):len(CONFIG_DIR) + 1]  # '' at the end
    return value.startswith(CONFIG_DIR) and after in ('', os.sep, os.altsep or os.sep, '/')


def expand(value: str, folder: str) -> str:
    """``value`` with a leading ``{config_dir}`` (see :func:`expands`) replaced by ``folder``; else unchanged."""
    return folder + value[len(CONFIG_DIR):] if expands(value) else value


def _strings(node, where: tuple = ()):
    """``(table or array, key, path of keys)`` of every string inside ``node`` but the token (``NOT_EXPANDED``)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        if isinstance(v, str) and where + (k,) not in NOT_EXPANDED:
            yield node, k, where + (k,)
        elif isinstance(v, (dict, list)):
            yield from _strings(v, where + (k,))


def expand_config_dir(node, folder: str):
    """In place, a leading ``{config_dir}`` of every string in ``node`` becomes ``folder`` (not the token)."""
    for parent, k, _ in list(_strings(node)):
        parent[k] = expand(parent[k], folder)
    return node


def config_dir_errors(config: dict, path: str) -> list[str]:
    """One message per string where ``{config_dir}`` is not followed by its end or a separator, or that holds a NUL
    (no path or name has one: the OS refuses it with a ValueError)."""
    out = []
    for parent, k, where in _strings(config):
        v = parent[k]
        table = '.'.join(str(p) for p in where[:-1] if not isinstance(p, int))
        name = k if not isinstance(k, int) else str(where[-2])
        if '\0' in v:
            out.append(f'[{table}] {name} in {path} holds a NUL character (\\u0000), got {v[:200]!r}')
        elif v.startswith(CONFIG_DIR) and not expands(v):
            out.append(f'[{table}] {name} in {path}: {CONFIG_DIR} must be the whole value or be followed by '
                       f'a path separator, got {v[:200]!r}')
    return out


def _real(value: str, folder: str) -> str:
    # a NUL (reported by config_dir_errors) would make realpath raise ValueError
    return os.path.realpath(expand(value.replace('\0', ''), folder))


def _inside(child: str, parent: str) -> bool:
    """Whether the real path ``child`` is ``parent`` or lies under it."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _glob_root(pattern: str) -> str:
    """``data/**/*.gz`` -> ``data``."""
    parts = pattern.split(os.sep)
    fixed = []
    for part in parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    if len(fixed) == len(parts):
        fixed = fixed[:-1]  # no wildcard: the file's folder holds it
    return os.sep.join(fixed) or ('/' if pattern.startswith(os.sep) else '.')


def emptied_folders(cfg) -> list[tuple[str, str]]:
    """``(key, path as written)`` of every folder the processes of the typed ``cfg`` empty."""
    out = []
    server = cfg.online and cfg.online.server
    if server is not None:
        out += [('[online.server] buffer_dir', server.buffer_dir), ('[online.server] drain_dir', server.drain_dir),
                ('[online.server] drain_dir (its .trainer claim folder)', os.path.normpath(server.drain_dir)
                 + '.trainer')]
    for profile, table in sorted((cfg.train_play or {}).items()):
        out.append((f'[{table_name(("train_play", profile))}] log_dir', table.log_dir))
    if cfg.test_play is not None:
        out += [('[test_play] log_dir', cfg.test_play.log_dir),
                ('[test_play] log_dir (its _best folder)', os.path.normpath(cfg.test_play.log_dir) + '_best')]
    return out


def kept_paths(cfg, config_path: str) -> list[tuple[str, str]]:
    """``(key, path as written)`` of what no emptied folder may hold: config, checkpoints, file index, globs' roots."""
    out = [('the config file', os.fspath(config_path))]
    if cfg.control is not None:
        out += [('[control] state_file', cfg.control.state_file),
                ('[control] best_state_file', cfg.control.best_state_file),
                ('[control] tensorboard_dir', cfg.control.tensorboard_dir)]
    baseline = cfg.baseline
    for name in ('train', 'test'):
        slot = baseline and getattr(baseline, name)
        if slot is not None:
            out.append((f'[baseline.{name}] state_file', slot.state_file))
    if cfg.grp is not None:
        out.append(('[grp] state_file', cfg.grp.state_file))
    if cfg.dataset is not None:
        out.append(('[dataset] file_index', cfg.dataset.file_index))
        out += [(f'[dataset] globs {g!r}', _glob_root(g)) for g in cfg.dataset.globs]
    return [(k, v) for k, v in out if v]


def folder_errors(cfg, config_path: str) -> list[str]:
    """One message per emptied folder of ``cfg`` that is, holds or lies in another, or holds a kept path."""
    folder = config_folder(config_path)
    where = f' in {config_path}'
    emptied = [(k, v, _real(v, folder)) for k, v in emptied_folders(cfg) if v]
    # '' is the working folder (os.path.abspath), which the process would empty
    errors = [f"{key} = ''{where} names no folder: the working folder would be emptied" for key, value in
              emptied_folders(cfg) if not value]
    for i, (key, value, real) in enumerate(emptied):
        if os.path.lexists(real) and not os.path.isdir(real):
            errors.append(f'{key} = {value!r}{where} is a file, not a folder: it would be emptied by its process; '
                          f'name a folder (a missing one is created)')
        for key2, value2, real2 in emptied[i + 1:]:
            if (key.split(' (')[0] == key2.split(' (')[0]) or not (_inside(real2, real) or _inside(real, real2)):
                continue  # a folder and its own derived folder are side by side, never inside each other
            if real == real2 and key.startswith('[train_play.') and key2.startswith('[train_play.'):
                continue  # profiles played one at a time may share a folder (a client locks its log_dir)
            errors.append(f'{key} = {value!r}{where} and {key2} = {value2!r} are or contain the same folder '
                          f'({real}): each is emptied by its process, so one would delete the other\'s files')
        for key2, value2 in kept_paths(cfg, config_path):
            real2 = _real(value2, folder)
            if _inside(real2, real):
                errors.append(f'{key} = {value!r}{where} is emptied by its process but holds {key2} ({real2}): '
                              f'choose a folder of its own')
    return errors


def learner_input_errors(cfg, config_path: str) -> list[str]:
    """One message per file the learner of the typed ``cfg`` must read at its start that is not a file:
    ``[baseline.test] state_file`` (the test play's opponent), ``[grp] state_file`` when ``[env] reward = 'grp'``,
    ``[baseline.train] state_file`` online with ``[online] anchor_weight > 0``. ``[control] state_file`` may be
    absent (a fresh start, as Mortal)."""
    needed = []
    test = cfg.baseline and cfg.baseline.test
    if test is not None:
        needed.append(('[baseline.test] state_file', test.state_file, 'test play plays against it'))
    if cfg.env is not None and cfg.env.reward == 'grp' and cfg.grp is not None:
        needed.append(('[grp] state_file', cfg.grp.state_file, "[env] reward = 'grp' needs it"))
    train = cfg.baseline and cfg.baseline.train
    if cfg.control.online and cfg.online is not None and cfg.online.anchor_weight > 0 and train is not None:
        needed.append(('[baseline.train] state_file', train.state_file, '[online] anchor_weight > 0 needs it'))
    return [f'{key} = {value!r} in {config_path}: no such file'
            f'{"" if os.path.isabs(value) else f" ({os.path.abspath(value)})"}; the learner reads it at its start '
            f'({why})' for key, value, why in needed if not os.path.isfile(value)]
