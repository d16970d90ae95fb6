"""mortal.model.checkpoint and the atomic writes of mortal.util.fsutil: errors name the file on one line,
writes are all or nothing, one state-dict comparison behind the client's, the trainer's and the doctor's
wording."""

import os

import pytest
import torch

from mortal.model.checkpoint import (CheckpointError, atomic_torch_save, check_fits_config, check_loadable,
                                     describe_mismatches, load_checkpoint, load_errors, load_model_pair,
                                     read_baseline, require_entries, state_dict_mismatches)
from mortal.util.fsutil import atomic_copy, atomic_write, atomic_write_bytes, empty_dir
from mortal.model.networks import DQN, Brain


def _mortal_checkpoint(path, *, version=3, conv_channels=16, num_blocks=1):
    torch.manual_seed(0)
    state = {'mortal': Brain(version=version, conv_channels=conv_channels, num_blocks=num_blocks).state_dict(),
             'current_dqn': DQN(version=version).state_dict(),
             'config': {'control': {'version': version},
                        'resnet': {'conv_channels': conv_channels, 'num_blocks': num_blocks}}}
    atomic_torch_save(state, path)
    return state


def test_load_checkpoint_missing_garbage_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / 'none.pth')
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(b'not a zip file')
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad)
    assert str(err.value).startswith(f'{bad}: ') and '\n' not in str(err.value) and err.value.source == str(bad)
    bad.write_bytes(b'\x80\x02' + b'\x9d' * 200)  # a pickle header and an unknown opcode
    with pytest.raises(CheckpointError, match='not a weights-only torch checkpoint'):
        load_checkpoint(bad)


def test_a_checkpoint_cut_short_says_so_at_any_length(tmp_path):
    # torch said 'OSError: [Errno 22] Invalid argument' for some cuts and 'file is corrupted' for others
    whole = tmp_path / 'whole.pth'
    torch.save({'w': torch.arange(4096, dtype=torch.float32)}, whole)
    data = whole.read_bytes()
    cut = tmp_path / 'baseline.pth'
    for n in (10, 1000, 5000, len(data) // 2, len(data) - 1):
        cut.write_bytes(data[:n])
        with pytest.raises(CheckpointError) as err:
            load_checkpoint(cut)
        assert str(err.value) == (f'{cut}: a truncated or damaged torch checkpoint ({n:,} bytes, its zip archive '
                                  f'has no end record)')
    assert torch.equal(load_checkpoint(whole)['w'], torch.arange(4096, dtype=torch.float32))


@pytest.mark.parametrize('head, what', [
    (b'version https://git-lfs.github.com/spec/v1\noid sha256:ab\n', "a Git LFS pointer, not the weights (run 'git "
                                                                      "lfs pull')"),
    (b'<!DOCTYPE html><html>', 'an HTML or XML page (a failed download?)'),
    (b'\x1f\x8b\x08\x00' + bytes(20), 'a gzip file (an mjai log?)'),
    (b'\x40\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{}}', 'a safetensors file'),
    (b'hello', "it begins b'hello'"),
    (b'', 'an empty file'),
])
def test_a_file_that_is_no_torch_checkpoint_says_what_it_is(tmp_path, head, what):
    # torch's own errors ('Unsupported operand 118', 'KeyError: 101') pointed at weights_only, not at the file
    bad = tmp_path / 'baseline.pth'
    bad.write_bytes(head)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad)
    assert str(err.value) == f'{bad}: not a torch checkpoint: {what}'


@pytest.mark.parametrize('resnet, field', [({'conv_channels': 'x', 'num_blocks': 1}, 'conv_channels'),
                                          ({'conv_channels': 4, 'num_blocks': 1}, 'conv_channels'),
                                          ({'conv_channels': 16, 'num_blocks': -1}, 'num_blocks')])
def test_a_checkpoint_config_that_builds_no_model_is_a_checkpoint_error(tmp_path, resnet, field):
    # these raised TypeError, RuntimeError or ValueError from inside torch, naming neither the file nor the entry
    path = tmp_path / 'm.pth'
    torch.save({'mortal': {}, 'current_dqn': {}, 'config': {'control': {'version': 3}, 'resnet': resnet}}, path)
    with pytest.raises(CheckpointError) as err:
        load_model_pair(path)
    low = 16 if field == 'conv_channels' else 1
    assert str(err.value).startswith(f"{path}: checkpoint config: field 'arch.{field}' must be an int within [{low}, ")
    assert str(err.value).endswith(f"got {resnet[field]!r}")


def test_require_entries_names_one_or_all_missing(tmp_path):
    assert require_entries({'a': 1, 'b': 2}, ('a',), 'f.pth') == {'a': 1, 'b': 2}
    with pytest.raises(CheckpointError, match=r"^f.pth: GRP checkpoint has no 'model' entry$"):
        require_entries({}, ('model',), 'f.pth', kind='GRP checkpoint')
    with pytest.raises(CheckpointError, match=r"^f.pth: checkpoint lacks \['mortal', 'config'\]$"):
        require_entries([1], ('mortal', 'config'), 'f.pth')


