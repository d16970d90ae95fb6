"""The learner's offline data (``[dataset]``): the cached file index, the players, the offline mix."""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
from glob import glob
from itertools import chain
from os import path

from mortal.model.checkpoint import atomic_torch_save, describe_error, load_checkpoint

logger = logging.getLogger('mortal.train')  # the learner's lines (log format)


def build_file_list(dataset, player_names: set) -> list:
    """Offline file list of the typed ``[dataset]``: a valid ``file_index``, else the globs sorted descending (cached
    when non-empty); ValueError naming ``file_index`` when it is not an index."""
    file_index = dataset.file_index
    if path.exists(file_index):
        try:
            index = load_checkpoint(file_index)
            file_list = list(index['file_list'])
        except Exception as ex:  # garbage, another format, or no 'file_list' key
            raise ValueError(f'[dataset] file_index {file_index} is not a file index ({describe_error(ex)}); '
                             f'delete it to rebuild it from [dataset] globs') from None
        stale = stale_index(index, {'globs': dataset.globs})
        if stale is None:
            bad = listed_problem(index['file_list'], dataset.globs)
            if bad is None:
                logger.info('file index loaded from %s', file_index)
                return file_list
            # never read what a damaged or planted index lists (open(1) would be this process's stdout)
            logger.warning('[dataset] file_index %s is rebuilt from [dataset] globs: %s', file_index, bad)
        else:
            logger.info('[dataset] file_index %s is rebuilt: %s', file_index, stale)
    logger.info('building file index...')
    file_list = []
    for pattern in dataset.globs:
        file_list.extend(glob(pattern, recursive=True))
    if player_names:
        kept = []
        for filename in file_list:
            try:
                if not os.path.isfile(filename):  # a FIFO would block the open forever
                    raise OSError('not a regular file')
                opener = gzip.open if filename.endswith('.gz') else open
                with opener(filename, 'rt', encoding='utf-8') as f:
                    names = json.loads(next(f))['names']
                wanted = not player_names.isdisjoint(names)  # TypeError: names null, a number, lists
            except (OSError, EOFError, StopIteration, ValueError, KeyError, TypeError) as ex:
                logger.warning('skipping %s while indexing: %s: %s', filename, type(ex).__name__, ex)
                continue
            if wanted:
                kept.append(filename)
        file_list = kept
    file_list.sort(reverse=True)
    if file_list:
        atomic_torch_save({'file_list': file_list, 'globs': list(dataset.globs)}, file_index)
    return file_list


def stale_index(index: dict, globs: dict) -> str | None:
    """Why the loaded file index was not built from ``globs`` (a phrase), None when it was."""
    for key, want in globs.items():
        have = index.get(key) if isinstance(index, dict) else None
        if not isinstance(have, (list, tuple)):
            return f'it has no record of the {key} it was built from'
        if list(have) != list(want):
            return f'it was built from {key} {list(have)}, the config has {list(want)}'
    return None


def glob_regex(pattern: str) -> re.Pattern:
    """A regex of the paths ``glob(pattern, recursive=True)`` can give (``*`` also matches a leading dot)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith('**/', i):
            out.append('(?:[^/]*/)*')
            i += 3
        elif pattern.startswith('**', i):
            out.append('.*')
            i += 2
        elif pattern[i] == '*':
            out.append('[^/]*')
            i += 1
        elif pattern[i] == '?':
            out.append('[^/]')
            i += 1
        elif pattern[i] == '[' and pattern.find(']', i + 2) != -1:
            j = pattern.find(']', i + 2)
            body = pattern[i + 1:j]
            body = '^' + body[1:] if body.startswith('!') else body
            out.append('[' + body.replace('\\', '\\\\') + ']')
            i = j + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile(''.join(out) + r'\Z')


def listed_problem(file_list, patterns, *, shown: int = 3) -> str | None:
    """Why a loaded index's ``file_list`` must not be read (a phrase), None when it may."""
    def some(items):
        return ', '.join(repr(x)[:200] for x in items[:shown]) + (', ...' if len(items) > shown else '')

    if not isinstance(file_list, (list, tuple)):
        return f'its file_list is a {type(file_list).__name__}, not a list of paths'
    not_str = [f for f in file_list if not isinstance(f, str)]
    if not_str:
        return f'{len(not_str)} of its {len(file_list)} entries are not paths ({some(not_str)})'
    regexes = [glob_regex(p) for p in patterns]
    outside = [f for f in file_list if not any(r.match(f) for r in regexes)]
    if outside:
        return f'{len(outside)} of its {len(file_list)} files are outside the globs ({some(outside)})'
    missing = [f for f in file_list if not path.isfile(f)]
    if missing:
        return f'{len(missing)} of its {len(file_list)} files are missing ({some(missing)})'
    return None


def index_problems(index: dict, lists: dict, *, shown: int = 3) -> list[str]:
    """Phrases on the files of ``index`` missing or outside their globs; ``[]`` when none."""
    out = []
    for key, patterns in lists.items():
        files = [str(f) for f in index.get(key, [])] if isinstance(index, dict) else []
        matched = set(chain.from_iterable(glob(p, recursive=True) for p in patterns))
        missing = [f for f in files if not path.exists(f)]
        outside = [f for f in files if f not in matched and path.exists(f)]
        for what, bad in (('missing', missing), ('outside the globs', outside)):
            if bad:
                more = ', ...' if len(bad) > shown else ''
                out.append(f'{len(bad)} of its {len(files)} {key} files are {what} ({", ".join(bad[:shown])}{more})')
    return out


def load_player_names(files) -> set:
    """Union of the names in ``[dataset] player_names_files``; ValueError naming key and file."""
    names = set()
    for filename in files:
        try:
            with open(filename, encoding='utf-8') as f:
                names.update(line for line in (raw.strip() for raw in f) if line)
        except (OSError, UnicodeDecodeError) as ex:
            raise ValueError(f'[dataset] player_names_files: cannot read {filename}: {ex}') from None
    return names


def offline_mix(dataset, batch_size: int, loader):
    """Endless full batches (``Trainer.train_batch``'s eight tensors, obs packed) from the offline logs,
    reshuffled each pass; ValueError (naming ``[online] offline_batch_size``) when a pass has no full batch."""
    stream = _offline_batches(dataset, batch_size, loader)
    first = next(stream)
    return chain([first], stream)


def _offline_batches(ds, batch_size: int, loader):
    from mortal.data.dataloader import iter_full_batches  # here: the file index needs no loader
    names = load_player_names(ds.player_names_files)
    files = build_file_list(ds, names)
    logger.info('offline mix: %d samples per batch from %s offline logs', batch_size, f'{len(files):,}')
    passes = 0
    while True:
        random.shuffle(files)
        count = 0
        for batch in iter_full_batches(iter(loader(list(files), sorted(names), batch_size)), batch_size):
            count += 1
            yield batch
        if count == 0:
            source = (f"[dataset] file_index {ds.file_index} ({len(files)} files)"
                      if path.exists(ds.file_index) else f"[dataset] globs {ds.globs}")
            raise ValueError(f'[online] offline_batch_size = {batch_size}: the logs of {source} '
                             f'hold no full batch (readable logs and their samples are listed above)')
        passes += 1
        logger.info('offline mix: pass %d over the offline logs done (%d batches)', passes, count)
