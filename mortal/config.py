"""Loading and validating the TOML config shared by every process (Mortal's layout plus docs/config.md's extras)."""

from __future__ import annotations

import copy
import difflib
import logging
import os
import reprlib
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from pydantic import ValidationError

from mortal.config_schema import (  # noqa: F401  (some re-exported: the config's public names live here)
    BEST_RULES, CONTAINERS, DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_LOG_BYTES, SCHEDULER_DEFAULT_INIT, SECTIONS, Config,
    Section)
from mortal.config_keys import (  # noqa: F401  (as well)
    REMOVED_KEYS, Unknown, key_table, removed_reason, section_keys, table_name, table_path, unknown_names,
    unknown_warning)
from mortal import config_paths
from mortal.config_paths import CONFIG_DIR  # noqa: F401  (a value starting with it starts at the file's folder)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib; tomli is the same parser
    import tomli as tomllib

logger = logging.getLogger(__name__)

DEFAULT_PATH = 'config.toml'
ENV_PATH = 'MORTAL_CFG'
ENV_PROFILE = 'TRAIN_PLAY_PROFILE'
ENV_SP_THREADS = 'MORTAL_SP_THREADS'
DEFAULT_PROFILE = 'default'

# Sections each process needs; 'train_play' is the [train_play.<profile>] of TRAIN_PLAY_PROFILE.
CORE_SECTIONS = ('control', 'resnet', 'env')
SERVER_SECTIONS = ('online', 'online.remote', 'online.server')
CLIENT_SECTIONS = CORE_SECTIONS + ('online', 'online.remote', 'baseline.train', 'train_play')
TRAIN_SECTIONS = CORE_SECTIONS + (
    'test_play', 'dataset', 'cql', 'aux', 'freeze_bn', 'optim', 'optim.scheduler', 'baseline.test', 'grp',
    'grp.network')
ONLINE_TRAIN_SECTIONS = TRAIN_SECTIONS + ('online', 'online.remote')
ONE_VS_THREE_SECTIONS = ('1v3', '1v3.challenger', '1v3.champion')
TRAIN_GRP_SECTIONS = ('grp', 'grp.network', 'grp.control', 'grp.dataset', 'grp.optim')
BOT_SECTIONS = ('control',)
MAX_DEPTH = 32  # tables and arrays inside each other; the schema's deepest key is 3 levels down


class ConfigError(ValueError):
    """The config file is missing, unparsable or invalid: ``path`` and ``problems`` (each naming key and file)."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f'{len(self.problems)} problems in {path}:\n' + '\n'.join(f'  - {p}' for p in self.problems)
        super().__init__(text)


@dataclass(frozen=True)
class EnvOverrides:
    """The environment read once at start-up: ``MORTAL_CFG``, ``TRAIN_PLAY_PROFILE``, ``MORTAL_SP_THREADS``."""

    config_path: str = DEFAULT_PATH
    profile: str = DEFAULT_PROFILE
    sp_threads: int | None = None
    profile_source: str = ENV_PROFILE  # what chose ``profile``, for messages (the doctor's ``--profile``)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> 'EnvOverrides':
        """The overrides in ``env``; a bad ``MORTAL_SP_THREADS`` is logged and ignored."""
        threads = env.get(ENV_SP_THREADS)
        if threads is not None and (not threads.strip().isdecimal() or int(threads) < 1):  # '²' is a digit, no int
            logger.warning('%s=%r is not a positive integer; using the default thread count',
                           ENV_SP_THREADS, threads)
            threads = None
        return cls(config_path=env.get(ENV_PATH) or DEFAULT_PATH, profile=env.get(ENV_PROFILE) or DEFAULT_PROFILE,
                   sp_threads=None if threads is None else int(threads))

    @classmethod
    def of(cls, env: 'Env') -> 'EnvOverrides':
        """``env`` itself when it is already resolved, else :meth:`from_env` of the mapping."""
        return env if isinstance(env, cls) else cls.from_env(env)


#: ``env`` below: the overrides resolved at start-up, or a mapping such as ``os.environ`` read on the spot.
Env = Mapping[str, str] | EnvOverrides
#: ``required``: dotted section names, or a function of the plain dict giving them (``train_sections``).
Required = Iterable[str] | Callable[[dict], Iterable[str]]


def resolve_path(path: str | os.PathLike | None = None, env: Env = os.environ) -> str:
    """The config path to use: ``path`` if given, else env ``MORTAL_CFG``, else ``'config.toml'`` (as Mortal)."""
    return os.fspath(path) if path is not None else EnvOverrides.of(env).config_path


def train_sections(config: dict) -> tuple:
    """``ONLINE_TRAIN_SECTIONS`` when ``config`` says ``[control] online = true``, else ``TRAIN_SECTIONS``."""
    return ONLINE_TRAIN_SECTIONS if lookup(config, 'control.online') is True else TRAIN_SECTIONS


def mode_sections(config: dict) -> tuple:
    """Every section the processes of ``config``'s mode need (online: server, client and learner)."""
    if lookup(config, 'control.online') is True:
        return tuple(dict.fromkeys(ONLINE_TRAIN_SECTIONS + SERVER_SECTIONS + CLIENT_SECTIONS))
    return TRAIN_SECTIONS


