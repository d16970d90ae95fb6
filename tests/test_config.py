"""Config loading and validation (issue #2 item 2)."""

import copy
import logging
import re

import pytest
import toml

from conftest import ROOT, load_script, tiny_config_dict
from mortal.config import (
    CLIENT_SECTIONS, DEFAULT_MAX_FRAME_BYTES, ONLINE_TRAIN_SECTIONS, ONE_VS_THREE_SECTIONS, SERVER_SECTIONS,
    TRAIN_GRP_SECTIONS, ConfigError, for_checkpoint, key_table, load_config, train_play_profile, typed, validate)
from mortal.config_keys import REQUIRED, SCHEMA, UNFILLED

ALL_PROCESSES = ONLINE_TRAIN_SECTIONS + CLIENT_SECTIONS + SERVER_SECTIONS + ONE_VS_THREE_SECTIONS + TRAIN_GRP_SECTIONS


def write(tmp_path, config, name='config.toml'):
    path = tmp_path / name
    path.write_text(toml.dumps(config), encoding='utf-8')
    return path


def load_error(tmp_path, config, **kw):
    path = write(tmp_path, config)
    with pytest.raises(ConfigError) as info:
        load_config(path, **kw)
    return str(info.value), str(path)


def load_warnings(tmp_path, config, caplog, **kw):
    path = write(tmp_path, config)
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        load_config(path, **kw)
    return [r.getMessage() for r in caplog.records if r.name == 'mortal.config'], str(path)


@pytest.fixture
def cfg(tmp_path):
    return tiny_config_dict(tmp_path)


# --- the shipped files --------------------------------------------------------------------------------------------

def test_config_online_holds_reference_values(caplog):
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        c = load_config(ROOT / 'config_online.toml', required=ONLINE_TRAIN_SECTIONS + CLIENT_SECTIONS + SERVER_SECTIONS,
                        env={})
    assert caplog.records == []
    ctl = c['control']
    assert (ctl['version'], ctl['online'], ctl['device']) == (4, True, 'cuda:0')
    assert (ctl['enable_cudnn_benchmark'], ctl['enable_amp'], ctl['enable_compile']) == (True, True, False)
    assert (ctl['batch_size'], ctl['opt_step_every'], ctl['save_every'], ctl['test_every'], ctl['submit_every']) \
        == (256, 2, 400, 8000, 400)
    assert ctl['state_file'] == '/data/mortal/online/mortal.pth'
    assert ctl['best_state_file'] == '/data/mortal/online/best.pth'
    assert ctl['tensorboard_dir'] == '/data/mortal/tb/online'
    assert c['train_play']['default'] == {
        'games': 800, 'log_dir': '/data/mortal/online/train_play', 'boltzmann_epsilon': 0.005,
        'boltzmann_temp': 0.05, 'top_p': 1.0, 'repeats': 1, 'speculate_passes': False, 'counterfactual_rate': 0.0,
        'counterfactual_alternative': 'best'}
    assert c['test_play'] == {'games': 3000, 'log_dir': '/data/mortal/online/test_play', 'best_rule': 'paired',
                              'confidence': 0.95, 'sprt_delta': 0.05, 'sprt_alpha': 0.05, 'sprt_beta': 0.05,
                              'sprt_chunk': 64, 'min_deals': 8, 'fresh_deals': False, 'speculate_passes': False}
    # the guards' sections are filled with defaults that change nothing of Mortal's run
    assert c['guard']['rollback_after'] == 0 and 'rotation' not in c and 'schedule' not in c
    assert c['dataset']['globs'] == ['/data/dataset/**/*.json.gz']
    assert c['dataset']['file_index'] == '/data/mortal/file_index.pth'
    assert (c['dataset']['file_batch_size'], c['dataset']['num_workers'], c['dataset']['player_names_files']) \
        == (15, 1, [])
    assert c['env'] == {'gamma': 1, 'pts': [6.0, 4.0, 2.0, 0.0], 'reward': 'grp'}  # the reward filled in: Mortal's
    assert (c['resnet']['conv_channels'], c['resnet']['num_blocks']) == (192, 40)
    assert c['cql']['min_q_weight'] == 5 and c['aux']['next_rank_weight'] == 0.2
    assert c['freeze_bn']['mortal'] is True
    assert c['optim'] == {'eps': 1e-8, 'betas': [0.9, 0.999], 'weight_decay': 0.1, 'max_grad_norm': 1.0,
                          'scheduler': {'peak': 1e-5, 'final': 1e-5, 'warm_up_steps': 0, 'max_steps': 0}}
    for slot in ('train', 'test'):
        assert c['baseline'][slot] == {'device': 'cuda:0', 'enable_compile': False,
                                       'state_file': '/data/mortal/online/baseline.pth',
                                       **({'from_server': True} if slot == 'train' else {})}  # the filled default
    assert (c['online']['history_window'], c['online']['enable_compile']) == (50, False)
    assert (c['online']['remote']['host'], c['online']['remote']['port']) == ('127.0.0.1', 5000)
    srv = c['online']['server']
    assert (srv['buffer_dir'], srv['drain_dir']) == ('/data/mortal/online/buffer', '/data/mortal/online/drain')
    assert (srv['sample_reuse_rate'], srv['sample_reuse_threshold'], srv['capacity'], srv['force_sequential']) \
        == (0, 0, 1600, False)
    assert c['grp'] == {'state_file': '/data/mortal/grp.pth', 'network': {'hidden_size': 64, 'num_layers': 2}}


def test_config_online_documents_version_4():
    text = (ROOT / 'config_online.toml').read_text(encoding='utf-8')
    assert 'version = 4' in text and 'version = 3' in text