def test_load_model_pair_and_read_baseline(tmp_path):
    path = tmp_path / 'm.pth'
    state = _mortal_checkpoint(path)
    brain, dqn, version = load_model_pair(path)
    assert version == 3 and not brain.training and not dqn.training
    assert all(torch.equal(a, b) for a, b in zip(brain.state_dict().values(), state['mortal'].values()))
    mortal, dqn_sd, arch = read_baseline(path)
    assert arch == {'version': 3, 'conv_channels': 16, 'num_blocks': 1} and mortal.keys() == state['mortal'].keys()
    state['config']['resnet']['conv_channels'] = 32  # the weights no longer fit their own config
    torch.save(state, path)
    with pytest.raises(CheckpointError) as err:
        load_model_pair(path)
    assert 'weights do not match its own config (version 3, conv_channels 32' in str(err.value)
    assert '\n' not in str(err.value)


def test_load_errors_make_one_cli_line(tmp_path):
    missing = tmp_path / 'missing.pth'
    with pytest.raises(CheckpointError) as err, load_errors('[control] state_file', missing):
        load_model_pair(missing)
    assert str(err.value) == (f"cannot load [control] state_file {missing}: FileNotFoundError: [Errno 2] "
                              f"No such file or directory: '{missing}'")
    torch.save({'mortal': {}}, missing)
    with pytest.raises(CheckpointError) as err, load_errors('[x] state_file', missing):
        load_model_pair(missing)
    assert str(err.value) == f"cannot load [x] state_file {missing}: checkpoint lacks ['current_dqn', 'config']"


def test_one_comparison_three_wordings():
    dqn = DQN(version=3)
    saved = dict(dqn.state_dict())
    assert state_dict_mismatches(dqn.state_dict(), saved) == []
    check_loadable(dqn, saved, 'dqn')  # nothing to report
    first = next(iter(saved))
    saved[first] = torch.zeros(3)
    saved['extra'] = torch.zeros(2)
    kinds = [(m.kind, m.key) for m in state_dict_mismatches(dqn.state_dict(), saved)]
    assert kinds == [('shape', first), ('unexpected', 'extra')]
    with pytest.raises(CheckpointError, match=rf"^dqn: key '{first}' has shape \[3\], expected \["):
        check_loadable(dqn, saved, 'dqn')
    from mortal.config_schema import Config, Control, ResNet
    cfg = Config.model_construct(control=Control.model_construct(version=3),  # the typed config's two tables
                                 resnet=ResNet.model_construct(conv_channels=16, num_blocks=1))
    with pytest.raises(CheckpointError, match=rf'^x.pth: does not fit the configured model: current_dqn.{first} '
                                              r'has shape \(3,\) in the checkpoint but the config expects'):
        check_fits_config(dqn, saved, entry='current_dqn', source='x.pth', ckpt_cfg=None, cfg=cfg)
    assert describe_mismatches(dqn.state_dict(), saved) == [
        '1 unexpected key(s): extra', f'1 shape mismatch(es) saved vs expected: {first} (3,) vs '
                                      f'{tuple(dqn.state_dict()[first].shape)}']
    assert describe_mismatches(dqn.state_dict(), [1]) == ['expected a state dict, got list']


def test_atomic_writes_are_all_or_nothing(tmp_path):
    target = tmp_path / 'sub' / 'f.bin'
    atomic_write_bytes(b'old', target)  # creates the folder
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write(b'half')
        raise RuntimeError('killed')
    assert target.read_bytes() == b'old' and os.listdir(target.parent) == ['f.bin']
    os.utime(target, (1_000_000, 1_000_000))
    atomic_copy(target, tmp_path / 'kept.bak', keep_times=True)
    assert (tmp_path / 'kept.bak').read_bytes() == b'old' and os.path.getmtime(tmp_path / 'kept.bak') == 1_000_000
    with pytest.raises(FileNotFoundError):
        atomic_copy(tmp_path / 'none', tmp_path / 'kept.bak')
    assert (tmp_path / 'kept.bak').read_bytes() == b'old'


def test_empty_dir_keeps_what_is_named_replaces_a_link_and_refuses_a_file(tmp_path):
    d = tmp_path / 'd'
    (d / 'sub').mkdir(parents=True)
    (d / 'a').write_text('a')
    (d / 'keep').write_text('k')
    empty_dir(d, keep={'keep'})
    assert os.listdir(d) == ['keep']
    f = tmp_path / 'f.pth'  # a folder key that names a file by mistake: the file is kept
    f.write_text('x')
    with pytest.raises(OSError, match='is a file, not a folder'):
        empty_dir(f)
    assert f.read_text() == 'x'
    link = tmp_path / 'link'
    link.symlink_to(d)
    empty_dir(link)  # the link becomes a folder; the folder it pointed to keeps its file
    assert link.is_dir() and not link.is_symlink() and os.listdir(link) == [] and os.listdir(d) == ['keep']
    empty_dir(tmp_path / 'new' / 'deep')
    assert (tmp_path / 'new' / 'deep').is_dir()
