"""Bad input found by attacking the finished modules; each test failed (crash, traceback or silent acceptance)
before its fix and asserts the intended behaviour: a clear error naming file/line/field, a skipped-and-counted
log, or a one-line CLI error with a non-zero exit status."""

import gzip
import io
import json
import logging

import pytest
import toml
import torch

from conftest import DATA_DIR
from mortal import bot as bot_mod
from mortal import one_vs_three, train_grp
from mortal.config import ConfigError, load_config
from mortal.config_schema import GrpNetwork
from mortal.data.dataloader import FileDatasetsIter
from mortal.data.gameplay import GameplayLoader
from mortal.data.grp import Grp
from mortal.data.mjai_log import BadLogError, parse_log
from mortal.model.networks import DQN, GRP, Brain
from mortal.model.checkpoint import CheckpointError as GrpCheckpointError
from mortal.data.reward import load_grp
from mortal.stat import Stat
from mortal.stat_game import LogFormatError

LOG = DATA_DIR / 'riichienv_selfplay_hanchan.jsonl'
RAW = LOG.read_text().rstrip('\n') + '\n'
EVENTS = [json.loads(line) for line in RAW.splitlines()]
N_LINES = len(EVENTS)  # 1382
FINAL_SCORES = [2400, 14900, 38800, 43900]  # the fixture's final scores (test_grp checks them against the log)


def _mutated(kind, nth, **fields):
    """RAW with fields of the nth (1-based) event of type ``kind`` replaced; returns (text, 1-based line)."""
    events = [dict(e) for e in EVENTS]
    seen = 0
    for i, ev in enumerate(events):
        if ev['type'] == kind:
            seen += 1
            if seen == nth:
                ev.update(fields)
                return ''.join(json.dumps(e) + '\n' for e in events), i + 1
    raise AssertionError(f'no {kind} #{nth}')


# ------------------------------------------------------------------------------------------------------ config

def test_config_with_utf8_bom_loads(tiny_config):
    """Notepad writes a BOM; it was a 'TOML syntax error at line 1, column 2'."""
    config, path = tiny_config
    path.write_bytes(b'\xef\xbb\xbf' + path.read_bytes())
    assert load_config(path)['control']['version'] == 3


def test_toml_parser_crash_is_a_config_error(tmp_path):
    """The toml package raised a bare IndexError on this input (a traceback from every process)."""
    path = tmp_path / 'bad.toml'
    path.write_text('T6ie={=Z\nbi7_=_]x13--8 Z5')
    with pytest.raises(ConfigError) as exc:
        load_config(path, required=())
    assert str(path) in str(exc.value) and 'TOML syntax error' in str(exc.value)


def test_out_of_range_integer_names_the_key(tiny_config):
    """A 27-digit batch_size was accepted (TOML integers are 64-bit) and would only fail inside torch."""
    config, path = tiny_config
    config['control']['batch_size'] = 999999999999999999999999999
    path.write_text(toml.dumps(config))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert exc.value.problems == [f'[control] batch_size in {path} is out of the 64-bit integer range, '
                                  f'got 999999999999999999999999999']


def test_seed_key_keeps_the_full_u64_range(tiny_config):
    config, path = tiny_config
    config['1v3']['seed_key'] = 2 ** 64 - 1
    path.write_text(toml.dumps(config))
    assert load_config(path)['1v3']['seed_key'] == 2 ** 64 - 1


# ------------------------------------------------------------------------------------------------------ logs

