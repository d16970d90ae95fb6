"""scripts/plot_tb.py: TensorBoard scalars -> PNG."""

import struct
import subprocess
import sys

import pytest
from torch.utils.tensorboard import SummaryWriter

from conftest import ROOT, load_script

SCRIPT = ROOT / 'scripts' / 'plot_tb.py'
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _load_module():
    return load_script('scripts/plot_tb.py', 'plot_tb')


def _png_size(path):
    """(width, height) from the IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b'IHDR'
    return struct.unpack('>II', data[16:24])


def _write_run(logdir):
    """Scalars under Mortal's train.py tags, including an add_scalars group."""
    w = SummaryWriter(str(logdir))
    for step in (100, 200, 300):
        w.add_scalar('loss/dqn_loss', 1.0 / step * 100, step)
        w.add_scalar('loss/next_rank_loss', 1.5 - step / 1000, step)
        w.add_scalar('hparam/lr', 1e-4, step)
    for step, rank in ((200, 2.6), (400, 2.4)):
        w.add_scalar('test_play/avg_ranking', rank, step)
        w.add_scalar('test_play/avg_pt', (2.5 - rank) * 40, step)
        w.add_scalars('test_play/ranking', {'1st': 0.3, '2nd': 0.25, '3rd': 0.25, '4th': 0.2}, step)
    w.close()


def test_load_scalars_values_and_add_scalars_labels(tmp_path):
    mod = _load_module()
    _write_run(tmp_path)
    s = mod.load_scalars(tmp_path)
    steps, values = s['loss/dqn_loss']['dqn_loss']
    assert steps == [100, 200, 300]
    assert values == pytest.approx([1.0, 0.5, 1 / 3])
    assert s['test_play/avg_ranking']['avg_ranking'] == ([200, 400], pytest.approx([2.6, 2.4]))
    # add_scalars writes each series to its own sub-run; labels come from the sub-run name
    assert sorted(s['test_play/ranking']) == ['1st', '2nd', '3rd', '4th']
    assert s['test_play/ranking']['4th'] == ([200, 400], pytest.approx([0.2, 0.2]))


@pytest.mark.slow
def test_cli_writes_valid_pngs(tmp_path):
    logdir, out = tmp_path / 'tb', tmp_path / 'plots'
    _write_run(logdir)
    r = subprocess.run([sys.executable, str(SCRIPT), str(logdir), '--out', str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ['hparam.png', 'loss.png', 'test_play.png']
    for p in out.iterdir():
        w, h = _png_size(p)
        assert w > 100 and h > 100
    # three test_play tags -> one row of three 5-inch subplots at 100 dpi
    assert _png_size(out / 'test_play.png')[0] == 1500
    assert str(out / 'loss.png') in r.stdout


def test_groups_filter(tmp_path):
    mod = _load_module()
    _write_run(tmp_path / 'tb')
    paths = mod.render(tmp_path / 'tb', tmp_path / 'p', groups=['loss'])
    assert [p.name for p in paths] == ['loss.png']
    with pytest.raises(mod.NoScalarsError, match='none of the groups'):
        mod.render(tmp_path / 'tb', tmp_path / 'p', groups=['nope'])


@pytest.mark.slow
def test_empty_dir_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert 'no TensorBoard event files' in r.stderr
    assert str(tmp_path) in r.stderr
    assert not (tmp_path / 'plots').exists()


def test_missing_dir_is_a_clear_error(tmp_path):
    mod = _load_module()
    with pytest.raises(mod.NoScalarsError, match='not a directory'):
        mod.load_scalars(tmp_path / 'absent')