def test_example_loads_without_warnings(caplog):
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        c = load_config(ROOT / 'config.example.toml', required=ALL_PROCESSES + ('1v3.akochan',), env={})
    assert caplog.records == []
    assert c['resnet'] == {'conv_channels': 192, 'num_blocks': 40}


def test_example_has_every_key():
    raw = toml.load(ROOT / 'config.example.toml')
    for section, key, *_ in key_table():
        node = raw
        for part in section.replace('<profile>', 'default').split('.'):
            node = node[part]
        if key in ('init', 'offset', 'epoch_size', 'token'):  # optional, documented in comments
            continue
        assert key in node, (section, key)


def _values(table: dict, parts=()):
    """``(dotted table, key, value)`` of every key of a TOML dict, ``train_play.<profile>`` as the schema's
    ``train_play.*``."""
    for name, value in table.items():
        if isinstance(value, dict):
            yield from _values(value, parts + (name,))
        else:
            yield '.'.join(('train_play', '*') if parts[:1] == ('train_play',) else parts), name, value


def _schema_default(section, name):
    key = SCHEMA[section][name]  # KeyError: a key the schema does not know
    return None if key.default in (REQUIRED, UNFILLED) else key.default


def test_example_values_are_the_schema_defaults():
    """config.example.toml restates every default as the schema declares it: the schema is the one description."""
    raw = toml.load(ROOT / 'config.example.toml')
    differ = [(s, k, v, _schema_default(s, k)) for s, k, v in _values(raw)
              if _schema_default(s, k) is not None and v != _schema_default(s, k)]
    assert differ == []


@pytest.mark.parametrize('preset, version', [('full', 3), ('short', 3), ('full', 4)])
def test_quickstart_config_is_checked_against_the_schema(tmp_path, caplog, preset, version):
    """The quickstart's embedded config: every key known (no warning), every required key of its tables there (it
    loads for every process), and no schema default restated (a key it sets with a default is a deliberate change:
    a third copy of the defaults would drift)."""
    from mortal.tools.quickstart_config import render_config
    text = render_config(tmp_path, preset=preset, port=5123, version=version)
    path = tmp_path / 'config.toml'
    path.write_text(text, encoding='utf-8')
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        load_config(path, required=ONLINE_TRAIN_SECTIONS + CLIENT_SECTIONS + SERVER_SECTIONS + TRAIN_GRP_SECTIONS
                    + ('bootstrap',), env={})
    assert caplog.records == []
    restated = [(s, k) for s, k, v in _values(toml.loads(text)) if v == _schema_default(s, k)]
    assert restated == []


def test_config_doc_documents_every_key():
    text = (ROOT / 'docs' / 'config.md').read_text(encoding='utf-8')
    rows = {tuple(cell.strip().strip('`') for cell in line.strip('|').split('|')[:2])
            for line in text.splitlines() if line.startswith('|')}
    missing = [(s, k) for s, k, *_ in key_table() if (f'[{s}]', k) not in rows]
    assert missing == []


def test_config_doc_is_generated_from_the_schema():
    """docs/config.md is what scripts/gen_config_doc.py writes: regenerate it after changing the schema."""
    gen = load_script('scripts/gen_config_doc.py', 'gen_config_doc')
    assert (ROOT / 'docs' / 'config.md').read_text(encoding='utf-8') == gen.render(), \
        'docs/config.md is stale: python scripts/gen_config_doc.py > docs/config.md'


def test_extras_are_marked_and_each_has_its_measurement_line():
    """Mortal's config.example.toml has 97 keys, all in the schema; every other key says 'extra:' (so the count of
    extras is right) and has a line in the generator's MEASURED (a measurement, or why none is needed)."""
    gen = load_script('scripts/gen_config_doc.py', 'gen_config_doc')
    rows = key_table()
    extras = {(s, k) for s, k, _, _, doc in rows if doc.startswith('extra:')}
    assert len(rows) - len(extras) == 97
    assert sorted(extras - set(gen.MEASURED)) == []
    assert sorted(set(gen.MEASURED) - extras) == []  # no line for a key that is gone or is Mortal's
    assert all(note.strip() for note in gen.MEASURED.values())


@pytest.mark.parametrize('table, key, why', [
    ('online', 'replay_ratio', 'measured as no gain'), ('online', 'kl_weight', 'measured as no gain'),
    ('online', 'ema_decay', 'measured as no gain'),
    ('train_play.default', 'counterfactual_persist', 'measured as no gain'),
    ('resnet', 'dropout', 'never measured to gain'), ('rotation', 'pool_size', 'never measured to gain'),
    ('schedule.temp', 'kind', 'never measured to gain'), ('schedule.lr', 'max_steps', 'never measured to gain'),
    ('online', 'probe_size', 'not a lever: the probe has 2048 positions'),
    ('guard', 'keep', 'not a lever: the newest 5 replaced state files are kept')])
def test_removed_key_is_an_error_naming_it(tmp_path, cfg, table, key, why):
    """An extra measured as no gain, or never measured to gain, was removed: a file that still sets it is refused
    with the table, the key, the file and the reason (an unknown key would only warn, and the run would silently
    differ), also when its whole table is gone ([rotation], [schedule.*])."""
    node = cfg
    for part in table.split('.'):
        node = node.setdefault(part, {})
    node[key] = 1
    msg, path = load_error(tmp_path, cfg)
    assert msg == f'[{table}] {key} in {path} was removed: {why} (docs/config.md, "Removed keys"); delete the line'
    assert key not in (SCHEMA.get(table.replace('default', '*')) or {})


