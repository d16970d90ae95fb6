"""The config's keys by name, read off the schema's models; TOML spelling of tables; unknown and removed names."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

from mortal.config_schema import CONTAINERS, SECTIONS, Kind, Section

REQUIRED = object()  # marker: the key has no default
UNFILLED = object()  # marker: an optional key that is accepted but not filled in when missing


@dataclass(frozen=True)
class Key:
    """One key as the models declare it: TOML type, meaning, default (``REQUIRED``, ``UNFILLED`` or the value)."""

    kind: str
    doc: str
    default: Any = REQUIRED


def is_section(annotation) -> bool:
    """True when a field's annotation is a sub-table (a :class:`Section`, or a dict or Optional of one)."""
    return (isinstance(annotation, type) and issubclass(annotation, Section)) or any(
        is_section(arg) for arg in getattr(annotation, '__args__', ()) or ())


def keys_of(model: type[Section]) -> dict[str, Key]:
    """The keys (not the sub-tables) of one section model, by name."""
    out = {}
    for name, field in model.model_fields.items():
        if is_section(field.annotation):
            continue
        kinds = [m.name for m in field.metadata if isinstance(m, Kind)]
        if not kinds:  # an Optional[...] field keeps the Kind on its inner type
            kinds = [m.name for arg in getattr(field.annotation, '__args__', ()) for m in
                     getattr(arg, '__metadata__', ()) if isinstance(m, Kind)]
        if (field.json_schema_extra or {}).get('unfilled'):
            default = UNFILLED
        elif field.is_required():
            default = REQUIRED
        else:
            default = field.get_default(call_default_factory=True)
        out[field.alias or name] = Key(kinds[0], field.description or '', default)
    return out


SCHEMA: dict[str, dict[str, Key]] = {dotted: keys_of(model) for dotted, model in SECTIONS.items()}


def section_keys(dotted: str) -> dict[str, Key] | None:
    """The keys of the table ``dotted`` (profiles included), or None for an unknown table."""
    parts = table_path(dotted)
    if len(parts) == 2 and parts[0] == 'train_play':  # a profile has any name, and no sub-tables
        return SCHEMA['train_play.*']
    if any('.' in part for part in parts):  # ["online.server"] is no [online.server]: no process reads from it
        return None
    return SCHEMA.get('.'.join(parts))


_BARE_KEY = re.compile(r'[A-Za-z0-9_-]+')
_STRING = json.JSONDecoder()


def table_name(parts: Iterable) -> str:
    """The dotted name of the table at ``parts`` as a TOML header spells it, non-bare keys quoted."""
    return '.'.join(part if isinstance(part, str) and _BARE_KEY.fullmatch(part)
                    else json.dumps(part, ensure_ascii=False) if isinstance(part, str) else str(part)
                    for part in parts)


def table_path(dotted: str) -> list[str]:
    """The keys of a dotted name: ``'train_play."a.b"'`` -> ``['train_play', 'a.b']``."""
    parts, i = [], 0
    while True:
        if dotted.startswith('"', i):
            try:
                part, i = _STRING.raw_decode(dotted, i)
            except ValueError:  # an unpaired quote: the rest is one bare part, as split would have it
                part, i = dotted[i:], len(dotted)
            end = dotted.find('.', i)
            end = len(dotted) if end < 0 else end
            part += dotted[i:end]  # nothing, for what table_name wrote
        else:
            end = dotted.find('.', i)
            end = len(dotted) if end < 0 else end
            part = dotted[i:end]
        parts.append(part)
        if end >= len(dotted):
            return parts
        i = end + 1


def _removed(why: str, table: str, *names: str) -> dict:
    return {(table, name): f'removed: {why} (docs/config.md, "Removed keys"); delete the line' for name in names}


#: Keys that were removed, by (table as docs/config.md spells it, key): a file that still sets one gets an error
#: saying so (an unknown key is only a warning). Each was an extra measured as no gain, or never measured to gain.
REMOVED_KEYS = {
    **_removed('measured as no gain', 'online', 'replay_ratio', 'replay_window', 'n_step', 'target_update_every',
               'pg_weight', 'pg_temp', 'kl_weight', 'ema_decay'),
    **_removed('measured as no gain', 'train_play.<profile>', 'counterfactual_persist'),
    **_removed('never measured to gain', 'resnet', 'dropout'),
    **_removed('never measured to gain: the probe is probe.pth beside [control] state_file', 'online', 'probe_file'),
    **_removed('never measured to gain', 'rotation', 'after', 'max_rank', 'pool_size'),
    **_removed('not a lever: the probe has 2048 positions', 'online', 'probe_size'),
    **_removed('not a lever: the newest 5 replaced state files are kept', 'guard', 'keep'),
    **{key: why for table in ('schedule.lr', 'schedule.epsilon', 'schedule.temp') for key, why in _removed(
        'never measured to gain', table, 'kind', 'rate', 'final', 'max_steps').items()},
}


def key_table() -> list[tuple[str, str, str, str, str]]:
    """Every known key as ``(section, key, type, default, meaning)``, for docs/config.md."""
    def shown(default) -> str:
        if default is REQUIRED:
            return 'required'
        return '(unset)' if default is UNFILLED else '(none)' if default is None else repr(default)

    return [(section.replace('*', '<profile>'), name, key.kind, shown(key.default), key.doc)
            for section, keys in SCHEMA.items() for name, key in keys.items()]


class Unknown(NamedTuple):
    """A table or key the schema does not know: ``table`` ('' at top), ``name``, ``is_section``, ``suggestion``."""

    table: str
    name: str
    is_section: bool
    suggestion: str | None


def unknown_names(config: dict) -> list[Unknown]:
    """Every table and key of ``config`` that the schema does not know (typos; Mortal ignores them), in file order."""
    out = []

    def walk(table: dict, parts: tuple):
        # table_name quotes a key with a dot: ["online.server"] is no [online.server] (section_keys knows neither),
        # while [train_play."a.b"] is the profile a.b
        prefix = table_name(parts)
        keys = section_keys(prefix) if parts else None
        if parts and keys is None and prefix not in CONTAINERS:
            out.append(Unknown(table_name(parts[:-1]), parts[-1], True, None))
            return
        for name, value in table.items():
            if keys is not None and name in keys:
                continue
            if isinstance(value, dict) and isinstance(name, str):
                walk(value, parts + (name,))
            elif isinstance(value, dict):
                out.append(Unknown(prefix, name, True, None))
            else:
                close = difflib.get_close_matches(name, list(keys or ()), n=1, cutoff=0.8) if isinstance(
                    name, str) else ()  # a dict built in Python may have other keys (difflib needs a str)
                out.append(Unknown(prefix, name, False, close[0] if close else None))

    walk(config, ())
    return out


def unknown_warning(u: Unknown, path: str) -> str:
    """The warning ``mortal.config.validate`` gives for ``u`` (an entry of :func:`unknown_names`) in ``path``."""
    if u.is_section:
        name = table_name((u.name,))  # ["a.b"], as TOML
        return f"unknown section [{f'{u.table}.{name}' if u.table else name}] in {path}"
    if u.table:
        hint = f' (did you mean {u.suggestion!r}?)' if u.suggestion else ''
        return f'unknown key [{u.table}] {u.name} in {path}{hint}'
    return f'unknown top-level key {u.name} in {path}'


def removed_reason(table: str, name) -> str | None:
    """Why the key ``name`` of the dotted ``table`` was removed (``REMOVED_KEYS``), or None."""
    parts = table_path(table)
    return REMOVED_KEYS.get(('train_play.<profile>' if len(parts) == 2 and parts[0] == 'train_play' else table, name))
