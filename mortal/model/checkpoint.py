"""Checkpoint files: loading, rebuilding the models, state-dict checks, atomic saves, ``CheckpointError``."""

from __future__ import annotations

import contextlib
import operator
import os
import pickle
import zipfile
from collections.abc import Mapping
from typing import NamedTuple

import torch

from mortal.net import wire
from mortal.util.fsutil import atomic_write

MORTAL_ENTRIES = ('mortal', 'current_dqn', 'config')  # what a player needs of a checkpoint (Mortal's layout)
INITIAL_BEST_PERF = {'avg_rank': 4.0, 'avg_pt': -135.0}  # a checkpoint's ``best_perf`` before any test play
# The learner's checkpoint entries, in Mortal's order (extras come after them).
CHECKPOINT_KEYS = ('mortal', 'current_dqn', 'aux_net', 'optimizer', 'scheduler', 'scaler', 'steps', 'timestamp',
                   'best_perf', 'config')


class CheckpointError(ValueError):
    """A torch file that cannot be used: ``'<source>: <reason>'`` or ``'cannot load <what> <source>: <reason>'``."""

    def __init__(self, source, reason: str, *, what: str | None = None):
        self.source = os.fspath(source)
        self.reason = reason
        self.what = what
        super().__init__(f'cannot load {what} {self.source}: {reason}' if what else f'{self.source}: {reason}')

    def __reduce__(self):  # picklable (from a worker process) although __init__ does not take the message
        return _rebuild_error, (self.source, self.reason, self.what)


def _rebuild_error(source, reason, what):
    return CheckpointError(source, reason, what=what)


def one_line(exc: BaseException) -> str:
    """``str(exc)`` on one line (torch's reports span many), or the exception's type name when it says nothing."""
    return ' '.join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__


def describe_error(exc: BaseException) -> str:
    """Why a file could not be used, on one line: a CheckpointError's ``reason``, else ``'<type>: <message>'``."""
    if isinstance(exc, CheckpointError):
        return exc.reason
    return f'{type(exc).__name__}: {one_line(exc)}'


# What a file that is no torch checkpoint at all usually is, by its first bytes (torch's own error misleads there).
_FOREIGN_HEADS = ((b'version https://git-lfs', "a Git LFS pointer, not the weights (run 'git lfs pull')"),
                  (b'\x1f\x8b', 'a gzip file (an mjai log?)'),
                  (b'<', 'an HTML or XML page (a failed download?)'))


def foreign_file(path) -> str | None:
    """``'not a torch checkpoint: <what it is>'`` when the first bytes of ``path`` are neither torch's zip format
    nor a pickle; None otherwise (or unreadable)."""
    try:
        with open(path, 'rb') as f:
            head = f.read(64)
    except OSError:
        return None
    if head.startswith((b'PK\x03\x04', b'\x80')):
        return None
    what = next((w for prefix, w in _FOREIGN_HEADS if head.lstrip().startswith(prefix)), None)
    if what is None and head[8:9] == b'{':  # an 8-byte header length, then its JSON
        what = 'a safetensors file'
    return f"not a torch checkpoint: {what or ('an empty file' if not head else f'it begins {head[:16]!r}')}"