def test_a_removed_table_with_other_keys_names_only_the_removed_ones(tmp_path, cfg, caplog):
    """Two removed keys of the removed [rotation] are two errors; a table that only resembles a removed one
    ([schedule.lrx]) is the unknown section it was."""
    cfg['rotation'] = {'after': 2, 'max_rank': 2.4}
    msg, path = load_error(tmp_path, cfg)
    assert msg.splitlines()[1:] == [f'  - [rotation] after in {path} was removed: never measured to gain '
                                    f'(docs/config.md, "Removed keys"); delete the line',
                                    f'  - [rotation] max_rank in {path} was removed: never measured to gain '
                                    f'(docs/config.md, "Removed keys"); delete the line']
    del cfg['rotation']
    cfg['schedule'] = {'lrx': {'kind': 'cosine'}}
    warns, path = load_warnings(tmp_path, cfg, caplog)
    assert warns == [f'unknown section [schedule] in {path}']


def test_tiny_config_fixture(tiny_config):
    config, path = tiny_config
    assert path.name == 'config.toml' and path.exists()
    assert config['control']['version'] == 3 and config['resnet']['conv_channels'] == 16
    assert config['control']['state_file'].startswith(str(path.parent))
    # Every process's sections are there and valid.
    assert validate(copy.deepcopy(config), str(path), required=ALL_PROCESSES, env={}) == []


# --- loading ------------------------------------------------------------------------------------------------------

def test_defaults_filled(tmp_path, cfg):
    c = load_config(write(tmp_path, cfg))
    assert 'token' not in c['online']['remote'] and typed(c).online.remote.token is None  # no token: left out
    assert c['online']['server']['max_frame_bytes'] == DEFAULT_MAX_FRAME_BYTES
    assert 'init' not in c['optim']['scheduler']  # accepted but not filled, as Mortal's scheduler default applies


def test_ints_widen_to_float(tmp_path, cfg):
    cfg['env']['pts'] = [90, 45, 0, -135]
    c = load_config(write(tmp_path, cfg))
    assert c['env']['pts'] == [90.0, 45.0, 0.0, -135.0] and all(isinstance(x, float) for x in c['env']['pts'])


def test_path_from_env(tmp_path, cfg):
    cfg['control']['batch_size'] = 32
    path = write(tmp_path, cfg, 'other.toml')
    assert load_config(env={'MORTAL_CFG': str(path)})['control']['batch_size'] == 32


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match='nope.toml.*not found'):
        load_config(tmp_path / 'nope.toml')


def test_toml_syntax_error_names_line(tmp_path):
    path = tmp_path / 'config.toml'
    path.write_text('[control]\nversion = 3\nbatch_size = = 4\n', encoding='utf-8')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and 'line 3' in str(info.value)


def test_server_needs_only_online(tmp_path, cfg):
    only_online = {'online': cfg['online']}
    c = load_config(write(tmp_path, only_online), required=SERVER_SECTIONS)
    assert c['online']['server']['capacity'] == 4
    msg, path = load_error(tmp_path, only_online)  # default: the core sections
    assert f'missing section [control] in {path}' in msg


# --- errors: each names the key and the file ----------------------------------------------------------------------

def _set(where, key, value):
    """An edit of the config dict: ``[where] key = value`` (``where`` dotted)."""
    def edit(cfg):
        node = cfg
        for part in where.split('.'):
            node = node[part]
        node[key] = value
    return edit


BAD_CONFIGS = {  # id: (edit of the tiny config dict, what the error says; {path} is the file)
    'missing-core-section': (lambda c: c.pop('resnet'), 'missing section [resnet] in {path}'),
    'missing-key': (lambda c: c['control'].pop('batch_size'), 'missing key [control] batch_size in {path}'),
    # not required by this process, but present: checked strictly
    'missing-key-in-optional-section': (lambda c: c['grp']['control'].pop('val_steps'),
                                        '[grp.control] val_steps in {path}'),
    'ill-typed-int-as-str': (_set('control', 'batch_size', '32'), '[control] batch_size in {path} must be'),
    'ill-typed-int-as-float': (_set('control', 'batch_size', 32.0), '[control] batch_size in {path} must be'),
    'ill-typed-bool-as-int': (_set('control', 'online', 1), '[control] online in {path} must be'),
    'ill-typed-int-as-bool': (_set('resnet', 'num_blocks', True), '[resnet] num_blocks in {path} must be'),
    'ill-typed-str-as-int': (_set('control', 'device', 0), '[control] device in {path} must be'),
    'ill-typed-float-as-str': (_set('env', 'gamma', 'one'), '[env] gamma in {path} must be'),
    'ill-typed-list-as-str': (_set('dataset', 'globs', 'a/*.json.gz'), '[dataset] globs in {path} must be'),
    'list-length': (_set('env', 'pts', [6.0, 4.0, 2.0]), '[env] pts in {path} must have exactly 4 elements'),
    'save_every-multiple-of-opt_step_every': (
        lambda c: c['control'].update(save_every=4, opt_step_every=3),
        '[control] save_every = 4 in {path} must be a multiple of [control] opt_step_every = 3'),
    'test_every-multiple-of-save_every': (
        lambda c: c['control'].update(save_every=4, test_every=10),
        '[control] test_every = 10 in {path} must be a multiple of [control] save_every = 4'),
    'train-games-6': (_set('train_play.default', 'games', 6), '[train_play.default] games in {path} must be'),
    'test-games-10': (_set('test_play', 'games', 10), '[test_play] games in {path} must be'),
    'train-games-0': (_set('train_play.default', 'games', 0), '[train_play.default] games in {path} must be'),
    '1v3-games-2': (_set('1v3', 'games_per_iter', 2), '[1v3] games_per_iter in {path} must be'),
    'top_p-0': (_set('train_play.default', 'top_p', 0.0), '[train_play.default] top_p in {path} must be within (0, 1]'),
    'top_p-negative': (_set('train_play.default', 'top_p', -0.5),
                       '[train_play.default] top_p in {path} must be within (0, 1]'),
    'top_p-above-1': (_set('train_play.default', 'top_p', 1.01),
                      '[train_play.default] top_p in {path} must be within (0, 1]'),
    'temperature-negative': (_set('train_play.default', 'boltzmann_temp', -0.05),
                             '[train_play.default] boltzmann_temp in {path} must be > 0'),
    'temperature-0': (_set('train_play.default', 'boltzmann_temp', 0.0),
                      '[train_play.default] boltzmann_temp in {path} must be > 0'),
    'epsilon-negative': (_set('train_play.default', 'boltzmann_epsilon', -0.1),
                         '[train_play.default] boltzmann_epsilon in {path} must be within [0, 1]'),
    'epsilon-above-1': (_set('train_play.default', 'boltzmann_epsilon', 1.5),
                        '[train_play.default] boltzmann_epsilon in {path} must be within [0, 1]'),
    'version-range': (_set('control', 'version', 5), '[control] version in {path} must be 1, 2, 3 or 4'),
}