@pytest.mark.parametrize('kind, nth, fields, reason', [
    ('reach_accepted', 1, {'actor': 7}, "reach_accepted field 'actor' must be a seat 0-3, got 7"),  # IndexError
    ('reach_accepted', 1, {'actor': -1}, "reach_accepted field 'actor' must be a seat 0-3, got -1"),  # silent
    ('reach_accepted', 1, {'actor': '0'}, "reach_accepted field 'actor' must be a seat 0-3, got '0'"),  # TypeError
    ('dahai', 1, {'actor': True}, "dahai field 'actor' must be a seat 0-3, got True"),
    ('start_kyoku', 2, {'scores': ['25000'] * 4}, 'start_kyoku field \'scores\' must be 4 integers'),  # TypeError
    ('start_kyoku', 2, {'kyoku': '1'}, "start_kyoku field 'kyoku' must be 1-4, got '1'"),  # TypeError
    ('start_kyoku', 2, {'bakaze': 'X'}, "start_kyoku field 'bakaze' must be E, S, W or N, got 'X'"),  # silent
    ('start_kyoku', 2, {'honba': -1}, "start_kyoku field 'honba' must be an integer >= 0, got -1"),  # silent
    ('hora', 1, {'deltas': [True, False, 0, 0]}, "hora lacks field 'deltas' (4 integers within ±1,000,000)"),
    # a hostile trial's deltas of 10**9 trained as kyoku rewards of ±2e5 without a word
    ('hora', 1, {'deltas': [10 ** 9, -10 ** 9, 0, 0]}, "hora lacks field 'deltas' (4 integers within ±1,000,000)"),
    ('start_kyoku', 2, {'scores': [10 ** 300, 0, 0, 0]}, "start_kyoku field 'scores' must be 4 integers within "
                                                         "±1,000,000, got [1000000000"),
])
def test_grp_reader_rejects_ill_typed_fields(tmp_path, kind, nth, fields, reason):
    """The GRP trainer reads logs without PlayerState: these crashed it or silently mis-scored the game."""
    text, line = _mutated(kind, nth, **fields)
    path = tmp_path / 'bad.json'
    path.write_text(text)
    skipped = []
    good = Grp.load_gz_log_files([path, LOG], skipped)
    assert [g.final_scores.tolist() for g in good] == [FINAL_SCORES]
    assert len(skipped) == 1 and skipped[0][0] == str(path)
    assert skipped[0][1].startswith(f'skipped log {path}: line {line}: {reason}')


def test_concatenated_games_are_rejected():
    """Two games in one file were loaded as one (wrong final ranks for the first game's rewards)."""
    with pytest.raises(BadLogError) as exc:
        parse_log(RAW + RAW, 'two.json')
    assert exc.value.line == N_LINES + 1
    assert exc.value.reason == 'start_game after end_game (one game per file; two logs concatenated?)'
    with pytest.raises(LogFormatError, match=rf'two.json:{N_LINES + 1}: start_game after end_game'):
        Stat.from_log(RAW + RAW, 0, source='two.json')
    with pytest.raises(LogFormatError, match=rf'x:{N_LINES + 1}: start_kyoku after end_game'):
        Stat.from_log(RAW + RAW.splitlines()[1], 0, source='x')


def test_unpaired_end_kyoku_skips_the_file_without_stopping_the_dataset(tmp_path):
    """A doubled end_kyoku made FileDatasetsIter raise AssertionError: the trainer died."""
    first_end = RAW.index('{"type":"end_kyoku"}')
    line = RAW[:first_end].count('\n') + 2
    bad = tmp_path / 'bad.json.gz'
    bad.write_bytes(gzip.compress(RAW.replace('{"type":"end_kyoku"}', '{"type":"end_kyoku"}\n' * 2, 1).encode()))
    torch.manual_seed(0)
    ds = FileDatasetsIter(3, [str(bad), str(LOG)], [6.0, 4.0, 2.0, 0.0], GRP(), file_batch_size=1,
                          player_names=['0'])
    assert sum(1 for _ in ds) == 212  # seat '0' of the good file (test_dataloader's N_RIICHIENV[0])
    assert ds.skipped == 1
    assert ds.loader.skipped_files == [(str(bad), f'skipped log {bad}: line {line}: end_kyoku without a '
                                                  f'start_kyoku')]


def test_line_separator_inside_a_name_is_not_a_line_break(tmp_path):
    """str.splitlines() split a JSON string holding U+2028 (valid JSON) and the whole log was rejected."""
    raw = RAW.replace('"names":["0","1","2","3"]', '"names":["a\u2028b","1","2","3"]', 1)
    assert '\u2028' in raw
    assert parse_log(raw).events[0]['names'][0] == 'a\u2028b'
    assert Grp.load_log(raw).final_scores.tolist() == FINAL_SCORES
    path = tmp_path / 'x.json'
    path.write_text(raw, encoding='utf-8')
    assert Stat.from_file(path, 'a\u2028b').game == 1


