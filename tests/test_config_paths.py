"""Folders the processes empty never hold the config or the run's state; {config_dir} edge cases (issues 35/36)."""

import os

import pytest
import toml

from conftest import tiny_config_dict
from mortal import config_paths
from mortal.tools import doctor, quickstart_config
from mortal.config import config_errors, load_config
from mortal.util.fsutil import empty_dir


def _write(tmp_path, cfg):
    path = tmp_path / 'config.toml'
    path.write_text(toml.dumps(cfg), encoding='utf-8')
    return path


def _folder_errors(tmp_path, cfg):
    return [e for e in config_errors(_write(tmp_path, cfg), env={}) if 'emptied' in e]


def test_tiny_config_has_no_folder_error(tmp_path):
    assert _folder_errors(tmp_path, tiny_config_dict(tmp_path)) == []


def test_buffer_dir_at_the_config_folder_is_refused(tmp_path):
    cfg = tiny_config_dict(tmp_path)
    cfg['online']['server']['buffer_dir'] = '{config_dir}'
    errors = _folder_errors(tmp_path, cfg)
    assert any(e.startswith("[online.server] buffer_dir = '{config_dir}'") and 'the config file' in e
               for e in errors), errors


def test_train_play_log_dir_holding_the_state_file_is_refused(tmp_path):
    cfg = tiny_config_dict(tmp_path)
    cfg['train_play']['default']['log_dir'] = '{config_dir}/'
    errors = _folder_errors(tmp_path, cfg)
    assert any('[train_play.default] log_dir' in e and '[control] state_file' in e for e in errors), errors


def test_buffer_dir_equal_to_drain_dir_is_refused(tmp_path):
    cfg = tiny_config_dict(tmp_path)
    cfg['online']['server']['drain_dir'] = cfg['online']['server']['buffer_dir']
    errors = _folder_errors(tmp_path, cfg)
    assert len([e for e in errors if '[online.server] buffer_dir' in e and '[online.server] drain_dir' in e]) == 1


@pytest.mark.parametrize('table, key', [('online.server', 'buffer_dir'), ('online.server', 'drain_dir'),
                                        ('train_play.default', 'log_dir'), ('test_play', 'log_dir')])
def test_a_folder_key_naming_a_file_is_refused_and_the_file_kept(tmp_path, table, key):
    cfg = tiny_config_dict(tmp_path)
    victim = tmp_path / 'other.pth'  # a checkpoint this config does not name
    victim.write_bytes(b'weights')
    _table(cfg, table)[key] = str(victim)
    errors = _folder_errors(tmp_path, cfg)
    assert errors == [f"[{table}] {key} = '{victim}' in {tmp_path / 'config.toml'} is a file, not a folder: it would "
                      f"be emptied by its process; name a folder (a missing one is created)"]
    with pytest.raises(Exception, match=f'{key}.*is a file, not a folder'):
        load_config(tmp_path / 'config.toml', env={})
    assert victim.read_bytes() == b'weights'


def _table(cfg: dict, dotted: str) -> dict:
    """The table ``dotted`` ('a.b') of the plain config dict ``cfg``."""
    for part in dotted.split('.'):
        cfg = cfg[part]
    return cfg


@pytest.mark.parametrize('table, key', [('online.server', 'buffer_dir'), ('online.server', 'drain_dir'),
                                        ('train_play.default', 'log_dir'), ('test_play', 'log_dir')])
def test_an_empty_folder_key_is_refused_not_the_working_folder_emptied(tmp_path, table, key):
    # os.path.abspath('') is the working folder: the server, a client or the learner would empty it at start
    cfg = tiny_config_dict(tmp_path)
    _table(cfg, table)[key] = ''
    path = _write(tmp_path, cfg)
    assert f"[{table}] {key} = '' in {path} names no folder: the working folder would be emptied" in \
        config_errors(path, env={})


def test_relative_test_play_log_dir_compared_after_resolution(tmp_path, monkeypatch):
    # '.' from the working directory is the folder holding best.pth, written absolute
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config_dict(tmp_path)
    cfg['test_play']['log_dir'] = '.'
    errors = _folder_errors(tmp_path, cfg)
    assert any("[test_play] log_dir = '.'" in e and '[control] best_state_file' in e for e in errors), errors


def test_dataset_root_inside_an_emptied_folder_is_refused_and_load_config_refuses_too(tmp_path):
    cfg = tiny_config_dict(tmp_path)
    cfg['dataset']['globs'] = [str(tmp_path / 'tp' / 'logs' / '*.json.gz')]
    cfg['train_play']['default']['log_dir'] = str(tmp_path / 'tp')
    path = _write(tmp_path, cfg)
    with pytest.raises(Exception) as info:
        load_config(path, required=('control',), env={})
    assert '[train_play.default] log_dir' in str(info.value) and '[dataset] globs' in str(info.value)