@pytest.mark.parametrize('edit, expected', list(BAD_CONFIGS.values()), ids=list(BAD_CONFIGS))
def test_bad_config_names_the_key_and_the_file(tmp_path, cfg, edit, expected):
    edit(cfg)
    msg, path = load_error(tmp_path, cfg)
    assert expected.format(path=path) in msg


def test_bootstrap_games_must_be_whole_deals_while_bots_differ(tmp_path, cfg):
    # epsilon > 0: every deal is played in 4 rotations, so games = 10 would silently become 12
    cfg['bootstrap'] = dict(games=10, val_games=6, log_dir=str(tmp_path / 'l'), work_dir=str(tmp_path / 'w'),
                            grp_steps=8)
    msg, path = load_error(tmp_path, cfg)
    assert (f'[bootstrap] games = 10 in {path} must be a multiple of 4 while [bootstrap] epsilon > 0 (each deal is '
            f'played in its 4 seat rotations: 10 would play 12)') in msg
    assert f'[bootstrap] val_games = 6 in {path} must be a multiple of 4' in msg
    cfg['bootstrap'].update(epsilon=0.0)  # identical bots: one game a deal, any count
    assert load_config(write(tmp_path, cfg))['bootstrap']['games'] == 10


def test_train_play_profile_missing(tmp_path, cfg):
    env = {'TRAIN_PLAY_PROFILE': 'fast'}
    msg, path = load_error(tmp_path, cfg, required=CLIENT_SECTIONS, env=env)
    assert f'missing section [train_play.fast] in {path}' in msg and 'TRAIN_PLAY_PROFILE' in msg
    # The trainer does not play train games: the same file is fine for it.
    load_config(path, required=ONLINE_TRAIN_SECTIONS, env=env)


def test_train_play_profile_accessor(tmp_path, cfg):
    cfg['train_play']['fast'] = dict(cfg['train_play']['default'], games=8)
    c = load_config(write(tmp_path, cfg), required=CLIENT_SECTIONS, env={'TRAIN_PLAY_PROFILE': 'fast'})
    assert train_play_profile(c, env={'TRAIN_PLAY_PROFILE': 'fast'}).games == 8
    assert train_play_profile(c, env={}).games == 4
    with pytest.raises(ConfigError, match=r'\[train_play.slow\] in c.toml'):
        train_play_profile(c, env={'TRAIN_PLAY_PROFILE': 'slow'}, path='c.toml')


def test_a_profile_named_with_a_dot_is_selected_by_its_name(tmp_path, cfg, caplog):
    # [train_play."a.b"] is the profile 'a.b' (TOML's quoted key); selecting it looked up train_play -> a -> b
    from mortal.config import section
    from mortal.tools.doctor import estimate_memory, typo_checks
    path = write(tmp_path, cfg)
    path.write_text(path.read_text(encoding='utf-8') + '\n[train_play."a.b"]\ngames = 12\nlog_dir = "ab"\n'
                    'boltzmann_epsilon = 0.25\nboltzmann_temp = 0.5\ntop_p = 0.9\nrepeats = 3\n'
                    'speculate_passes = true\n', encoding='utf-8')
    env = {'TRAIN_PLAY_PROFILE': 'a.b'}
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        c = load_config(path, required=CLIENT_SECTIONS, env=env)
    warns = [r.getMessage() for r in caplog.records if r.name == 'mortal.config']
    # no 'unknown section [train_play."a.b"]': the profile is checked and used (capacity 4 < its 12 games)
    assert warns == [f'[online.server] capacity = 4 in {path} is smaller than one client round of '
                     f'[train_play."a.b"] games = 12: every submission overflows the buffer, so clients would be '
                     f'refused ("samples overflow") forever']
    assert train_play_profile(c, env=env).model_dump() == {'games': 12, 'log_dir': 'ab', 'boltzmann_epsilon': 0.25,
                                              'boltzmann_temp': 0.5, 'top_p': 0.9, 'repeats': 3,
                                              'speculate_passes': True, 'counterfactual_rate': 0.0,
        'counterfactual_alternative': 'best'}
    assert train_play_profile(c, env={}).games == 4
    assert section(c, 'train_play."a.b"').repeats == 3
    from mortal.config import profile_table  # the name that section and lookup read back
    assert profile_table('a.b') == 'train_play."a.b"' and profile_table('default') == 'train_play.default'
    assert estimate_memory(c, 'a.b')['client'] != estimate_memory(c, 'default')['client']  # 12 games, not 4
    # a profile 'a' holding a table 'b' is another table, which the file lacks
    nested = write(tmp_path, {**cfg, 'train_play': {'a': {'b': cfg['train_play']['default']}}}, name='nested.toml')
    with pytest.raises(ConfigError) as info:
        load_config(nested, required=CLIENT_SECTIONS, env=env)
    assert f'missing section [train_play."a.b"] in {nested} (selected by TRAIN_PLAY_PROFILE=\'a.b\')' \
        in info.value.problems
    # its keys are checked and named as the file spells the table
    path.write_text(path.read_text(encoding='utf-8').replace('games = 12', 'games = 10').replace(
        'repeats = 3', 'repeets = 3'), encoding='utf-8')
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env)
    assert info.value.problems == [
        f'[train_play."a.b"] games in {path} must be a multiple of 4 (one duplicate set is 4 games with rotated '
        f'seats), got 10',
        f"missing key [train_play.\"a.b\"] repeats in {path} (int: rounds played on the same seeds before moving "
        f"on); the table has 'repeets': a typo of it?"]
    raw = toml.loads(path.read_text(encoding='utf-8'))
    rows, _ = typo_checks(raw, str(path))
    assert [r.detail for r in rows] == [
        "[train_play.\"a.b\"] repeets is not a key: did you mean 'repeats'? As written, the processes ignore it and "
        "find no repeats (a required key)"]


