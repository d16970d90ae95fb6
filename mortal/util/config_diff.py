"""The keys that differ between two loaded configs, as lines a user reads at a restart."""

from __future__ import annotations


def flat_keys(table: dict, prefix: tuple = ()) -> dict:
    """``{(table, ..., key): value}`` of every non-table value of ``table`` (a list is one value)."""
    out = {}
    for name, value in table.items():
        if isinstance(value, dict):
            out.update(flat_keys(value, prefix + (str(name),)))
        else:
            out[prefix + (str(name),)] = value
    return out


def shown(value) -> str:
    """A value as TOML writes it, near enough: strings quoted, booleans lower case."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, str):
        return repr(value)
    return str(value)


def key_name(parts: tuple) -> str:
    """``('control', 'test_every')`` -> ``[control] test_every``; a top-level key is its bare name."""
    return f"[{'.'.join(parts[:-1])}] {parts[-1]}" if len(parts) > 1 else parts[0]


#: Tables the learner does not read -> who reads them (a change there waits for that process's restart).
OTHER_READERS = {'train_play': 'clients', 'server': 'the server'}


def _reader_note(parts: tuple) -> str:
    reader = OTHER_READERS.get(parts[0]) or (OTHER_READERS['server'] if parts[:2] == ('online', 'server') else None)
    return f' (used by {reader}: at {"its" if reader == "the server" else "their"} restart)' if reader else ''


def changed_keys(old: dict, new: dict) -> list[str]:
    """One line per key that differs between ``old`` and ``new`` (``[control] test_every 600 -> 300``)."""
    before, after = flat_keys(old), flat_keys(new)
    lines = []
    for parts, value in after.items():
        if parts not in before:
            lines.append(f'{key_name(parts)} (unset) -> {shown(value)}{_reader_note(parts)}')
        elif before[parts] != value or type(before[parts]) is not type(value):
            lines.append(f'{key_name(parts)} {shown(before[parts])} -> {shown(value)}{_reader_note(parts)}')
    lines += [f'{key_name(parts)} {shown(value)} -> (unset){_reader_note(parts)}'
              for parts, value in before.items() if parts not in after]
    return lines