def load_checkpoint(path, *, map_location='cpu'):
    """``torch.load(path, weights_only=True)``; FileNotFoundError, or ``CheckpointError`` (``__cause__``: torch's)
    for refused objects, a damaged file or one that is no torch checkpoint (``foreign_file``)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # torch raises many types for a damaged file (RuntimeError, EOFError, ValueError...)
        raise CheckpointError(path, foreign_file(path) or _cut_zip(path) or _torch_reason(exc)) from exc


def _cut_zip(path) -> str | None:
    """Why a file in torch's zip format cannot be read when its zip end record is missing (a copy cut short, a full
    disk); None otherwise."""
    try:
        with open(path, 'rb') as f:
            if f.read(4) != b'PK\x03\x04' or zipfile.is_zipfile(f):
                return None
            size = f.seek(0, os.SEEK_END)
    except OSError:
        return None
    return f'a truncated or damaged torch checkpoint ({size:,} bytes, its zip archive has no end record)'


def _torch_reason(exc: Exception) -> str:
    """Why torch refused a file that looks like a checkpoint, on one line."""
    if not isinstance(exc, pickle.UnpicklingError):
        return describe_error(exc)
    # torch's message is a paragraph about the weights_only default; keep its last specific line
    detail = [part.strip() for part in str(exc).splitlines() if part.strip()]
    detail = [d for d in detail if not d.startswith(('Weights only', 'Please file', 'Check the doc'))]
    return ('not a weights-only torch checkpoint (objects other than tensors and plain containers are refused)'
            + (f': {detail[-1]}' if detail else ''))


def require_entries(state, keys, source, *, kind: str = 'checkpoint'):
    """``state`` when it is a dict holding all ``keys``, else ``CheckpointError`` naming the missing ones."""
    missing = [k for k in keys if not isinstance(state, dict) or k not in state]
    if len(missing) == 1:
        raise CheckpointError(source, f'{kind} has no {missing[0]!r} entry')
    if missing:
        raise CheckpointError(source, f'{kind} lacks {missing}')
    return state


def arch_of(state: dict, source) -> dict:
    """``{'version', 'conv_channels', 'num_blocks'}`` of a checkpoint's ``config``; ``CheckpointError`` if missing."""
    try:
        cfg = state['config']
        return {'version': cfg['control'].get('version', 1), 'conv_channels': cfg['resnet']['conv_channels'],
                'num_blocks': cfg['resnet']['num_blocks']}
    except (KeyError, TypeError, AttributeError) as ex:
        raise CheckpointError(source, f'checkpoint config lacks {ex}') from None


def checked_arch(state: dict, source) -> dict:
    """``arch_of`` within the bounds a model can be built with (``wire.check_baseline_arch``); ``CheckpointError``
    naming the entry otherwise (a hand-edited or foreign config would fail inside torch)."""
    try:
        return wire.check_baseline_arch(arch_of(state, source))
    except wire.BadRequest as e:
        raise CheckpointError(source, f'checkpoint config: {e}') from None


def describe_arch(cfg) -> str:
    """``'version V, conv_channels C, num_blocks B'`` of a checkpoint's ``config`` (``arch_of``), for messages."""
    try:
        return 'version {version}, conv_channels {conv_channels}, num_blocks {num_blocks}'.format(
            **arch_of({'config': cfg}, ''))
    except CheckpointError:
        return 'unknown architecture (no config in the checkpoint)'


def models_from_state(state, source) -> tuple:
    """``(brain, dqn, version)`` in eval mode on the CPU, built from the checkpoint's own ``config`` (as Mortal's
    player); ``CheckpointError`` for a missing entry or key, or weights that do not fit."""
    from mortal.model.networks import Brain, DQN  # here: loading a file needs no model (nor its Rust extension)
    require_entries(state, MORTAL_ENTRIES, source)
    arch = checked_arch(state, source)
    brain = Brain(version=arch['version'], conv_channels=arch['conv_channels'], num_blocks=arch['num_blocks']).eval()
    dqn = DQN(version=arch['version']).eval()
    try:
        brain.load_state_dict(state['mortal'])
        dqn.load_state_dict(state['current_dqn'])
    except RuntimeError as ex:
        raise CheckpointError(source, f'weights do not match its own config ({describe_arch(state["config"])}): '
                                      f'{one_line(ex)}') from None
    return brain, dqn, arch['version']


def load_model_pair(state_file) -> tuple:
    """``models_from_state(load_checkpoint(state_file))``; FileNotFoundError, ``CheckpointError``."""
    return models_from_state(load_checkpoint(state_file), state_file)