def test_non_string_keys_of_a_dict_are_named(cfg):
    # a dict built in Python (TOML keys are strings): the error path raised IndexError for a top-level one
    with pytest.raises(ConfigError) as info:
        validate({1: {}}, 'x.toml', required=())
    assert info.value.problems == ['top-level key 1 in x.toml must be a string, got int']
    cfg[('a', 'b')] = 3
    cfg['control'][2] = 'x'  # was '[control] in x.toml must be a table'
    cfg['train_play'][None] = dict(cfg['train_play']['default'])
    with pytest.raises(ConfigError) as info:
        validate(cfg, 'x.toml')
    assert sorted(info.value.problems) == ['[control] key 2 in x.toml must be a string, got int',
                                           '[train_play] key None in x.toml must be a string, got NoneType',
                                           "top-level key ('a', 'b') in x.toml must be a string, got tuple"]


def test_top_p_one_is_valid(tmp_path, cfg):
    cfg['train_play']['default']['top_p'] = 1
    assert load_config(write(tmp_path, cfg))['train_play']['default']['top_p'] == 1.0


def test_scheduler_invariants(tmp_path, cfg):
    cfg['optim']['scheduler'].update(peak=1e-5, final=1e-4)
    msg, path = load_error(tmp_path, cfg)
    assert f'[optim.scheduler] final = 0.0001 in {path}' in msg
    cfg['optim']['scheduler'].update(final=1e-5, warm_up_steps=100, max_steps=50)
    msg, path = load_error(tmp_path, cfg)
    assert f'[optim.scheduler] max_steps = 50 in {path}' in msg


def test_negative_scheduler_offset_is_refused(tmp_path, cfg):
    # a negative offset starts the warm-up below 0: peak * (offset / warm_up_steps) < 0 is a negative learning rate
    cfg['optim']['scheduler'].update(offset=-500)
    msg, path = load_error(tmp_path, cfg)
    assert f'[optim.scheduler] offset = -500 in {path} must be >= 0' in msg


@pytest.mark.parametrize('table, key', [('control', 'best_state_file'), ('baseline.train', 'state_file'),
                                        ('baseline.test', 'state_file')])
def test_a_file_the_learner_overwrites_cannot_be_another_role(tmp_path, cfg, table, key):
    _set(table, key, cfg['control']['state_file'])(cfg)
    msg, path = load_error(tmp_path, cfg)
    assert (f"[{table}] {key} = {cfg['control']['state_file']!r} in {path} is the same file as [control] state_file: "
            f"each save would overwrite it") in msg


def test_bootstrap_grp_steps_must_be_whole_saves(tmp_path, cfg):
    # the GRP is saved every [grp.control] save_every steps: 1,500 of 2,000 would train and save nothing
    cfg['bootstrap'] = dict(games=8, val_games=4, log_dir=str(tmp_path / 'l'), work_dir=str(tmp_path / 'w'),
                            grp_steps=cfg['grp']['control']['save_every'] * 3 + 1)
    msg, path = load_error(tmp_path, cfg)
    n, every = cfg['bootstrap']['grp_steps'], cfg['grp']['control']['save_every']
    assert (f'[bootstrap] grp_steps = {n} in {path} must be a positive multiple of [grp.control] save_every = {every} '
            f'(the GRP is saved only then)') in msg


def test_keys_straight_under_train_play_name_the_profile_table(tmp_path, cfg):
    cfg['train_play'] = {'games': 4, 'log_dir': 'x'}  # [train_play] instead of [train_play.default]
    msg, path = load_error(tmp_path, cfg)
    assert (f'[train_play] in {path} holds profiles, not keys: put games, log_dir under [train_play.default] (or '
            f'another [train_play.<profile>], which TRAIN_PLAY_PROFILE picks)') in msg
    assert 'must be a table' not in msg


def test_token_required_beyond_loopback(tmp_path, cfg):
    cfg['online']['remote']['host'] = '0.0.0.0'
    msg, path = load_error(tmp_path, cfg, required=SERVER_SECTIONS)
    assert f'[online.remote] token in {path} is required' in msg
    cfg['online']['remote']['token'] = 's3cret-token'
    c = load_config(write(tmp_path, cfg), required=SERVER_SECTIONS)
    assert c['online']['remote']['token'] == 's3cret-token'
    public = for_checkpoint(c)
    assert 'token' not in public['online']['remote'] and c['online']['remote']['token'] == 's3cret-token'


@pytest.mark.parametrize('host', ['127.0.0.1', 'localhost', '::1', '127.0.0.2'])
def test_loopback_needs_no_token(tmp_path, cfg, host):
    cfg['online']['remote']['host'] = host
    load_config(write(tmp_path, cfg))