def read_config(path: str | os.PathLike | None = None, env: Env = os.environ) -> dict:
    """The TOML file ``path`` as a plain dict, not validated; ``ConfigError`` if missing, unreadable or malformed."""
    path = resolve_path(path, env)
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the open forever, a device not end
        raise ConfigError(path, [f'config path {path} is not a regular file'])
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except FileNotFoundError:
        raise ConfigError(path, [f'config file {path} not found (set {ENV_PATH} or pass the path)']) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise ConfigError(path, [f'cannot read config file {path}: {e}']) from None
    try:
        # utf-8-sig: Windows editors (Notepad) prepend a BOM, which the TOML parser would reject at line 1.
        return tomllib.loads(data.decode('utf-8-sig'))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [f'{path}: TOML syntax error: {e}']) from None
    except RecursionError:  # arrays or inline tables nested thousands deep
        raise ConfigError(path, [f'{path}: TOML syntax error: arrays or inline tables nested too deeply']) from None
    except ValueError as e:  # not UTF-8, or an integer of more than sys.get_int_max_str_digits() digits
        raise ConfigError(path, [f'cannot read config file {path}: {e}']) from None


def load_config(path: str | os.PathLike | None = None, *, required: Required = CORE_SECTIONS,
                env: Env = os.environ) -> dict:
    """Read, validate and return the config as a plain nested dict with defaults filled in; ``ConfigError``
    naming the file and every offending key. ``required``: the dotted sections this process needs."""
    path = resolve_path(path, env)
    config = read_config(path, env)
    validate(config, path, required=required, env=env)
    config_paths.expand_config_dir(config, config_paths.config_folder(path))
    return config


def config_errors(path: str | os.PathLike | None = None, *, required: Required = mode_sections,
                  env: Env = os.environ) -> list[str]:
    """Every problem ``load_config`` with the same ``required`` would refuse; ``[]`` when it loads. Logs nothing."""
    path = resolve_path(path, env)
    try:
        return _check(read_config(path, env), path, required, env)[0]
    except ConfigError as e:
        return list(e.problems)


def validate(config: dict, path: str = DEFAULT_PATH, *, required: Required = CORE_SECTIONS,
             env: Env = os.environ) -> list[str]:
    """Validate ``config`` in place (defaults filled; idempotent); returns the warnings, ``ConfigError`` for errors."""
    errors, warns, model = _check(config, path, required, env)
    if errors:
        raise ConfigError(path, errors)
    _merge(config, model.model_dump(by_alias=True, exclude_none=True))  # None: an absent section or unfilled key
    for w in warns:
        logger.warning('%s', w)
    return warns