def test_bad_tile_name_names_the_line():
    """'10m' surfaced as a bare ValueError without file or line."""
    text, line = _mutated('dahai', 1, pai='10m')
    with pytest.raises(BadLogError) as exc:
        GameplayLoader(3, player_names=['0']).load_log(text, 'x.json')
    assert exc.value.line == line == 4
    assert exc.value.reason == "dahai cannot be labelled for seat 0: ValueError: not an mjai tile name: '10m'"


def test_deeply_nested_json_is_a_bad_log():
    deep = '[' * 100000 + ']' * 100000
    with pytest.raises(BadLogError, match='x.json: line 2: JSON nested too deeply'):
        parse_log(RAW.splitlines()[0] + '\n' + deep, 'x.json')
    with pytest.raises(LogFormatError, match='x.json:1: JSON nested too deeply'):
        Stat.from_log(deep, 0, source='x.json')


def test_stat_from_dir_skips_corrupt_gzip_and_deep_json(tmp_path, caplog):
    """A corrupt deflate stream (zlib.error) and a RecursionError ended Stat.from_dir."""
    packed = gzip.compress(RAW.encode())
    (tmp_path / 'corrupt.json.gz').write_bytes(packed[:500] + bytes(b ^ 0x55 for b in packed[500:520])
                                               + packed[520:])
    (tmp_path / 'deep.json').write_text('[' * 100000 + ']' * 100000)
    (tmp_path / 'good.json').write_text(RAW)
    skipped = []
    with caplog.at_level(logging.WARNING, logger='mortal.stat'):
        stat = Stat.from_dir(tmp_path, '2', skipped=skipped)
    assert stat.game == 1 and stat.rank_2 == 1  # seat 2 finished 38800, second
    assert sorted(skipped) == [str(tmp_path / 'corrupt.json.gz'), str(tmp_path / 'deep.json')]
    assert 'skipped 2 of 3 log files' in caplog.text


# ------------------------------------------------------------------------------------------------------ CLIs

@pytest.fixture
def bot_config(tiny_config):
    config, path = tiny_config
    torch.manual_seed(0)
    torch.save({'mortal': Brain(conv_channels=16, num_blocks=1, version=3).state_dict(),
                'current_dqn': DQN(version=3).state_dict(), 'config': config, 'timestamp': 0},
               config['control']['state_file'])
    return config, path


def _rewrite(path, config, section, key, value):
    config[section][key] = value
    path.write_text(toml.dumps(config))


def _bot(path, capsys):
    out = io.StringIO()
    rc = bot_mod.main(['--config', str(path), '0'], stdin=io.StringIO(RAW.splitlines()[0] + '\n'), stdout=out)
    err = capsys.readouterr().err.strip()
    return rc, err, out.getvalue()


def test_bot_missing_checkpoint_is_one_line(bot_config, capsys, monkeypatch):
    monkeypatch.delenv(bot_mod.REVIEW_ENV, raising=False)
    config, path = bot_config
    missing = str(path.parent / 'missing.pth')
    _rewrite(path, config, 'control', 'state_file', missing)
    rc, err, out = _bot(path, capsys)
    assert (rc, out) == (2, '')
    assert err == (f"error: cannot load [control] state_file {missing}: FileNotFoundError: [Errno 2] "
                   f"No such file or directory: '{missing}'")


def test_bot_garbage_checkpoint_is_one_line(bot_config, capsys, monkeypatch):
    monkeypatch.delenv(bot_mod.REVIEW_ENV, raising=False)
    config, path = bot_config
    garbage = path.parent / 'garbage.pth'
    garbage.write_bytes(b'\x80\x02' + b'\x9d' * 200)  # a pickle protocol header and an unknown opcode
    _rewrite(path, config, 'control', 'state_file', str(garbage))
    rc, err, _ = _bot(path, capsys)
    assert rc == 2 and '\n' not in err
    assert err.startswith(f'error: cannot load [control] state_file {garbage}: not a weights-only torch checkpoint')