def test_all_errors_reported_together(tmp_path, cfg):
    cfg['control']['batch_size'] = 'big'
    del cfg['resnet']['num_blocks']
    cfg['train_play']['default']['top_p'] = 2.0
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, cfg))
    assert len(info.value.problems) == 3
    assert '3 problems in' in str(info.value)


# --- warnings -----------------------------------------------------------------------------------------------------

def test_unknown_key_warning(tmp_path, cfg, caplog):
    cfg['control']['verison'] = 4
    cfg['online']['server']['capacty'] = 10
    cfg['test_play']['fresh_deal'] = True
    cfg['control']['my_note'] = 'x'
    warns, path = load_warnings(tmp_path, cfg, caplog)
    assert f"unknown key [control] verison in {path} (did you mean 'version'?)" in warns
    assert f"unknown key [online.server] capacty in {path} (did you mean 'capacity'?)" in warns
    assert f"unknown key [test_play] fresh_deal in {path} (did you mean 'fresh_deals'?)" in warns
    assert f'unknown key [control] my_note in {path}' in warns  # nothing close: no suggestion


def test_a_missing_key_names_the_unknown_key_it_resembles(tmp_path, cfg):
    cfg['control']['batch_sise'] = cfg['control'].pop('batch_size')
    cfg['train_play']['default']['my_top_p'] = cfg['train_play']['default'].pop('top_p')  # not close enough
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, cfg))
    problems = info.value.problems
    assert [p for p in problems if 'batch_size' in p] == [
        f"missing key [control] batch_size in {tmp_path / 'config.toml'} (int: samples per backward pass); the table "
        f"has 'batch_sise': a typo of it?"]
    assert [p for p in problems if 'top_p' in p][0].endswith("nucleus (top-p) cut applied before sampling)")


def test_unknown_names_are_listed_with_their_closest_key(cfg):
    from mortal.config import Unknown, unknown_names
    cfg['train_play']['default']['boltzman_temp'] = 0.1
    cfg['contrl'] = {'version': 3}
    cfg['guard'] = {'rollback_afterr': 2}
    assert unknown_names(cfg) == [
        Unknown('train_play.default', 'boltzman_temp', False, 'boltzmann_temp'),
        Unknown('', 'contrl', True, None),
        Unknown('guard', 'rollback_afterr', False, 'rollback_after'),
    ]


def test_a_quoted_dotted_table_is_unknown_not_the_table_it_spells(tmp_path, cfg, caplog):
    # ["online.server"] is a top-level table named 'online.server', which no process reads; [online.server] is another
    path = tmp_path / 'config.toml'
    path.write_text(toml.dumps(cfg) + '\n["online.server"]\ncapacity = 8\n', encoding='utf-8')
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        config = load_config(path)
    warns = [r.getMessage() for r in caplog.records if r.name == 'mortal.config']
    assert config['online']['server']['capacity'] == cfg['online']['server']['capacity'] != 8
    assert config['online.server'] == {'capacity': 8}
    assert warns == [f'unknown section ["online.server"] in {path}']


def test_unknown_names_of_a_dict_with_keys_that_are_not_strings(cfg):
    from mortal.config import Unknown, unknown_names
    cfg['test_play'][1] = True  # a dict built in Python (TOML keys are strings): no suggestion, no TypeError
    cfg['control'][('a', 'b')] = {'x': 1}
    assert unknown_names(cfg) == [Unknown('control', ('a', 'b'), True, None), Unknown('test_play', 1, False, None)]


def test_unknown_section_warning(tmp_path, cfg, caplog):
    cfg['contrl'] = {'version': 3}
    cfg['train_play']['default']['extra'] = {'x': 1}
    warns, path = load_warnings(tmp_path, cfg, caplog)
    assert f'unknown section [contrl] in {path}' in warns
    assert f'unknown section [train_play.default.extra] in {path}' in warns


@pytest.mark.parametrize('changes, fragments', [
    pytest.param({'train_play.default': {'games': 8}, 'online.server': {'capacity': 4}},
                 ['[online.server] capacity = 4 in {path}', '[train_play.default] games = 8', 'refused'],
                 id='capacity-below-one-round'),
    pytest.param({'online.server': {'force_sequential': True, 'capacity': 12}},
                 ['force_sequential = true with capacity = 12 in {path}', 'wait forever', 'at least 3 clients'],
                 id='force_sequential-capacity-above-one-round'),
])
def test_one_warning_names_the_keys(tmp_path, caplog, changes, fragments):
    warns, path = load_warnings(tmp_path, tiny_config_dict(tmp_path, **changes), caplog)
    assert len(warns) == 1
    for fragment in fragments:
        assert fragment.format(path=path) in warns[0]


def test_force_sequential_capacity_equal_round_is_quiet(tmp_path, cfg, caplog):
    cfg['online']['server'].update(force_sequential=True, capacity=4)
    warns, _ = load_warnings(tmp_path, cfg, caplog)
    assert warns == []


@pytest.mark.parametrize('key', ['sample_reuse_rate', 'sample_reuse_threshold'])
def test_sample_reuse_warns(tmp_path, cfg, caplog, key):
    cfg['online']['server'][key] = 0.5
    warns, path = load_warnings(tmp_path, cfg, caplog)
    assert warns == [f'[online.server] {key} = 0.5 in {path} is accepted but has no effect (as in Mortal)']


def test_validate_returns_warnings(cfg):
    cfg['online']['server']['sample_reuse_rate'] = 1
    assert validate(cfg, 'x.toml') == ['[online.server] sample_reuse_rate = 1.0 in x.toml is accepted but has no '
                                       'effect (as in Mortal)']


def test_validate_twice_is_idempotent(tmp_path, cfg):
    c = load_config(write(tmp_path, cfg))
    again = copy.deepcopy(c)
    assert validate(again, 'x.toml') == [] and again == c
    # A loaded config written back out loads the same (the None token is simply left out).
    assert load_config(write(tmp_path, c, 'again.toml')) == c



