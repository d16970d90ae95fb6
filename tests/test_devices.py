"""Every device string torch cannot use is one clear line from every process and the doctor (issue 35 item 8)."""

import pytest
import toml
import torch

from conftest import tiny_config_dict
from mortal import entry
from mortal.tools import doctor


def _problems(tmp_path, value):
    cfg = tiny_config_dict(tmp_path)
    cfg['control']['device'] = value
    return entry.device_problems(cfg, entry.TRAIN_DEVICES)


@pytest.mark.parametrize('value', ['banana', '/dev/nvidia0', 'CUDA:0', ''])
def test_a_string_that_is_no_torch_device_is_one_line(tmp_path, value):
    [line] = _problems(tmp_path, value)
    assert line.startswith(f'[control] device = {value!r} is not a torch device (')
    assert line.endswith("use 'cpu', 'cuda', 'cuda:N' or 'mps'")


def test_mps_without_mps_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: False)
    assert _problems(tmp_path, 'mps') == [
        f"[control] device = 'mps', but this torch ({torch.__version__}) cannot use an Apple GPU (mps): set "
        f"[control] device = 'cpu'"]


def test_other_kinds_and_hidden_cuda_indices_are_refused(tmp_path, monkeypatch):
    assert _problems(tmp_path, 'meta') == [
        "[control] device = 'meta' is a 'meta' device, which the processes do not run on: use 'cpu', 'cuda', "
        "'cuda:N' or 'mps'"]
    monkeypatch.setattr(torch.backends.cuda, 'is_built', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    assert _problems(tmp_path, 'cuda:0') == []
    assert _problems(tmp_path, 'cuda:1') == [
        "[control] device = 'cuda:1', but torch sees 1 CUDA device(s) (indices from 0): set a visible index, or "
        "[control] device = 'cpu'"]
    assert _problems(tmp_path, 'cpu') == []


def test_a_long_value_is_clipped(tmp_path):
    [line] = _problems(tmp_path, 'x' * 5000)
    assert len(line) < 500


def test_check_devices_exits_2_and_the_doctor_fails_the_row(tmp_path, capsys):
    cfg = tiny_config_dict(tmp_path)
    cfg['control']['device'] = 'banana'
    with pytest.raises(SystemExit) as info:
        entry.check_devices(cfg, entry.TRAIN_DEVICES)
    assert info.value.code == 2
    assert "error: [control] device = 'banana' is not a torch device" in capsys.readouterr().err
    path = tmp_path / 'config.toml'
    path.write_text(toml.dumps(cfg))
    rc = doctor.main(['-c', str(path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "[FAIL] device: [control] device = 'banana' is not a torch device" in out
