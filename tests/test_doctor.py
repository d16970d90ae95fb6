"""mortal.tools.doctor: a good config passes; each broken item FAILs with a message naming it."""

import socket

import pytest
import toml
import torch

from mortal.tools import doctor, quickstart_config
from mortal.model.networks import DQN, GRP, AuxNet, Brain


def _save_mortal(path, conv_channels=32, num_blocks=2, version=3, saved_config=True):
    torch.manual_seed(0)
    state = {
        'mortal': Brain(conv_channels=conv_channels, num_blocks=num_blocks, version=version).state_dict(),
        'current_dqn': DQN(version=version).state_dict(),
        'aux_net': AuxNet(dims=(4,)).state_dict(),
        'steps': 0,
    }
    if saved_config:
        state['config'] = {'control': {'version': version},
                           'resnet': {'conv_channels': conv_channels, 'num_blocks': num_blocks}}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def _save_grp(path, hidden_size=64, num_layers=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({'model': GRP(hidden_size=hidden_size, num_layers=num_layers).state_dict(), 'steps': 0}, path)


@pytest.fixture
def work(tmp_path):
    """A quickstart config (conv_channels 32, num_blocks 2, version 3) with its checkpoints in place."""
    cfg_path = quickstart_config.write_config(tmp_path, preset='short')
    cfg = toml.load(cfg_path)
    _save_mortal(tmp_path / 'online' / 'baseline.pth')
    _save_grp(tmp_path / 'bootstrap' / 'grp.pth')
    return tmp_path, cfg_path, cfg


def _rewrite(cfg_path, cfg):
    cfg_path.write_text(toml.dumps(cfg))


def _run(cfg_path, capsys, *extra):
    rc = doctor.main(['-c', str(cfg_path), *extra])
    return rc, capsys.readouterr().out


def _fail_lines(out):
    return [line for line in out.splitlines() if line.startswith('[FAIL]')]


def test_good_config_passes(work, capsys):
    _, cfg_path, _ = work
    rc, out = _run(cfg_path, capsys)
    assert rc == 0, out
    assert _fail_lines(out) == []
    assert '[ OK ] checkpoint: [baseline.train] state_file' in out
    assert '[ OK ] grp:' in out
    assert '[ OK ] port:' in out
    assert out.rstrip().endswith('all checks passed')


def test_unwritable_path_fails(work, capsys):
    root, cfg_path, cfg = work
    blocker = root / 'a_file'
    blocker.write_text('x')
    cfg['control']['tensorboard_dir'] = str(blocker / 'tb')  # parent is a regular file
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    [line] = _fail_lines(out)
    assert '[control] tensorboard_dir' in line and 'is a file, not a directory' in line


def test_busy_port_fails_and_server_running_passes(work, capsys):
    _, cfg_path, cfg = work
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen()
        cfg['online']['remote']['port'] = s.getsockname()[1]
        _rewrite(cfg_path, cfg)
        rc, out = _run(cfg_path, capsys)
        assert rc == 1
        [line] = _fail_lines(out)
        assert line.startswith('[FAIL] port: cannot bind 127.0.0.1:')
        # with a server expected, the same listening socket is what we want
        rc, out = _run(cfg_path, capsys, '--server-running')
        assert rc == 0, out
    rc, out = _run(cfg_path, capsys, '--server-running')  # socket closed: nothing answers
    assert rc == 1 and 'is the server up?' in out


def test_port_0_is_a_warning_not_free(work):
    _, _, cfg = work
    cfg['online']['remote']['port'] = 0
    [row] = doctor.check_port(cfg)
    assert row.status == doctor.WARN and '[online.remote] port = 0' in row.line() and 'cannot find' in row.line()


def test_checkpoint_resnet_mismatch_fails(work, capsys):
    root, cfg_path, _ = work
    _save_mortal(root / 'online' / 'baseline.pth', conv_channels=64)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    fails = _fail_lines(out)
    assert len(fails) == 2  # baseline.train and baseline.test share the file
    assert 'saved [resnet] conv_channels = 64, config has 32' in fails[0]


def test_checkpoint_without_saved_config_checked_by_weights(work, capsys):
    root, cfg_path, _ = work
    _save_mortal(root / 'online' / 'baseline.pth', num_blocks=3, saved_config=False)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert 'weights do not fit [resnet]/version' in _fail_lines(out)[0]
    line = _fail_lines(out)[0]
    # 2 blocks: net.3 = final BN (5 tensors), net.5 = conv (w, b), net.8 = Linear (w, b) -> 9 missing.
    # 3 blocks: net.3 = a block (2 BN x 5 + 2 conv + 4 attention = 16), BN net.4 (5), conv net.6 (2),
    # Linear net.9 (2) -> 25 unexpected.
    assert 'mortal: 9 missing key(s): encoder.net.3.bias,' in line
    assert '25 unexpected key(s): encoder.net.3.ca.shared_mlp.0.bias' in line


def test_checkpoint_version_mismatch_fails(work, capsys):
    root, cfg_path, _ = work
    _save_mortal(root / 'online' / 'baseline.pth', version=2)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert 'saved [control] version = 2, config has 3' in _fail_lines(out)[0]


def test_corrupt_and_foreign_checkpoints_fail(work, capsys):
    root, cfg_path, _ = work
    (root / 'online' / 'baseline.pth').write_bytes(b'not a zip file')
    rc, out = _run(cfg_path, capsys)
    assert rc == 1 and 'cannot load' in _fail_lines(out)[0]
    torch.save({'model': {}}, root / 'online' / 'baseline.pth')
    rc, out = _run(cfg_path, capsys)
    assert rc == 1 and "needs keys 'mortal' and 'current_dqn', has ['model']" in _fail_lines(out)[0]


def test_missing_baseline_fails_but_missing_trainer_state_is_info(work, capsys):
    root, cfg_path, cfg = work
    (root / 'online' / 'baseline.pth').unlink()
    cfg['baseline']['train']['from_server'] = False  # the client plays against its own file: it must exist
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert len(_fail_lines(out)) == 2
    assert '[INFO] checkpoint: [control] state_file' in out


def test_missing_baseline_that_a_client_fetches_is_info_and_a_warning_for_test_play(work, capsys):
    root, cfg_path, _ = work
    (root / 'online' / 'baseline.pth').unlink()
    rc, out = _run(cfg_path, capsys)  # [baseline.train] from_server defaults to true
    assert rc == 0 and _fail_lines(out) == []
    assert "[INFO] checkpoint: [baseline.train] state_file" in out and 'a client fetches the trainer' in out
    assert "[WARN] checkpoint: [baseline.test] state_file" in out and 'the trainer needs it' in out


def test_grp_shape_mismatch_and_missing_fail(work, capsys):
    root, cfg_path, _ = work
    _save_grp(root / 'bootstrap' / 'grp.pth', hidden_size=32)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    [line] = _fail_lines(out)
    assert line.startswith('[FAIL] grp:')
    # fc input width = hidden * num_layers: 64 vs 128. Mismatches: fc.0 weight+bias, fc.2 weight (3);
    # every GRU tensor of both layers has 3 * hidden rows (8) -> 11.
    assert '11 shape mismatch(es) saved vs expected: fc.0.bias (64,) vs (128,), fc.0.weight (64, 64)' in line
    (root / 'bootstrap' / 'grp.pth').unlink()
    rc, out = _run(cfg_path, capsys)
    assert 'missing (train it with mortal.train_grp)' in _fail_lines(out)[0]


def test_invalid_config_fails_naming_the_key(work, capsys):
    _, cfg_path, cfg = work
    del cfg['control']['batch_size']
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert 'missing key [control] batch_size' in out


def test_a_missing_profile_names_what_selected_it(work, capsys, monkeypatch):
    _, cfg_path, _ = work
    monkeypatch.delenv('TRAIN_PLAY_PROFILE', raising=False)
    rc, out = _run(cfg_path, capsys, '--profile', 'nope')
    assert rc == 1
    assert f"missing section [train_play.nope] in {cfg_path} (selected by --profile='nope')" in out
    monkeypatch.setenv('TRAIN_PLAY_PROFILE', 'fast')
    rc, out = _run(cfg_path, capsys)
    assert rc == 1 and "(selected by TRAIN_PLAY_PROFILE='fast')" in out


def test_misspelled_optional_key_fails_naming_the_key_it_resembles(work, capsys):
    _, cfg_path, cfg = work
    cfg['test_play']['fresh_deal'] = True  # fresh_deals: a process would warn and run on false
    cfg['control']['my_note'] = 'resembles nothing'
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert _fail_lines(out) == ["[FAIL] config: [test_play] fresh_deal is not a key: did you mean 'fresh_deals'? "
                                "As written, the processes ignore it and use fresh_deals = False"]
    assert '[WARN] config: unknown key [control] my_note in' in out  # not close to a key: a warning only
    assert 'unknown key [test_play] fresh_deal in' not in out  # no WARN beside the FAIL
    assert 'parses and validates' not in out  # nor an OK row of the same check


def test_misspelled_key_without_a_filled_default_is_left_unset_not_none(work, capsys):
    _, cfg_path, cfg = work
    cfg['optim']['scheduler']['int'] = 1e-6  # init: optional, never filled in (the scheduler's own default, 1e-8)
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert _fail_lines(out) == ["[FAIL] config: [optim.scheduler] int is not a key: did you mean 'init'? "
                                "As written, the processes ignore it and leave init unset"]


def test_typo_checks_of_an_unvalidated_config_name_the_schema_default(work):
    _, _, cfg = work
    cfg['test_play']['fresh_deal'] = True  # no fresh_deals in the dict: validate() has not filled it in
    [row], replaced = doctor.typo_checks(cfg, 'x.toml')
    assert row.detail.endswith('the processes ignore it and use fresh_deals = False'), row.detail
    assert replaced == {"unknown key [test_play] fresh_deal in x.toml (did you mean 'fresh_deals'?)"}


def test_only_the_warning_of_the_misspelled_key_is_replaced_by_its_fail_row(work, capsys):
    _, cfg_path, cfg = work
    cfg['test_play']['fresh_deal'] = True
    cfg['test_play']['fresh_deal in x'] = True  # its warning begins as the typo's would: it must still be shown
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1 and len(_fail_lines(out)) == 1
    assert f'[WARN] config: unknown key [test_play] fresh_deal in x in {cfg_path}' in out.splitlines()


def test_version_4_is_supported(work, capsys):
    root, cfg_path, cfg = work
    cfg['control']['version'] = 4
    _rewrite(cfg_path, cfg)
    _save_mortal(root / 'online' / 'baseline.pth', version=4)
    rc, out = _run(cfg_path, capsys)
    assert rc == 0, out
    assert _fail_lines(out) == []
    assert '[ OK ] version: [control] version = 4' in out
    assert '[INFO] version: version 4 observations (1012 x 34)' in out


def test_version_4_without_the_compiled_core_fails(work, capsys, monkeypatch):
    import mortal.features.obs_v4 as obs_v4
    from mortal.features.sp import calc

    root, cfg_path, cfg = work
    cfg['control']['version'] = 4
    _rewrite(cfg_path, cfg)
    _save_mortal(root / 'online' / 'baseline.pth', version=4)
    monkeypatch.setattr(calc, 'HAVE_CORE', False)
    monkeypatch.setattr(obs_v4, 'SP_THREADS', None)  # main() sets it from the environment; restored after the test
    monkeypatch.setenv('MORTAL_SP_THREADS', '3')
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert _fail_lines(out) == ['[FAIL] version: observation version 4 needs the compiled single-player core '
                                '(mortal.features.sp._core), which is not built here: run bash scripts/setup.sh '
                                '(needs g++ and the Python headers)']
    assert '(3 search threads per process: MORTAL_SP_THREADS)' in out


def test_version_4_with_a_v3_checkpoint_fails(work, capsys):
    _, cfg_path, cfg = work
    cfg['control']['version'] = 4
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    assert all(line.startswith('[FAIL] checkpoint:') for line in _fail_lines(out))
    assert 'saved [control] version = 3, config has 4' in out


def test_cuda_device_without_gpu_fails(work, capsys, monkeypatch):
    _, cfg_path, cfg = work
    cfg['control']['device'] = 'cuda:0'
    _rewrite(cfg_path, cfg)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    [line] = _fail_lines(out)
    assert line.startswith("[FAIL] device: [control] device = 'cuda:0', but ")
    assert line.endswith("or set [control] device = 'cpu'")
    assert 'trainer on cuda:0' in out and 'no CUDA device is visible' in out


def _hooked_saved_bytes(c, nb, version, batch, amp):
    """Distinct storages (parameters left out) that autograd saves in a real training forward on the CPU, bf16
    autocast standing in for CUDA's fp16 (the same width)."""
    from mortal.features.obs import obs_shape
    torch.manual_seed(0)
    brain, dqn, aux = doctor._model_parts(c, nb, version, device='cpu')
    params = {p.untyped_storage().data_ptr() for m in (brain, dqn, aux) for p in m.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t
    obs, masks = torch.randn(batch, *obs_shape(version)), torch.ones(batch, 46, dtype=torch.bool)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
        phi = brain(obs)
        dqn(phi, masks), aux(phi)
    return sum(seen.values()), doctor._weight_count(brain, dqn, aux)


@pytest.mark.parametrize('c, nb, version, batch, amp', [(32, 1, 3, 2, False), (64, 2, 4, 5, False),
                                                        (32, 2, 4, 3, True), (64, 1, 3, 4, True)])
def test_saved_bytes_formula_equals_the_graph(c, nb, version, batch, amp):
    hooked, weights = _hooked_saved_bytes(c, nb, version, batch, amp)
    assert doctor.saved_bytes(c, nb, version, batch, amp=amp, weights=weights) == hooked


def test_saved_bytes_by_hand():
    # 32 x 1, version 3 (934 x 34), batch 2, float32: a row keeps 34 x (934 + (7 + 3) x 32 + 64) = 44,812 tower
    # elements, 3 x 32 + 4 x 2 = 104 attention ones, 2 x 1024 and the v3 DQN heads' 4 x 256: 47,988 x 4 bytes
    # + 92 (masks) + 8 (index) = 192,052; the batch adds (8 + 4) x 32 float32 BatchNorm statistics = 1,536
    assert doctor.saved_bytes(32, 1, 3, 2) == 2 * 192_052 + 1_536
    # the step adds 2 (32, 34) float32 gradients a row: 8,704; the estimate grows by 1.25 x that a row
    assert doctor.saved_bytes(32, 1, 3, 2, step=True) == 2 * (192_052 + 8_704) + 1_536


def test_trainer_estimate_grows_with_batch_size(work):
    _, cfg_path, cfg = work
    cfg['resnet'].update(conv_channels=32, num_blocks=1)
    cfg['control'].update(version=3, batch_size=256, enable_amp=False, device='cpu')
    cfg['test_play']['games'] = 0
    small = doctor.estimate_memory(cfg)['trainer'][1]
    cfg['control']['batch_size'] *= 2
    big = doctor.estimate_memory(cfg)['trainer'][1]
    assert big - small == pytest.approx(1.25 * 256 * (192_052 + 8_704), abs=2)


@pytest.mark.parametrize('amp, measured_gib', [(True, 3.1), (False, 16.3)])
def test_trainer_estimate_within_a_quarter_of_the_h200_peaks(work, amp, measured_gib):
    # issue 32: the H200 run of config_online.toml (192 x 40, version 4, batch 256, cuDNN benchmark on) peaked at
    # 3.1 GiB with AMP and 16.3 without (torch's counters, no CUDA context); main's doctor said 1.8 and 3.0
    _, cfg_path, cfg = work
    cfg['resnet'].update(conv_channels=192, num_blocks=40)
    cfg['control'].update(version=4, batch_size=256, enable_amp=amp, device='cuda:0', enable_cudnn_benchmark=True)
    cfg['test_play']['games'] = 0
    est = doctor.estimate_memory(cfg)['trainer'][1]
    assert 0.75 < (est - doctor.CUDA_CONTEXT_BYTES) / (measured_gib * 2**30) < 1.25
    assert 0.75 < est / (measured_gib * 2**30) < 1.25


def _listed(text):
    """The problems of a ConfigError's message (one per '  - ' line), or its single line."""
    lines = [line[4:] for line in text.splitlines() if line.startswith('  - ')]
    return set(lines) if lines else {text.split(': ', 1)[1].strip()}


def test_doctor_lists_exactly_what_the_learner_refuses_a_missing_table_included(work, capsys, monkeypatch):
    """A file missing [aux] with three errors elsewhere: the doctor lists the missing table with the three, the
    very set that mortal.train refuses (issue 35, case 5)."""
    from mortal import train
    tmp_path, cfg_path, cfg = work
    cfg['control']['online'] = False  # the learner alone: the doctor's set is the learner's
    del cfg['aux']
    cfg['env']['gamma'] = 'one'
    cfg['resnet']['conv_channels'] = 'wide'
    cfg['control'].update(save_every=4, test_every=10)
    _rewrite(cfg_path, cfg)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    doctor_says = _listed(out.split('[FAIL] config: ', 1)[1])
    monkeypatch.setattr('sys.argv', ['train.py'])
    with pytest.raises(SystemExit) as info:
        train.main(['-c', str(cfg_path)])
    assert info.value.code == 2
    train_says = _listed(capsys.readouterr().err.split('error: ', 1)[1])
    assert f'missing section [aux] in {cfg_path}' in doctor_says
    assert len(doctor_says) == 4 and doctor_says == train_says


def test_a_file_index_with_a_missing_file_or_one_outside_the_globs_fails(work, capsys):
    """[dataset] file_index built from the config's globs but listing a file that is gone and one outside the
    globs: a FAIL naming both (issue 35, case 7); one built from other globs is a WARN (the next run rebuilds it)."""
    tmp_path, cfg_path, cfg = work
    logs = tmp_path / 'logs'
    logs.mkdir()
    (logs / 'in.json.gz').write_bytes(b'x')
    elsewhere = tmp_path / 'original' / 'old.json.gz'
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b'x')
    cfg['dataset']['globs'] = [str(logs / '*.json.gz')]
    _rewrite(cfg_path, cfg)
    index = cfg['dataset']['file_index']
    listed = [str(logs / 'in.json.gz'), str(logs / 'gone.json.gz'), str(elsewhere)]
    torch.save({'file_list': listed, 'globs': cfg['dataset']['globs']}, index)
    rc, out = _run(cfg_path, capsys)
    assert rc == 1
    [row] = [line for line in out.splitlines() if line.startswith('[FAIL] file index:')]
    assert f'[dataset] file_index = {index}' in row
    assert f'1 of its 3 file_list files are missing ({logs / "gone.json.gz"})' in row
    assert f'1 of its 3 file_list files are outside the globs ({elsewhere})' in row
    torch.save({'file_list': listed, 'globs': [str(elsewhere.parent / '*.json.gz')]}, index)
    rc, out = _run(cfg_path, capsys)
    assert '[WARN] file index: [dataset] file_index' in out and 'the next run rebuilds it' in out


def test_memory_over_the_card_only_with_the_benchmark_term_is_a_warning(work, monkeypatch):
    # 192 x 40 at batch 256 without AMP: 16.8 GiB with the cuDNN benchmark's fitted term, 3.0 without; the benchmark
    # takes what is free, so a 16 GiB card gets a warning, a 2 GiB card a failure
    _, cfg_path, cfg = work
    cfg['resnet'].update(conv_channels=192, num_blocks=40)
    cfg['control'].update(version=4, batch_size=256, enable_amp=False, device='cuda:0', enable_cudnn_benchmark=True)
    cfg['test_play']['games'] = 0
    for slot in ('train', 'test'):
        cfg['baseline'][slot]['device'] = 'cuda:0'
    for card_gib, status in ((16, doctor.WARN), (2, doctor.FAIL)):
        monkeypatch.setattr(doctor, '_gpu_total_bytes', lambda device: card_gib * 2**30)
        [trainer] = [r for r in doctor.check_memory(cfg) if r.detail.startswith('trainer')]
        assert trainer.status == status, trainer.line()