def test_1v3_rulebase_side_needs_no_model_keys(tmp_path):
    path = tmp_path / 'c.toml'
    path.write_text("""
[control]
version = 3
[resnet]
conv_channels = 16
num_blocks = 1
[env]
gamma = 1
pts = [6.0, 4.0, 2.0, 0.0]
[1v3]
games_per_iter = 4
iters = 1
log_dir = 'x'
[1v3.challenger]
type = 'rulebase'
name = 'rulebase'
[1v3.champion]
type = 'bogus'
name = 'champ'
""")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    msg = str(e.value)
    assert "[1v3.champion] type" in msg and "'rulebase'" in msg
    assert '[1v3.champion] state_file' in msg  # a model side still needs its checkpoint
    assert '[1v3.challenger]' not in msg


def test_offline_mix_offline_warns(tmp_path, cfg, caplog):
    cfg['control']['online'] = False
    cfg['online']['offline_batch_size'] = 64
    warns, path = load_warnings(tmp_path, cfg, caplog)
    assert warns == [f'[online] offline_batch_size = 64 in {path} has no effect with [control] online = false '
                     '(offline training reads [dataset] whole)']


@pytest.mark.parametrize('value, message', [(-1, 'must be within [0, 65536]'), ((1 << 16) + 1, 'must be within [0, 65536]'),
                                            (8.0, 'must be an integer')])
def test_offline_batch_size_range(tmp_path, cfg, value, message):
    cfg['online']['offline_batch_size'] = value
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write(tmp_path, cfg))


CHANNELS_RANGE = 'must be within [16, 4096] (channel attention needs 16)'


@pytest.mark.parametrize('key, value, message', [('num_blocks', 10 ** 12, 'must be within [1, 1024]'),
                                                 ('num_blocks', 0, 'must be within [1, 1024]'),
                                                 ('conv_channels', 4097, CHANNELS_RANGE),
                                                 ('conv_channels', 8, CHANNELS_RANGE)])
def test_resnet_size_range(tmp_path, cfg, key, value, message):
    # the baseline bounds of the wire: 10^12 blocks validated, then hung the doctor building the model; 8 channels
    # validated, then failed building the channel attention (8 // 16 = 0 hidden units)
    cfg['resnet'][key] = value
    path = write(tmp_path, cfg)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f'[resnet] {key} in {path} {message}, got {value}']


def test_typed_sections_hold_the_loaded_values(tmp_path, cfg):
    from mortal.config import typed
    cfg['control']['batch_size'] = 48
    c = load_config(write(tmp_path, cfg))
    t = typed(c)
    assert t.control.batch_size == 48 and t.train_play['default'].games == 4
    assert t.one_vs_three.games_per_iter == c['1v3']['games_per_iter']
    assert t.online.remote.token is None and t.guard.rollback_after == 0
    assert t.env.pts == [6.0, 4.0, 2.0, 0.0] and t.bootstrap is None


@pytest.mark.parametrize('dotted', ['control', 'online.server', 'train_play.default', '1v3.champion'])
def test_a_section_that_is_not_a_table_is_an_error(tmp_path, cfg, dotted):
    *parents, last = dotted.split('.')
    node = cfg
    for part in parents:
        node = node[part]
    node[last] = 5
    msg, path = load_error(tmp_path, cfg, required=())
    assert f'[{dotted}] in {path} must be a table, got 5' in msg


def test_section_is_typed_on_its_own(tmp_path, cfg):
    from mortal.config import section
    c = load_config(write(tmp_path, cfg))
    server = section(c, 'online.server')
    assert server.capacity == 4 and server.max_pending_connections == 64 and server.payload_min_bytes_per_s == 131072
    assert section(c, 'train_play.default').games == 4
    # a table built by hand is typed with the schema's defaults, whatever the rest of the dict holds
    assert section({'online': {'server': {'buffer_dir': 'b', 'drain_dir': 'd', 'capacity': 8,
                                          'force_sequential': False}}}, 'online.server').max_inflight_bytes == 0
    with pytest.raises(KeyError, match=r'\[bootstrap\]'):
        section(c, 'bootstrap')


def test_checked_section_words_its_problems_as_the_loader(tmp_path, cfg):
    from mortal.config import checked_section
    c = load_config(write(tmp_path, cfg))
    assert checked_section(c, 'online.server', path='c.toml').capacity == 4
    with pytest.raises(ConfigError, match=r'missing section \[bootstrap\] in c.toml'):
        checked_section(c, 'bootstrap', path='c.toml')
    c['online']['server']['capacity'] = 0
    del c['online']['server']['drain_dir']
    with pytest.raises(ConfigError) as info:
        checked_section(c, 'online.server', path='c.toml')
    assert info.value.problems == ['missing key [online.server] drain_dir in c.toml (str: where drained logs are '
                                   'moved for the trainer (wiped at server start))',
                                   '[online.server] capacity in c.toml must be > 0, got 0']


def test_put_sets_a_key_or_a_table_in_place(tmp_path, cfg):
    from mortal.config import put, section
    c = load_config(write(tmp_path, cfg))
    server = c['online']['server']
    put(c, 'online.server.capacity', 16)
    put(c, 'train_play."a.b"', dict(c['train_play']['default'], games=12))
    put(c, 'bootstrap.games', 4)  # the tables on the way are made
    assert c['online']['server'] is server and section(c, 'online.server').capacity == 16
    assert section(c, 'train_play."a.b"').games == 12 and c['bootstrap'] == {'games': 4}


# Hostile files (s7-break): each once raised something other than ConfigError.

@pytest.mark.parametrize('section, name, value, length', [
    ('env', 'pts', [6.0, 4.0, 2.0, 0.0, 1.0], 4), ('optim', 'betas', [0.9, 0.99, 0.5], 2)])