def load_frozen_pair(state_file, version: int, device, role: str) -> tuple:
    """``(brain, dqn)`` of ``state_file`` without gradients; ``CheckpointError`` for another version."""
    brain, dqn, got = load_model_pair(state_file)
    if got != version:
        raise CheckpointError(state_file, f'{role} is version {got}, [control] version is {version}')
    return tuple(m.to(device).requires_grad_(False) for m in (brain, dqn))


def read_baseline(path) -> tuple:
    """``(mortal, dqn, arch)`` state dicts of a Mortal-layout checkpoint, no models built."""
    state = require_entries(load_checkpoint(path), MORTAL_ENTRIES, path)
    arch = checked_arch(state, path)
    try:
        mortal, dqn = dict(state['mortal']), dict(state['current_dqn'])
    except (TypeError, ValueError) as e:
        raise CheckpointError(path, f'not a usable baseline checkpoint: {type(e).__name__}: {e}') from None
    for entry, weights in (('mortal', mortal), ('current_dqn', dqn)):
        bad = next((k for k, v in weights.items() if not isinstance(v, torch.Tensor)), None)
        if bad is not None:  # a digest or a network needs tensors
            raise CheckpointError(path, f'not a usable baseline checkpoint: {entry}[{bad!r}] is a '
                                        f'{type(weights[bad]).__name__}, not a tensor')
    return mortal, dqn, arch


class Mismatch(NamedTuple):
    """A saved state dict's difference: ``kind`` 'missing', 'unexpected', 'shape' or 'not_a_dict' (``key`` '');
    ``saved``/``expected``: shape tuples, None where absent, else a type name."""
    kind: str
    key: str
    saved: tuple | str | None
    expected: tuple | None


def _shape(value):
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def state_dict_mismatches(expected: Mapping, saved) -> list:
    """Every ``Mismatch`` of ``saved`` against ``expected`` (name -> tensor); empty when they fit."""
    if not isinstance(saved, Mapping):
        return [Mismatch('not_a_dict', '', type(saved).__name__, None)]
    out = []
    for key, want in expected.items():
        if key not in saved:
            out.append(Mismatch('missing', key, None, tuple(want.shape)))
            continue
        got = saved[key]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            out.append(Mismatch('shape', key, _shape(got), tuple(want.shape)))
    for key, got in saved.items():
        if key not in expected:
            out.append(Mismatch('unexpected', key, _shape(got), None))
    return out


# The first Mismatch in words: for weights from the server (shapes as lists) and for a checkpoint against the config.
_LOADABLE_WORDS = {'missing': 'key {key!r} is missing (expected shape {expected})',
                   'shape': 'key {key!r} has shape {saved}, expected {expected}',
                   'unexpected': 'unexpected key {key!r}',
                   'not_a_dict': 'expected a state dict, got {saved}'}
_FITS_WORDS = {'missing': '{entry}.{key} is missing from the checkpoint (the config expects shape {expected})',
               'shape': '{entry}.{key} has shape {saved} in the checkpoint but the config expects {expected}',
               'unexpected': '{entry}.{key} (shape {saved}) is not in the configured model',
               'not_a_dict': '{entry} is a {saved}, not a state dict'}


def _in_words(m: Mismatch, words: dict, shape=tuple, **names) -> str:
    def shown(s):
        return shape(s) if isinstance(s, tuple) else s
    return words[m.kind].format(key=m.key, saved=shown(m.saved), expected=shown(m.expected), **names)


def check_loadable(module: torch.nn.Module, state_dict, what: str) -> None:
    """``CheckpointError`` naming the first key or shape where ``state_dict`` differs from ``module``'s."""
    problems = state_dict_mismatches(module.state_dict(), state_dict)
    if problems:
        raise CheckpointError(what, _in_words(problems[0], _LOADABLE_WORDS, list))