def _check(config: dict, path: str, required: Required, env: Env) -> tuple:
    """``(errors, warnings, validated model or None)``; ConfigError only for a config nested too deeply."""
    required = tuple(required(config) if callable(required) else required)
    too_deep = _too_deep(config)
    if too_deep is not None:  # before anything recurses into it (pydantic, _merge, copy.deepcopy of a checkpoint)
        raise ConfigError(path, [f'{too_deep} in {path} is nested more than {MAX_DEPTH} tables or arrays deep'])
    errors: list[str] = []
    warns: list[str] = []
    model = None
    try:
        model = Config.model_validate(config)
    except ValidationError as e:
        errors.extend(dict.fromkeys(_problem(err, config, path) for err in e.errors()))
    _unknown_names(config, path, warns, errors)
    errors.extend(config_paths.config_dir_errors(config, path))
    for name in required:
        if name == 'train_play':
            name = profile_table(profile_name(env))
            if _get_table(config, name) is None:
                errors.append(f'missing section [{name}] in {path} ({profile_choice(env)})')
        elif lookup(config, name) is None:  # a table that is not one is reported above
            errors.append(f'missing section [{name}] in {path}')
    # The rules across keys run whatever else is wrong, over the tables that validate on their own.
    relation_errors: list[str] = []
    check_relations(model if model is not None else _valid_tables(config), path, relation_errors, warns)
    errors.extend(e for e in relation_errors if e not in errors)
    return errors, warns, model


def _valid_tables(config: dict) -> Config:
    """A Config of the top-level tables of ``config`` that validate on their own (the others left out)."""
    fields = {}
    for name, field in Config.model_fields.items():
        key = field.alias or name
        if isinstance(config, dict) and key in config:
            try:
                fields[name] = getattr(Config.model_validate({key: config[key]}), name)
            except ValidationError:
                pass
    return Config.model_construct(**fields)