def test_empty_dir_refuses_a_folder_holding_a_config_or_checkpoint(tmp_path):
    (tmp_path / 'a.json.gz').write_bytes(b'x')
    (tmp_path / 'sub').mkdir()
    (tmp_path / 'sub' / 'best.pth').write_bytes(b'x')
    with pytest.raises(OSError, match='refusing to empty'):
        empty_dir(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ['a.json.gz', 'sub']  # nothing removed
    empty_dir(tmp_path, keep=('sub',))  # what the caller keeps is not looked at
    assert os.listdir(tmp_path) == ['sub']


def test_config_dir_followed_by_other_text_is_an_error_and_the_token_is_never_expanded(tmp_path):
    cfg = tiny_config_dict(tmp_path)
    cfg['control']['tensorboard_dir'] = '{config_dir}..'
    cfg['online']['remote']['token'] = '{config_dir}/secret'
    errors = config_errors(_write(tmp_path, cfg), env={})
    assert [e for e in errors if '{config_dir}' in e] == [
        f"[control] tensorboard_dir in {tmp_path / 'config.toml'}: {{config_dir}} must be the whole value or be "
        f"followed by a path separator, got '{{config_dir}}..'"]
    cfg['control']['tensorboard_dir'] = '{config_dir}/tb'
    loaded = load_config(_write(tmp_path, cfg), required=('control',), env={})
    assert loaded['control']['tensorboard_dir'] == f'{tmp_path}/tb'
    assert loaded['online']['remote']['token'] == '{config_dir}/secret'
    assert config_paths.expand('{config_dir}', '/w') == '/w'
    assert config_paths.expand('{config_dir}x', '/w') == '{config_dir}x'


def test_doctor_sees_the_expanded_paths_of_a_relative_quickstart_config(tmp_path, capsys):
    work = tmp_path / 'work'
    cfg_path = quickstart_config.write_config(work, preset='short', relative=True)
    assert '{config_dir}' in cfg_path.read_text()
    doctor.main(['-c', str(cfg_path)])
    out = capsys.readouterr().out
    assert '{config_dir}' not in out, out
    assert str(work / 'online') in out  # the writable checks name the expanded folders


def test_doctor_refuses_the_buffer_dir_at_the_config_folder(tmp_path, capsys):
    work = tmp_path / 'work'
    cfg_path = quickstart_config.write_config(work, preset='short', relative=True)
    cfg = toml.load(cfg_path)
    cfg['online']['server']['buffer_dir'] = '{config_dir}'
    cfg_path.write_text(toml.dumps(cfg))
    assert doctor.main(['-c', str(cfg_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith('[FAIL] config: ')
    assert f"[online.server] buffer_dir = '{{config_dir}}' in {cfg_path} is emptied by its process but holds the " \
           f"config file ({cfg_path})" in out
    assert 'all checks passed' not in out


@pytest.mark.parametrize('table, key', [('online.server', 'buffer_dir'), ('control', 'state_file'),
                                        ('dataset', 'file_index')])
def test_a_nul_in_a_path_is_one_message_not_a_traceback(tmp_path, table, key):
    # TOML's "\u0000" reached os.path.realpath, whose ValueError ended the validation with a traceback
    cfg = tiny_config_dict(tmp_path)
    _table(cfg, table)[key] = 'a-NUL-b'
    path = tmp_path / 'config.toml'
    path.write_text(toml.dumps(cfg).replace('-NUL-', '\\u0000'), encoding='utf-8')
    assert config_errors(path, env={}) == [
        f"[{table}] {key} in {path} holds a NUL character (\\u0000), got 'a\\x00b'"]


@pytest.mark.parametrize('table, key, value, says', [
    ('control', 'state_file', '', 'must name a file (not empty, blank or ending in a path separator)'),
    ('control', 'best_state_file', '  ', 'must name a file'),
    ('control', 'state_file', 'ckpt/', 'must name a file'),
    ('grp', 'state_file', '', 'must name a file'),
    ('control', 'tensorboard_dir', '', 'must not be empty or blank: name a folder'),
])
def test_an_empty_file_or_folder_key_is_refused_by_name(tmp_path, table, key, value, says):
    # '' resolved to the working folder: the learner ran, then failed its first save (IsADirectoryError)
    cfg = tiny_config_dict(tmp_path)
    _table(cfg, table)[key] = value
    path = _write(tmp_path, cfg)
    assert any(e.startswith(f'[{table}] {key} in {path} {says}') for e in config_errors(path, env={})), \
        config_errors(path, env={})