def check_fits_config(model: torch.nn.Module, state_dict, *, entry: str, source, ckpt_cfg, cfg) -> None:
    """``CheckpointError`` naming the first tensor of ``entry`` that does not fit ``model``."""
    problems = state_dict_mismatches(model.state_dict(), state_dict)
    if not problems:
        return
    raise CheckpointError(
        source, f'does not fit the configured model: {_in_words(problems[0], _FITS_WORDS, entry=entry)}; '
                f'checkpoint: {describe_arch(ckpt_cfg)}; config: [control] version = {cfg.control.version}, '
                f'[resnet] conv_channels = {cfg.resnet.conv_channels}, num_blocks = {cfg.resnet.num_blocks}')


def first_non_finite(state_dicts: Mapping[str, Mapping]) -> str | None:
    """``'entry.key'`` of the first floating tensor of ``state_dicts`` (``{entry: state dict}``) holding NaN or inf,
    or None; one host sync for all of them."""
    named = [(f'{e}.{k}', t) for e, sd in state_dicts.items() for k, t in sd.items()
             if torch.is_tensor(t) and t.is_floating_point()]
    if not named:
        return None
    bad = torch.stack([~torch.isfinite(t).all() for _, t in named]).tolist()
    return next((k for (k, _), b in zip(named, bad) if b), None)


def load_entries(models: Mapping[str, torch.nn.Module], state: dict, source, *, cfg) -> int:
    """Load each ``{entry: module}`` of ``models`` from the checkpoint dict ``state`` of ``source`` once every entry
    is checked (present, fits ``cfg``'s model, ``check_fits_config``, holds no NaN or inf); returns its ``steps``.
    ``CheckpointError`` names the first problem; nothing is loaded then."""
    require_entries(state, (*models, 'steps'), source)
    for entry, model in models.items():
        check_fits_config(model, state[entry], entry=entry, source=source, ckpt_cfg=state.get('config'), cfg=cfg)
    if (bad := first_non_finite({e: state[e] for e in models})) is not None:
        raise CheckpointError(source, f'{bad} holds NaN or inf (a diverged run)')
    try:
        steps = operator.index(state['steps'])
    except TypeError:
        raise CheckpointError(source, f"'steps' is {state['steps']!r}, not a count of steps") from None
    for entry, model in models.items():
        model.load_state_dict(state[entry])
    return steps


def describe_mismatches(expected: Mapping, saved, limit: int = 3) -> list:
    """Per kind (missing, unexpected, shape) the count and at most ``limit`` names; empty when they match."""
    def some(names):
        names = sorted(names)
        more = f' (+{len(names) - limit} more)' if len(names) > limit else ''
        return ', '.join(names[:limit]) + more

    problems = state_dict_mismatches(expected, saved)
    if problems and problems[0].kind == 'not_a_dict':
        return [f'expected a state dict, got {problems[0].saved}']
    out = []
    for kind, what in (('missing', 'missing key(s)'), ('unexpected', 'unexpected key(s)'),
                       ('shape', 'shape mismatch(es) saved vs expected')):
        names = [m.key if kind != 'shape' else f'{m.key} {m.saved} vs {m.expected}' for m in problems if m.kind == kind]
        if names:
            out.append(f'{len(names)} {what}: {some(names)}')
    return out


def atomic_torch_save(obj, filename) -> None:
    """``torch.save(obj)`` to ``filename`` via a temporary file, fsync and rename."""
    with atomic_write(filename) as f:
        torch.save(obj, f)


@contextlib.contextmanager
def load_errors(what: str, path):
    """Context manager turning any failure of loading ``path`` into ``cannot load <what> <path>: <reason>``."""
    try:
        yield
    except CheckpointError as exc:
        if exc.what is not None:
            raise
        raise CheckpointError(path, exc.reason, what=what) from None
    except (OSError, EOFError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(path, describe_error(exc), what=what) from None