def test_bot_wrong_shapes_name_both_shapes(bot_config, capsys, monkeypatch):
    monkeypatch.delenv(bot_mod.REVIEW_ENV, raising=False)
    config, path = bot_config
    torch.save({'mortal': Brain(conv_channels=32, num_blocks=1, version=3).state_dict(),
                'current_dqn': DQN(version=3).state_dict(), 'config': config, 'timestamp': 0},
               config['control']['state_file'])
    rc, err, _ = _bot(path, capsys)
    assert rc == 2 and '\n' not in err
    assert 'conv_channels 16' in err
    assert 'copying a param with shape torch.Size([32, 32, 3]) from checkpoint, the shape in current model is ' \
           'torch.Size([32, 16, 3])' in err


def test_bot_review_mode_checks_the_grp_before_playing(bot_config, capsys, monkeypatch):
    """The missing GRP file raised a traceback only after the whole game had been played."""
    monkeypatch.setenv(bot_mod.REVIEW_ENV, '1')
    config, path = bot_config
    rc, err, out = _bot(path, capsys)
    grp_file = config['grp']['state_file']
    assert (rc, out) == (2, '')
    assert err == (f"error: cannot load [grp] state_file {grp_file}: FileNotFoundError: [Errno 2] "
                   f"No such file or directory: '{grp_file}'")


def test_one_vs_three_missing_checkpoint_is_one_line(tiny_config, capsys):
    config, path = tiny_config
    rc = one_vs_three.main(['--config', str(path), '--no-progress'])
    err = capsys.readouterr().err.strip().splitlines()
    missing = config['1v3']['challenger']['state_file']
    assert rc == 2
    assert err[-1] == (f"error: cannot load [1v3.challenger] state_file {missing}: FileNotFoundError: [Errno 2] "
                       f"No such file or directory: '{missing}'")
    assert not any(line.startswith('Traceback') for line in err)


def _grp_main(path, capsys):
    rc = train_grp.main(['--config', str(path), '--max-steps', '4'])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_train_grp_missing_config_is_one_line(tmp_path, capsys):
    rc, err = _grp_main(tmp_path / 'nope.toml', capsys)
    assert (rc, err) == (2, [f'error: config file {tmp_path / "nope.toml"} not found (set MORTAL_CFG or pass '
                             f'the path)'])


def test_train_grp_empty_globs_is_one_line_and_caches_nothing(tiny_config, capsys):
    """Empty globs raised a traceback, and the empty list was cached in file_index, hiding logs added later."""
    config, path = tiny_config
    rc, err = _grp_main(path, capsys)
    assert rc == 2
    assert err[-1] == ('error: [grp.dataset] globs listed 0 train and 0 val files; both need at least one log')
    index = config['grp']['dataset']['file_index']
    assert not (path.parent / index).exists()


def test_train_grp_unusable_files_are_one_line(tiny_config, capsys):
    config, path = tiny_config
    index = path.parent / 'grp_file_index.pth'
    index.write_text('not torch')
    config['grp']['dataset']['file_index'] = str(index)
    path.write_text(toml.dumps(config))
    rc, err = _grp_main(path, capsys)
    assert (rc, err[-1]) == (2, f'error: [grp.dataset] file_index {index} is not a file index (not a weights-only '
                                f'torch file); delete it to rebuild it from the globs')

    torch.save({'model': GRP(hidden_size=32).state_dict(), 'optimizer': {}, 'steps': 0, 'timestamp': 0.0},
               config['grp']['state_file'])
    rc, err = _grp_main(path, capsys)
    assert rc == 2 and err[-1].startswith(f"error: [grp] state_file {config['grp']['state_file']} cannot be "
                                          f"resumed from (RuntimeError: Error(s) in loading state_dict for GRP:")
    assert 'torch.Size([96, 7]) from checkpoint, the shape in current model is torch.Size([192, 7])' in err[-1]