def test_a_list_too_long_names_its_length(tmp_path, cfg, section, name, value, length):
    cfg[section][name] = value  # pydantic's too_long error carries max_length, not min_length
    message, path = load_error(tmp_path, cfg)
    assert f'[{section}] {name} in {path} must have exactly {length} elements, got {len(value)}' in message


@pytest.mark.parametrize('text', [
    'x = ' + '[' * 5000 + ']' * 5000,  # the parser recurses per level
    'x = ' + '{a = ' * 3000 + '1' + '}' * 3000,
    '[' + '.'.join(['a'] * 3000) + ']\nx = 1',  # parses, but recursing over it does not
    'x = ' + '9' * 5000,  # more digits than int() converts: ValueError, not TOMLDecodeError
], ids=['deep-arrays', 'deep-inline-tables', 'deep-tables', 'huge-integer'])
def test_pathological_toml_is_a_config_error(tmp_path, text):
    path = tmp_path / 'config.toml'
    path.write_text(text, encoding='utf-8')
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path, required=())


def test_a_loaded_config_survives_deepcopy(tmp_path, cfg):
    cfg['control']['extra'] = nested = {}
    for _ in range(30):  # deep but within MAX_DEPTH: loads with a warning, and for_checkpoint can copy it
        nested['a'] = nested = {}
    loaded = load_config(write(tmp_path, cfg), required=())
    assert for_checkpoint(loaded)['control']['extra']['a']


def test_a_nul_in_the_path_is_a_config_error():
    with pytest.raises(ConfigError, match='embedded null byte'):
        load_config('con\0fig.toml')


def test_a_huge_value_is_cut_in_the_message(tmp_path, cfg):
    cfg['control']['batch_size'] = 'x' * 100_000
    message, path = load_error(tmp_path, cfg)
    assert f'[control] batch_size in {path} must be an integer, got ' in message and len(message) < 400


def test_a_required_section_that_is_not_a_table_is_reported_once(tmp_path, cfg):
    cfg['control'] = 'x'
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, cfg))
    assert [p for p in info.value.problems if '[control]' in p] == [
        f"[control] in {tmp_path / 'config.toml'} must be a table, got 'x'"]


def test_a_blank_token_is_refused(tmp_path, cfg):
    cfg['online']['remote']['token'] = '   '
    message, path = load_error(tmp_path, cfg, required=SERVER_SECTIONS)
    assert f'[online.remote] token in {path} must not be empty or blank' in message


# --- every error at once (issue 35, case 5) -----------------------------------------------------------------------

def test_a_broken_cross_field_rule_is_listed_beside_an_error_in_another_table(tmp_path, cfg):
    """The rule test_every % save_every is checked even while [resnet] has an error of its own: both are listed,
    by the raising load and by config_errors alike."""
    from mortal.config import TRAIN_SECTIONS, config_errors
    cfg['control'].update(save_every=4, test_every=10)
    cfg['resnet']['num_blocks'] = 'two'
    msg, path = load_error(tmp_path, cfg, required=TRAIN_SECTIONS)
    rule = f'[control] test_every = 10 in {path} must be a multiple of [control] save_every = 4'
    typed_error = f'[resnet] num_blocks in {path} must be an integer'
    assert rule in msg and typed_error in msg
    errors = config_errors(path, required=TRAIN_SECTIONS, env={})
    assert len(errors) == 2 and rule in errors and any(e.startswith(typed_error) for e in errors)


def test_the_learner_lists_its_online_tables_with_every_other_error(tmp_path, cfg):
    """mortal.train online needs [online.remote]: it is listed beside an error in [control], in one refusal."""
    from mortal.config import config_errors, train_sections
    del cfg['online']['remote']
    cfg['control']['batch_size'] = -1
    path = write(tmp_path, cfg)
    errors = config_errors(path, required=train_sections, env={})
    assert f'missing section [online.remote] in {path}' in errors
    assert any(e.startswith(f'[control] batch_size in {path}') for e in errors)
    assert config_errors(write(tmp_path, tiny_config_dict(tmp_path), name='good.toml'), env={}) == []


def test_paths_may_start_at_the_config_files_folder(tmp_path):
    # issue 36: '{config_dir}' stands for the config file's folder, so a work dir can be moved or copied; other
    # strings, relative paths included (relative to the working directory, as Mortal's), stay as written
    from mortal.config import CORE_SECTIONS, typed
    import toml
    d = tiny_config_dict(tmp_path)
    d['control']['state_file'] = '{config_dir}/online/mortal.pth'
    d['control']['best_state_file'] = 'online/best.pth'
    d['dataset']['globs'] = ['{config_dir}/logs/**/*.json.gz', '/data/*.json.gz']
    folder = tmp_path / 'run'
    folder.mkdir()
    (folder / 'c.toml').write_text(toml.dumps(d))
    c = typed(load_config(folder / 'c.toml', required=CORE_SECTIONS, env={}))
    assert c.control.state_file == f'{folder}/online/mortal.pth'
    assert c.control.best_state_file == 'online/best.pth'
    assert c.dataset.globs == [f'{folder}/logs/**/*.json.gz', '/data/*.json.gz']


@pytest.mark.parametrize('value', ['²', '0', '-2', 'x', ''])
def test_a_bad_sp_threads_is_logged_and_ignored_not_a_traceback(value, caplog):
    # str.isdigit() accepts '²', which int() refuses: the start-up raised ValueError
    from mortal.config import EnvOverrides
    with caplog.at_level(logging.WARNING, logger='mortal.config'):
        assert EnvOverrides.from_env({'MORTAL_SP_THREADS': value}).sp_threads is None
    assert f'MORTAL_SP_THREADS={value!r} is not a positive integer; using the default thread count' in caplog.text
