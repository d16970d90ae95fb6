"""The learner never reads what a bad cached file index lists: it rebuilds it from the globs (issue 35 item 7)."""

import json
import logging
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from mortal.data.offline_data import build_file_list, glob_regex, listed_problem

from conftest import call_unless_stuck_on


@pytest.fixture
def ds(tmp_path):
    (tmp_path / 'logs').mkdir()
    for name in ('a.json.gz', 'b.json.gz'):
        (tmp_path / 'logs' / name).write_bytes(b'x')
    (tmp_path / 'other.json.gz').write_bytes(b'x')
    globs = [str(tmp_path / 'logs' / '*.json.gz')]
    return SimpleNamespace(file_index=str(tmp_path / 'index.pth'), globs=globs)


def _built(tmp_path):
    return [str(tmp_path / 'logs' / 'b.json.gz'), str(tmp_path / 'logs' / 'a.json.gz')]


@pytest.mark.parametrize('listed, why', [
    (['/etc/passwd'], "1 of its 1 files are outside the globs ('/etc/passwd')"),
    ([1, 2, None], '3 of its 3 entries are not paths (1, 2, None)'),
    ('/etc/passwd', 'its file_list is a str, not a list of paths'),
    ('OTHER', '1 of its 1 files are outside the globs'),
    ('MISSING', '1 of its 1 files are missing'),
], ids=['passwd', 'non-str', 'str', 'outside', 'missing'])
def test_a_bad_index_is_rebuilt_from_the_globs_with_a_warning(tmp_path, ds, caplog, capsys, listed, why):
    if listed == 'OTHER':
        listed = [str(tmp_path / 'other.json.gz')]
    elif listed == 'MISSING':
        listed = [str(tmp_path / 'logs' / 'gone.json.gz')]
    torch.save({'file_list': listed, 'globs': ds.globs}, ds.file_index)
    with caplog.at_level(logging.WARNING, logger='mortal.train'):
        files = build_file_list(ds, set())
    assert files == _built(tmp_path)
    [msg] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert msg.startswith(f'[dataset] file_index {ds.file_index} is rebuilt from [dataset] globs: {why}')
    assert torch.load(ds.file_index)['file_list'] == _built(tmp_path)  # the cache holds the rebuilt list
    assert not sys.stdout.closed
    print('still open')
    assert capsys.readouterr().out == 'still open\n'


def test_a_sound_index_is_used_as_it_is(tmp_path, ds, caplog):
    listed = [str(tmp_path / 'logs' / 'a.json.gz')]  # a subset: e.g. filtered by player names
    torch.save({'file_list': listed, 'globs': ds.globs}, ds.file_index)
    with caplog.at_level(logging.WARNING, logger='mortal.train'):
        assert build_file_list(ds, set()) == listed
    assert caplog.records == []


def test_glob_regex_matches_what_glob_gives():
    assert glob_regex('/d/**/*.json.gz').match('/d/x/y/a.json.gz')
    assert glob_regex('/d/**/*.json.gz').match('/d/a.json.gz')
    assert not glob_regex('/d/*.gz').match('/d/x/a.gz')
    assert not glob_regex('/d/[!a]?.gz').match('/d/a1.gz')
    assert glob_regex('/d/[ab]?.gz').match('/d/b1.gz')
    assert listed_problem(('/d/a.gz',), ['/d/*.gz']) == "1 of its 1 files are missing ('/d/a.gz')"


def test_a_bad_grp_index_is_rebuilt_from_the_globs_with_a_warning(tmp_path, ds, caplog):
    from mortal.train_grp import build_file_index
    val = [str(tmp_path / 'other.json.gz')]
    torch.save({'train_file_list': [1, 2, None], 'val_file_list': val, 'train_globs': ds.globs,
                'val_globs': val}, ds.file_index)
    with caplog.at_level(logging.WARNING, logger='mortal.train_grp'):
        assert build_file_index(ds.globs, val, ds.file_index) == (_built(tmp_path), val)
    assert (f'[grp.dataset] file_index {ds.file_index} is rebuilt from the globs: train_file_list: 3 of its 3 '
            f'entries are not paths (1, 2, None)') in caplog.text


@pytest.mark.skipif(not hasattr(os, 'mkfifo'), reason='needs FIFOs')
def test_indexing_by_player_names_skips_bad_first_lines_and_fifos_with_a_line_each(tmp_path, caplog):
    # 'names' null or a number raised TypeError outside the skip; a FIFO blocked the open forever
    logs = tmp_path / 'logs'
    logs.mkdir()
    for name, names in (('good.json', ['me', 'a', 'b', 'c']), ('other.json', ['x', 'a', 'b', 'c']),
                        ('null.json', None), ('number.json', 5), ('nested.json', [['me']])):
        (logs / name).write_text(json.dumps({'type': 'start_game', 'names': names}) + '\n')
    os.mkfifo(logs / 'pipe.json')
    ds = SimpleNamespace(file_index=str(tmp_path / 'index.pth'), globs=[str(logs / '*.json')])
    with caplog.at_level(logging.WARNING, logger='mortal.train'):
        result = call_unless_stuck_on(logs / 'pipe.json', lambda: build_file_list(ds, {'me'}), 'build_file_list')
    assert result == [str(logs / 'good.json')]
    skipped = sorted(m.split(' ')[1].rsplit('/', 1)[1] for m in caplog.messages)
    assert skipped == ['nested.json', 'null.json', 'number.json', 'pipe.json'], caplog.messages
    assert f'skipping {logs / "pipe.json"} while indexing: OSError: not a regular file' in caplog.messages