def test_train_grp_no_usable_log_from_a_worker_is_one_line(monkeypatch, tiny_config, capsys):
    """A worker's NoSamplesError arrives as torch's multi-line report; only its last line is printed."""
    config, path = tiny_config

    def fail(*args, **kwargs):
        raise train_grp.NoSamplesError('Caught NoSamplesError in DataLoader worker process 0.\nOriginal Traceback '
                                       '(most recent call last):\n  ...\nmortal.train_grp.NoSamplesError: no GRP '
                                       'samples in 1 log files (1 skipped as bad input)\n')

    monkeypatch.setattr(train_grp, 'train', fail)
    rc, err = _grp_main(path, capsys)
    assert (rc, err) == (2, ['error: no GRP samples in 1 log files (1 skipped as bad input)'])


def test_load_grp_wrong_shapes_names_file_and_network(tmp_path):
    path = tmp_path / 'grp.pth'
    torch.save({'model': GRP(hidden_size=32).state_dict()}, path)
    with pytest.raises(GrpCheckpointError) as exc:
        load_grp(path, GrpNetwork(hidden_size=64, num_layers=2))
    text = str(exc.value)
    assert text.startswith(f"{path}: GRP weights do not fit [grp.network] {{'hidden_size': 64, 'num_layers': 2}}")
    assert 'torch.Size([96, 7]) from checkpoint, the shape in current model is torch.Size([192, 7])' in text
    torch.save({'optimizer': {}}, path)
    with pytest.raises(GrpCheckpointError, match="GRP checkpoint has no 'model' entry"):
        load_grp(path)


def test_one_vs_three_log_dir_that_is_a_file_is_one_line(tiny_config, capsys):
    config, path = tiny_config
    log_dir = path.parent / 'a_file'
    log_dir.write_text('')
    config['1v3']['log_dir'] = str(log_dir)
    path.write_text(toml.dumps(config))
    assert one_vs_three.main(['--config', str(path), '--no-progress']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: [1v3] log_dir {log_dir} cannot be created: [Errno 17] File exists: '{log_dir}'"


def test_more_kyoku_than_uint8_can_number_is_rejected():
    """at_kyoku is uint8: kyoku 257 would be numbered 0 and get kyoku 1's reward."""
    start = json.dumps({'type': 'start_kyoku', 'bakaze': 'E', 'dora_marker': '1m', 'kyoku': 1, 'honba': 0,
                        'kyotaku': 0, 'oya': 0, 'scores': [25000] * 4, 'tehais': [['?'] * 13] * 4})
    kyoku = [start, '{"type":"ryukyoku","deltas":[0,0,0,0]}', '{"type":"end_kyoku"}']
    head, tail = '{"type":"start_game"}', '{"type":"end_game"}'
    assert len(Grp.load_log('\n'.join([head] + kyoku * 256 + [tail]))) == 256
    with pytest.raises(BadLogError) as exc:
        parse_log('\n'.join([head] + kyoku * 257 + [tail]))
    assert (exc.value.line, exc.value.reason) == (2 + 3 * 256, 'more than 256 kyoku in one game')


@pytest.mark.filterwarnings('ignore:.*found in sys.modules:RuntimeWarning')  # runpy re-running a loaded module
@pytest.mark.parametrize('module', ['mortal.train_grp', 'mortal.one_vs_three', 'mortal.bot', 'mortal.stat'])
def test_entry_point_logs_under_its_module_name_when_run_as_main(module):
    # `python -m mortal.train_grp` runs the module as __main__ (spawned workers see __mp_main__):
    # getLogger(__name__) would log as "__main__" instead of "mortal.train_grp".
    import runpy
    namespace = runpy.run_module(module, run_name='__mp_main__')
    assert namespace['__name__'] == '__mp_main__'
    assert namespace['logger'].name == module


@pytest.mark.parametrize('flag', ['-c', '--config'])
def test_bot_and_one_vs_three_take_short_config_flag(tmp_path, capsys, flag):
    # as server/train/client: -c is --config (an unknown flag would be an argparse SystemExit)
    missing = tmp_path / 'nope.toml'
    assert bot_mod.main([flag, str(missing), '0'], stdin=io.StringIO(), stdout=io.StringIO()) == 2
    assert one_vs_three.main([flag, str(missing), '--no-progress']) == 2
    assert capsys.readouterr().err.count(f'config file {missing} not found') == 2