def _too_deep(config: dict) -> str | None:
    """The first table or array nested more than ``MAX_DEPTH`` levels deep, as ``[dotted]``; None if none."""
    stack = [(config, (), 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            return '[' + '.'.join(map(str, where[:-1])) + '] ' + str(where[-1])
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for name, value in items:
            if isinstance(value, (dict, list)):
                stack.append((value, where + (name,), depth + 1))
    return None


def typed(config: dict) -> Config:
    """The typed view of a loaded config (``typed(c).control.batch_size``); absent sections are None."""
    return Config.model_validate(config)


def section(config: dict, dotted: str) -> Section:
    """The typed table ``dotted``, validated alone; KeyError if absent or unknown, else ``pydantic.ValidationError``."""
    model = SECTIONS.get('train_play.*' if dotted.startswith('train_play.') else dotted)
    table = lookup(config, dotted)
    if model is None or not isinstance(table, dict):
        raise KeyError(f'no table [{dotted}] in this config')
    return model.model_validate(table)


def checked_section(config: dict, dotted: str, *, path: str | None = None, env: Env = os.environ) -> Section:
    """``section``, its problems raised as ``ConfigError`` naming ``path`` as ``validate`` words them."""
    path = resolve_path(path, env)
    if _get_table(config, dotted) is None:
        raise ConfigError(path, [f'missing section [{dotted}] in {path}'])
    try:
        return section(config, dotted)
    except ValidationError as e:
        where = tuple(table_path(dotted))  # the table's errors are located within it; _problem wants the whole path
        raise ConfigError(path, list(dict.fromkeys(
            _problem({**err, 'loc': where + tuple(err['loc'])}, config, path) for err in e.errors()))) from None


def put(config: dict, dotted: str, value) -> None:
    """Set the key or table ``dotted`` of the plain config dict in place, making the tables on the way."""
    *tables, name = table_path(dotted)
    node = config
    for part in tables:
        node = node.setdefault(part, {})
    node[name] = value


def lookup(config: dict, dotted: str, default=None):
    """``config['a']['b']`` for ``'a.b'`` (quoted parts as ``table_name``); ``default`` when any level is missing."""
    node = config
    for part in table_path(dotted):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _get_table(config: dict, dotted: str):
    table = lookup(config, dotted)
    return table if isinstance(table, dict) else None


def _merge(target: dict, values: dict) -> None:
    for name, value in values.items():
        if isinstance(value, dict) and isinstance(target.get(name), dict):
            _merge(target[name], value)
        else:
            target[name] = value


def train_play_profile(config: dict, env: Env = os.environ, *, path: str | None = None) -> Section:
    """The typed ``[train_play.<profile>]`` of ``TRAIN_PLAY_PROFILE``; ``ConfigError`` when it is missing."""
    profile = profile_name(env)
    if _get_table(config, profile_table(profile)) is None:
        path = resolve_path(path, env)
        raise ConfigError(path, [f'missing section [{profile_table(profile)}] in {path} '
                                 f'({profile_choice(env)})'])
    return section(config, profile_table(profile))


def profile_name(env: Env = os.environ) -> str:
    """The train-play profile in use: env ``TRAIN_PLAY_PROFILE`` or ``'default'``."""
    return EnvOverrides.of(env).profile


def profile_choice(env: Env = os.environ) -> str:
    """What selected the profile, as messages say it: ``selected by TRAIN_PLAY_PROFILE='fast'``."""
    env = EnvOverrides.of(env)
    return f'selected by {env.profile_source}={env.profile!r}'


def profile_table(profile: str) -> str:
    """The dotted name of ``[train_play.<profile>]`` as a TOML header spells it (``train_play."a.b"``)."""
    return table_name(('train_play', profile))


def for_checkpoint(config: dict) -> dict:
    """A deep copy of ``config`` without ``[online.remote] token``, to store in a checkpoint."""
    public = copy.deepcopy(config)
    remote = _get_table(public, 'online.remote')
    if remote is not None:
        remote.pop('token', None)
    return public


_KIND_NAMES = {'int': 'an integer', 'float': 'a number', 'bool': 'true or false', 'str': 'a string',
               'str_list': 'a list of strings', 'float_list': 'a list of numbers'}
# _shown(value): repr cut to a line (a 5 MB string where a number belongs must not make a 5 MB message)
_SHOWN = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxother = 120, 60, 8, 8, 120
_shown = _SHOWN.repr


def _problem(err: dict, config: dict, path: str) -> str:
    def tagged(part):
        return isinstance(part, str) and part.startswith('<')

    if err['type'] == 'invalid_key' or err['loc'][-1:] == ('[key]',):
        # A dict built in Python may have a key that is not a string (a TOML key is one): pydantic's location ends
        # with it (as str() writes it, which may start with '<'), or with '[key]' after it in the table of profiles.
        key, table = err['input'], err['loc'][:-1] if err['type'] == 'invalid_key' else err['loc'][:-2]
        where = f'[{table_name(p for p in table if not tagged(p))}] key' if table else 'top-level key'
        return f'{where} {_shown(key)} in {path} must be a string, got {type(key).__name__}'
    loc = [part for part in err['loc'] if not tagged(part)]
    while loc and isinstance(loc[-1], int):
        loc.pop()  # an element of a list: the message is about the whole list
    dotted = table_name(loc)  # train_play."a.b" for a profile a.b, as the file spells it
    value = lookup(config, dotted, err['input'])
    profile_keys = section_keys('train_play.default')
    if len(loc) == 2 and loc[0] == 'train_play' and loc[1] in profile_keys and not isinstance(value, dict):
        # a profile's keys written straight under [train_play]: one line for them all (deduplicated by the caller)
        flat = [k for k, v in config['train_play'].items() if k in profile_keys and not isinstance(v, dict)]
        return (f'[train_play] in {path} holds profiles, not keys: put {", ".join(map(str, flat))} under '
                f'[train_play.default] (or another [train_play.<profile>], which TRAIN_PLAY_PROFILE picks)')
    if section_keys(dotted) is not None or dotted in CONTAINERS or len(loc) == 1:
        return f'[{dotted}] in {path} must be a table, got {_shown(value)}'
    table, name = table_name(loc[:-1]), loc[-1]
    key = (section_keys(table) or {}).get(name)
    kind = key.kind if key is not None else 'str'
    where = f'[{table}] {name} in {path}'
    if err['type'] == 'missing':
        doc = f' ({key.kind}: {key.doc})' if key is not None else ''
        unknown = [u.name for u in unknown_names(config) if u.table == table and not u.is_section
                   and isinstance(u.name, str)]
        typo = difflib.get_close_matches(str(name), unknown, n=1, cutoff=0.8)  # as unknown_names, the other way
        hint = f'; the table has {typo[0]!r}: a typo of it?' if typo else ''
        return f'missing key {where}{doc}{hint}'
    if err['type'] in ('too_short', 'too_long'):  # pydantic's ctx names min_length or max_length: the lists are fixed
        length = err['ctx'].get('min_length', err['ctx'].get('max_length'))
        return f'{where} must have exactly {length} elements, got {len(value)}'
    if err['type'] == 'value_error':
        value = float(value) if kind == 'float' and isinstance(value, int) else value
        return f"{where} {err['ctx']['error']}, got {_shown(value)}"
    return f'{where} must be {_KIND_NAMES[kind]}, got {_shown(value)}'


def _unknown_names(config: dict, path: str, warns: list[str], errors: list[str]) -> None:
    """The warnings of ``unknown_names``; a removed key (``REMOVED_KEYS``) is an error instead."""
    def leaves(node: dict, parts: tuple):  # (dotted table, key) of every key inside a table
        for name, value in node.items():
            if isinstance(value, dict) and isinstance(name, str):
                yield from leaves(value, parts + (name,))
            else:
                yield table_name(parts), name

    for u in unknown_names(config):
        if u.is_section and isinstance(u.name, str):
            parts = (*table_path(u.table), u.name) if u.table else (u.name,)
            keys = leaves(lookup(config, table_name(parts)), parts)
        else:
            keys = () if u.is_section else ((u.table, u.name),)
        removed = [f'[{t}] {n} in {path} was {why}' for t, n in keys if (why := removed_reason(t, n))]
        if removed:
            errors.extend(removed)
            continue
        warning = unknown_warning(u, path)
        elsewhere = [(t, reason) for (t, n), reason in REMOVED_KEYS.items() if n == u.name and not u.is_section]
        if len(elsewhere) == 1:  # a removed key written in another table than its own (not [schedule.*]'s kind)
            warning += f' ([{elsewhere[0][0]}] {u.name} was {elsewhere[0][1]})'
        warns.append(warning)


def check_relations(cfg: Config, path: str, errors: list[str], warns: list[str]) -> None:
    """The rules that tie several keys together, appended as messages (tables that failed are None, skipped)."""
    control, online, server = cfg.control, cfg.online, cfg.online and cfg.online.server
    # no folder a process empties may hold the config, the checkpoints or another emptied folder
    errors.extend(config_paths.folder_errors(cfg, path))
    if control is not None and online is not None and online.offline_batch_size and not control.online:
        warns.append(f'[online] offline_batch_size = {online.offline_batch_size} in {path} has no effect with '
                     f'[control] online = false (offline training reads [dataset] whole)')
    if control is not None:
        if control.save_every % control.opt_step_every != 0:
            errors.append(f'[control] save_every = {control.save_every} in {path} must be a multiple of '
                          f'[control] opt_step_every = {control.opt_step_every}')
        if control.test_every % control.save_every != 0:
            errors.append(f'[control] test_every = {control.test_every} in {path} must be a multiple of '
                          f'[control] save_every = {control.save_every}')
        if cfg.test_play is not None and control.online and cfg.test_play.best_rule == 'sprt' \
                and cfg.test_play.games // 4 < 8:
            warns.append(f"[test_play] games = {cfg.test_play.games} in {path} is fewer than the 32 games the SPRT "
                         f"needs before it decides (best_rule = 'sprt'): best.pth would never be replaced")
        others = [('[control] best_state_file', control.best_state_file)]
        if cfg.baseline is not None:
            others += [(f'[baseline.{role}] state_file', slot.state_file)
                       for role, slot in (('train', cfg.baseline.train), ('test', cfg.baseline.test)) if slot]
        for name, other in others:
            if os.path.normpath(other) == os.path.normpath(control.state_file):
                errors.append(f'{name} = {other!r} in {path} is the same file as [control] state_file: each save '
                              f'would overwrite it')
    if cfg.optim is not None and cfg.optim.scheduler is not None:
        # The very rules the scheduler enforces (one function), so a config that loads also trains.
        shape = {k: v for k, v in cfg.optim.scheduler.model_dump().items() if v is not None}  # unset: defaults
        errors.extend(f'[optim.scheduler] {key} in {path} {rule}' for key, rule in scheduler_problems(**shape))
    boot = cfg.bootstrap
    grp_control = cfg.grp and cfg.grp.control
    problem = boot and grp_control and grp_steps_problem(boot.grp_steps, grp_control.save_every)
    if problem:
        errors.append(f'[bootstrap] grp_steps = {boot.grp_steps} in {path} {problem}')
    if boot is not None and boot.epsilon > 0:
        for name in ('games', 'val_games'):  # the generator plays whole deals: a remainder would be rounded up
            n = getattr(boot, name)
            if n % 4:
                errors.append(f'[bootstrap] {name} = {n} in {path} must be a multiple of 4 while [bootstrap] epsilon > '
                              f'0 (each deal is played in its 4 seat rotations: {n} would play {n + 4 - n % 4})')
    remote = online and online.remote
    if remote is not None and not remote.token:
        from mortal.net.address import is_loopback
        # resolve=False: no name lookup while a config loads (the host may resolve otherwise where a peer runs)
        if not is_loopback(remote.host, resolve=False):
            errors.append(f'[online.remote] token in {path} is required because [online.remote] host = '
                          f'{remote.host!r} is not a loopback address (anyone who can reach the port could '
                          f'otherwise submit replays and parameters)')
    if server is None:
        return
    if server.max_inflight_bytes and server.max_inflight_bytes < server.max_frame_bytes:
        errors.append(f'[online.server] max_inflight_bytes = {server.max_inflight_bytes} in {path} must be 0 or '
                      f'at least [online.server] max_frame_bytes = {server.max_frame_bytes} (a largest frame '
                      f'must fit)')
    for name in ('sample_reuse_rate', 'sample_reuse_threshold'):
        if getattr(server, name) != 0:
            warns.append(f'[online.server] {name} = {getattr(server, name)} in {path} is accepted but has no effect '
                         f'(as in Mortal)')
    capacity = server.capacity
    for profile, table in sorted((cfg.train_play or {}).items()):
        games = table.games  # one client round submits one log file per game
        if capacity < games:
            warns.append(f'[online.server] capacity = {capacity} in {path} is smaller than one client round of '
                         f'[{profile_table(profile)}] games = {games}: every submission overflows the buffer, '
                         f'so clients would be refused ("samples overflow") forever')
        elif server.force_sequential and capacity > games:
            warns.append(f'[online.server] force_sequential = true with capacity = {capacity} in {path} larger '
                         f'than one client round of [{profile_table(profile)}] games = {games}: the server drains '
                         f'only a full buffer and each client plays once per trainer parameter version, so the '
                         f'trainer would wait forever unless at least {-(-capacity // games)} clients run')


def grp_steps_problem(steps: int, save_every: int) -> str | None:
    """Why ``steps`` GRP training steps would be wasted, or None: the GRP is written only every ``save_every``."""
    if steps > 0 and steps % save_every == 0:
        return None
    return f'must be a positive multiple of [grp.control] save_every = {save_every} (the GRP is saved only then)'


def scheduler_problems(*, peak, final, warm_up_steps, max_steps, init=SCHEDULER_DEFAULT_INIT, offset=0,
                       epoch_size=0, **_ignored) -> list[tuple[str, str]]:
    """``[(key = value, rule)]`` wrong with an ``[optim.scheduler]`` shape, ``[]`` if none:
    ``peak >= final >= init >= 0``, the step counts and ``offset`` >= 0, ``max_steps`` 0 or >= ``warm_up_steps``."""
    out = []
    if init < 0:
        out.append((f'init = {init}', 'must be >= 0'))
    if not peak >= final >= init:
        out.append((f'final = {final}', f'must be within [init = {init}, peak = {peak}] (peak >= final >= init)'))
    for name, value in (('warm_up_steps', warm_up_steps), ('max_steps', max_steps), ('epoch_size', epoch_size),
                        ('offset', offset)):  # a negative offset: a negative learning rate while warming up
        if value < 0:
            out.append((f'{name} = {value}', 'must be >= 0'))
    if max_steps and max_steps < warm_up_steps:
        out.append((f'max_steps = {max_steps}', f'must be 0 or >= warm_up_steps = {warm_up_steps}'))
    return out
