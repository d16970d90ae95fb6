"""Reliability defects of project issue 13; each test failed before its fix.

2. processes of a killed learner (DataLoader fork server and workers) outlived it;
3. the claimed logs a learner had not trained when a test play ended it were dropped by the next drain;
6. a gzip bomb was decompressed whole; 7a. a masked tile printed a raw Rust panic; 7b. a 'haipai' dialect log
was called a 3-player log; 7d. a scheduler shape the config accepted made the trainer fail at start; 7e. the
offline bootstrap printed a countdown to a test play that never comes.
"""

import collections
import gzip
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import tracemalloc
import uuid

import pytest
import torch

from conftest import (DATA_DIR, ROOT, FakeTestPlayer, FakeWriter, ScriptedRemote, empty_drain, fake_trainer,
                      load_tiny_config, random_batch, write_grp)
from mortal import train as tr
from mortal.config import load_config
from mortal.data.dataloader import FileDatasetsIter
from mortal.data.gameplay import GameplayLoader
from mortal.data.mjai_log import BadLogError, parse_log, read_log_text
from mortal.features.packed_obs import unpack
from mortal.learning.optimizer import LinearWarmUpCosineAnnealingLR

LOGS = [DATA_DIR / 'riichienv_selfplay_hanchan.jsonl', DATA_DIR / 'meta_annotated_hanchan.jsonl',
        DATA_DIR / 'arena_double_ron_hanchan.json.gz']
PTS = [6.0, 4.0, 2.0, 0.0]
linux_only = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='/proc and PR_SET_PDEATHSIG')


def _events(src):
    raw = gzip.decompress(src.read_bytes()) if src.suffix == '.gz' else src.read_bytes()
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


# -- 2: no process of the learner outlives it ---------------------------------------------------------------------

_FAKE_LEARNER = r'''
import os, subprocess, sys, time
import torch
from torch.utils.data import IterableDataset
from mortal.data.dataloader import make_dataloader

class Forever(IterableDataset):
    def __iter__(self):
        while True:
            time.sleep(0.02)
            yield torch.zeros(1)

if __name__ == '__main__':
    if len(sys.argv) > 2:
        subprocess.Popen(['sleep', '600'])  # a plain child: only the supervisor's group kill can end it
    it = iter(make_dataloader(Forever(), batch_size=1, num_workers=2))
    next(it)
    open(sys.argv[1], 'w').write(str(os.getpid()))
    while True:
        next(it)
'''


def _marked(mark):
    """pids of the processes whose environment holds MORTAL_TEST_MARK=mark (the learner's descendants)."""
    needle = f'MORTAL_TEST_MARK={mark}'.encode()
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/environ', 'rb') as f:
                env = f.read().split(b'\0')
            with open(f'/proc/{entry}/stat') as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in ('Z', 'X'):
            found.append(int(entry))
    return found


def _wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def _survivors(mark, timeout=10.0):
    _wait_for(lambda: not _marked(mark), timeout)
    return _marked(mark)


def _start(tmp_path, cmd, mark):
    env = {**os.environ, 'MORTAL_TEST_MARK': mark, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
    return subprocess.Popen(cmd, env=env, cwd=tmp_path)


def _cleanup(mark):
    for pid in _marked(mark):  # only processes this test started carry the mark
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@linux_only
@pytest.mark.timeout(240)
def test_loader_processes_die_with_a_sigkilled_learner(tmp_path):
    script, ready, mark = tmp_path / 'learner.py', tmp_path / 'ready', uuid.uuid4().hex
    script.write_text(_FAKE_LEARNER)
    proc = _start(tmp_path, [sys.executable, str(script), str(ready)], mark)
    try:
        assert _wait_for(ready.exists, 180), 'the fake learner never got a batch'
        # the fork server, two workers and the resource tracker
        assert len([p for p in _marked(mark) if p != proc.pid]) >= 3
        proc.kill()
        proc.wait()
        assert _survivors(mark) == []
    finally:
        proc.kill()
        _cleanup(mark)


@pytest.mark.slow
@linux_only
@pytest.mark.timeout(300)
@pytest.mark.parametrize('how', ['sigterm_supervisor', 'sigkill_learner'])
def test_no_learner_process_outlives_it_under_the_supervisor(tmp_path, how):
    script, ready, mark = tmp_path / 'learner.py', tmp_path / 'ready', uuid.uuid4().hex
    script.write_text(_FAKE_LEARNER)
    runner = tmp_path / 'runner.py'
    runner.write_text('import sys\nfrom mortal.learning import supervisor\n'
                      f'sys.exit(supervisor.supervise([{str(ready)!r}, "with-child"], script={str(script)!r}))\n')
    proc = _start(tmp_path, [sys.executable, str(runner)], mark)
    try:
        assert _wait_for(ready.exists, 180), 'the fake learner never got a batch'
        learner = int(ready.read_text())
        assert len([p for p in _marked(mark) if p not in (proc.pid, learner)]) >= 4  # + the plain child
        if how == 'sigterm_supervisor':
            proc.terminate()
            assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        else:
            os.kill(learner, signal.SIGKILL)
            assert proc.wait(timeout=60) == 128 + signal.SIGKILL
        assert _survivors(mark) == []
    finally:
        proc.kill()
        _cleanup(mark)


# -- 3: a test play no longer drops the rest of the claimed drain --------------------------------------------------

def _fingerprint(obs, action, mask, steps, rank):
    h = hashlib.blake2b(digest_size=16)
    for part in (obs, mask):
        h.update(part.numpy().tobytes() if isinstance(part, torch.Tensor) else part.tobytes())
    h.update(f'{int(action)},{int(steps)},{int(rank)}'.encode())
    return h.hexdigest()


class DrainCalled(Exception):
    pass


class OneDrainRemote(ScriptedRemote):
    """Answers the first drain with ``reply``; any later drain raises DrainCalled."""

    def request(self, msg):
        if msg['type'] == 'drain' and not self.replies:
            raise DrainCalled()
        return super().request(msg)


def _claimable_logs(drain_dir, seats=(0, 2)):
    """Distinct real logs with a 'trainee' seat (the only seat online training learns from)."""
    os.makedirs(drain_dir)
    names = []
    for i, src in enumerate(LOGS):
        events = _events(src)
        for seat in seats:
            events[0]['names'] = ['trainee' if s == seat else f'p{s}' for s in range(4)]
            name = f'0_{i}{seat}.json.gz'
            with gzip.open(os.path.join(drain_dir, name), 'wt') as f:
                f.writelines(json.dumps(e) + '\n' for e in events)
            names.append(name)
    return names


def _expected_samples(config, paths):
    from mortal.config import section
    from mortal.data.reward import load_grp
    grp = load_grp(config['grp']['state_file'], section(config, 'grp.network'))
    ds = FileDatasetsIter(3, paths, PTS, grp, player_names=['trainee'], file_batch_size=1)
    return collections.Counter(_fingerprint(s[0], s[1], s[2], s[3], s[5]) for s in ds)


def _next_epoch_samples(trainer):
    """Fingerprints of the samples the next online epoch's loader yields from the ledger's pending logs."""
    ledger = trainer.server.ledger
    out = collections.Counter()
    for obs, actions, masks, steps, _rewards, ranks, *_ in trainer.data_loader(ledger.pending(), ['trainee'],
                                                                                ledger=ledger, num_workers=0):
        floats = unpack(obs, 3)
        for i in range(actions.shape[0]):
            out[_fingerprint(floats[i], actions[i], masks[i], steps[i], ranks[i])] += 1
    return out


def _learners_until_drain(tmp_path, config, names, trained, caplog, *, between=None):
    """Run learners as the supervisor would (each ended by a test play) until one drains a second time.
    Returns (runs, the last trainer, the data/samples_dropped values of all runs)."""
    drain_dir = config['online']['server']['drain_dir']
    first = {**empty_drain(drain_dir, 'A', True), 'count': len(names), 'files': names,
             'param_versions': [1] * len(names), 'param_version': 1}
    runs, writers = 0, []
    while True:
        runs += 1
        assert runs < 20
        writer = FakeWriter()
        writers.append(writer)
        trainer = fake_trainer(config, test_player=FakeTestPlayer([(0.0, 2.5)] * 10), writer=writer,
                               remote=OneDrainRemote([first] if runs == 1 else []))
        real = trainer.train_batch

        def spy(obs, actions, masks, steps, rewards, ranks, *cf, real=real):
            assert obs.dtype == torch.uint8  # the loader's packed rows, unpacked by train_batch
            floats = unpack(obs, 3)
            for i in range(actions.shape[0]):
                trained[_fingerprint(floats[i], actions[i], masks[i], steps[i], ranks[i])] += 1
            return real(obs, actions, masks, steps, rewards, ranks, *cf)

        trainer.train_batch = spy
        caplog.clear()
        try:
            with caplog.at_level(logging.INFO, logger='mortal.train'):
                trainer.run()
        except tr.TestPlayDone:
            if runs > 1:
                assert 'resuming' in caplog.text  # each restarted learner first finishes what it had claimed
            if between is not None:
                between(trainer)
            continue
        except DrainCalled:
            dropped = [v for w in writers for t, v, _ in w.scalars if t == 'data/samples_dropped']
            return runs, trainer, dropped


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize('num_workers', [0, 1])
def test_test_play_restarts_train_every_claimed_sample_exactly_once(tmp_path, caplog, num_workers):
    config, _ = load_tiny_config(tmp_path, online=True, control={'batch_size': 16, 'save_every': 8, 'test_every': 24},
                            dataset={'num_workers': num_workers, 'file_batch_size': 2, 'reserve_ratio': 0.25})
    write_grp(config)
    names = _claimable_logs(config['online']['server']['drain_dir'])
    expected = _expected_samples(config, [os.path.join(config['online']['server']['drain_dir'], n) for n in names])
    total = sum(expected.values())
    assert total > 4 * 24 * 16 // 3  # enough for two test plays before the drain runs out
    trained = collections.Counter()
    runs, trainer, dropped = _learners_until_drain(tmp_path, config, names, trained, caplog)
    assert runs >= 3  # at least two learners resumed a drain a test play had cut short
    assert 'resuming' in caplog.text and 'claimed logs not fully trained' in caplog.text
    over = {k: (n, expected[k]) for k, n in trained.items() if n > expected[k]}
    assert over == {}  # no sample trained twice (and none that is not in the logs)
    untrained = total - sum(trained.values())
    assert 0 <= untrained < 16  # only the epoch's last partial batch is left...
    assert _next_epoch_samples(trainer) == expected - trained  # ...and it stays claimed for the next drain
    assert trainer.server.ledger.duplicates == 0
    assert dropped == [0.0]  # one natural epoch end, nothing lost


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_claimed_logs_lost_between_learners_are_counted_dropped(tmp_path, caplog):
    config, _ = load_tiny_config(tmp_path, online=True, control={'batch_size': 16, 'save_every': 8, 'test_every': 24},
                            dataset={'file_batch_size': 6})
    write_grp(config)
    names = _claimable_logs(config['online']['server']['drain_dir'])
    expected = _expected_samples(config, [os.path.join(config['online']['server']['drain_dir'], n) for n in names])
    removed = {}

    def lose_a_partly_trained_log(trainer):
        if removed:
            return
        ledger = trainer.server.ledger
        name = next(n for n, units in ledger.files.items() if units and not ledger._done(units))
        removed[name] = sum(u.total - len(u.trained) for u in ledger.files[name].values() if u != 'done')
        os.remove(os.path.join(ledger.claim_dir, name))

    trained = collections.Counter()
    runs, trainer, dropped = _learners_until_drain(tmp_path, config, names, trained, caplog,
                                                   between=lose_a_partly_trained_log)
    (name, lost), = removed.items()
    assert lost > 0 and sum(dropped) == lost  # reported once, by the learner that found the log gone
    assert all(n <= expected[k] for k, n in trained.items())
    assert sum(expected.values()) - sum(trained.values()) == lost + sum(_next_epoch_samples(trainer).values())
    manifest = json.loads(open(os.path.join(trainer.server.ledger.claim_dir, 'claims.json')).read())
    assert name not in manifest['files']


class Killed(BaseException):
    """A simulated SIGKILL of the learner: nothing in the learner catches it, and what it had in memory is lost."""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize('stage', ['before_save', 'after_save', 'in_test_play', 'after_ledger'])
def test_a_kill_at_any_stage_of_the_save_cycle_trains_every_sample_once(tmp_path, caplog, monkeypatch, stage):
    """The first learner is killed once, at the test play of step 24 (before its checkpoint is written, right after
    it, inside the test play) or right after the commit of step 8 (the next batch); learners then restart as the
    supervisor does until one drains again. A sample counts as trained once a checkpoint holds it (what a kill
    loses was lost by the checkpoint too); every sample must be so counted exactly once (issue 35, case 4)."""
    config, _ = load_tiny_config(tmp_path, online=True,
                                 control={'batch_size': 16, 'save_every': 8, 'test_every': 24},
                                 dataset={'num_workers': 0, 'file_batch_size': 2, 'reserve_ratio': 0.25})
    write_grp(config)
    drain_dir = config['online']['server']['drain_dir']
    names = _claimable_logs(drain_dir)
    expected = _expected_samples(config, [os.path.join(drain_dir, n) for n in names])
    durable, pending = collections.Counter(), collections.Counter()
    state_file = config['control']['state_file']
    armed = [True]
    real_save = tr.atomic_torch_save

    def save(obj, filename, *args, **kwargs):
        if filename == state_file and armed[0] and obj['steps'] == 24 and stage == 'before_save':
            armed[0] = False
            raise Killed()
        real_save(obj, filename, *args, **kwargs)
        if filename == state_file:
            durable.update(pending)  # this checkpoint holds what was trained since the last
            pending.clear()
            if armed[0] and obj['steps'] == 24 and stage == 'after_save':
                armed[0] = False
                raise Killed()

    monkeypatch.setattr(tr, 'atomic_torch_save', save)
    first = {**empty_drain(drain_dir, 'A', True), 'count': len(names), 'files': names,
             'param_versions': [1] * len(names), 'param_version': 1}
    kills = runs = 0
    while True:
        runs += 1
        assert runs < 20
        trainer = fake_trainer(config, test_player=FakeTestPlayer([(0.0, 2.5)] * 10),
                               remote=OneDrainRemote([first] if runs == 1 else []))
        real = trainer.train_batch

        def spy(obs, actions, masks, steps, rewards, ranks, *cf, real=real, trainer=trainer):
            if armed[0] and stage == 'after_ledger' and trainer.steps == 8:
                armed[0] = False
                raise Killed()
            floats = unpack(obs, 3)
            for i in range(actions.shape[0]):
                pending[_fingerprint(floats[i], actions[i], masks[i], steps[i], ranks[i])] += 1
            return real(obs, actions, masks, steps, rewards, ranks, *cf)

        trainer.train_batch = spy
        if stage == 'in_test_play' and armed[0]:
            def killed_in_test_play():
                armed[0] = False
                raise Killed()
            trainer.guards.test_play = killed_in_test_play
        caplog.clear()
        try:
            with caplog.at_level(logging.INFO):
                trainer.run()
        except tr.TestPlayDone:
            assert not pending  # the test play follows a save
            continue
        except Killed:
            kills += 1
            pending.clear()  # trained, but in no checkpoint: lost with the process, trained again after it
            continue
        except DrainCalled:
            durable.update(pending)  # the last learner is alive: what it trained since its save is its own
            break
    assert kills == 1 and runs >= 3
    over = {k: (n, expected[k]) for k, n in durable.items() if n > expected[k]}
    assert over == {}  # no sample trained twice across the kill
    untrained = sum(expected.values()) - sum(durable.values())
    assert 0 <= untrained < 16  # none dropped: only the epoch's last partial batch is left...
    assert _next_epoch_samples(trainer) == expected - durable  # ...and stays claimed for the next drain
    assert trainer.server.ledger.duplicates == 0


def test_a_commit_staged_for_a_checkpoint_is_kept_only_with_that_checkpoint(tmp_path, caplog):
    """``ClaimLedger.open`` settles a commit that a kill cut between the checkpoint and the ledger's rename by the
    checkpoint's step: the staged manifest of step 8 is the ledger of a step-8 checkpoint, and is dropped when the
    checkpoint on disk is still of step 0."""
    from mortal.data.claims import MANIFEST, STAGED, ClaimLedger
    sig = {'version': 3}
    for on_disk, progress in ((8, [0, 1]), (0, [])):
        d = tmp_path / f'claims{on_disk}'
        d.mkdir()
        (d / 'a').write_bytes(b'x')
        ledger = ClaimLedger.open(str(d), signature=sig, passes=1, steps=0)
        ledger.add(['a'])
        ledger.begin_epoch([str(d / 'a')])
        ledger.record([[0, 0, 0, 3], [0, 0, 1, 3]])

        def killed_after_the_save():
            raise Killed()  # the checkpoint of step 8 is written (or not, for on_disk 0); the rename never happens
        with pytest.raises(Killed):
            ledger.commit_with(8, killed_after_the_save)
        assert (d / STAGED).exists()
        with caplog.at_level(logging.INFO, logger='mortal.claims'):
            again = ClaimLedger.open(str(d), signature=sig, passes=1, steps=on_disk)
        assert not (d / STAGED).exists()
        assert again.trained_map() == ({str(d / 'a'): {0: set(progress)}} if progress else {})
        assert json.loads((d / MANIFEST).read_text())['steps'] == (8 if on_disk == 8 else None)


def test_drain_keeps_logs_of_earlier_drains_not_yet_trained(tmp_path):
    config, _ = load_tiny_config(tmp_path, online=True)
    drain_dir = config['online']['server']['drain_dir']
    os.makedirs(drain_dir)
    trainer = fake_trainer(config, remote=ScriptedRemote([]))
    for name, body in (('0_a.json.gz', b'a'), ('0_b.json.gz', b'b')):
        with open(os.path.join(drain_dir, name), 'wb') as f:
            f.write(body)
    reply = {**empty_drain(drain_dir, 'A', True), 'count': 2, 'files': ['0_a.json.gz', '0_b.json.gz'],
             'param_versions': [1, 1]}
    trainer.server.remote = ScriptedRemote([reply])
    first = trainer.server.drain(trainer.steps, trainer.resubmit)
    # the server restarts and names its next drain from 0_ again; 0_a is still untrained
    os.remove(os.path.join(drain_dir, '0_a.json.gz'))
    with open(os.path.join(drain_dir, '0_a.json.gz'), 'wb') as f:
        f.write(b'new a')
    trainer.server.remote = ScriptedRemote([{**reply, 'count': 1, 'files': ['0_a.json.gz'], 'param_versions': [1]}])
    second = trainer.server.drain(trainer.steps, trainer.resubmit)
    assert [open(p, 'rb').read() for p in first] == [b'a', b'b']  # not emptied by the second claim
    assert [os.path.basename(p) for p in second] == ['1+0_a.json.gz'] and open(second[0], 'rb').read() == b'new a'
    manifest = json.loads(open(os.path.join(trainer.server.ledger.claim_dir, 'claims.json')).read())
    assert sorted(manifest['files']) == ['0_a.json.gz', '0_b.json.gz', '1+0_a.json.gz']


# -- 6: decompression bomb -------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def bomb(tmp_path_factory):
    path = tmp_path_factory.mktemp('bomb') / 'bomb.json.gz'
    path.write_bytes(gzip.compress(b'\n' * (100 << 20), compresslevel=9))
    assert path.stat().st_size < 200_000
    return path


def test_gzip_bomb_is_refused_with_bounded_memory(bomb):
    tracemalloc.start()
    try:
        with pytest.raises(BadLogError) as err:
            read_log_text(bomb, max_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # the old reader held all 100 MB (twice)
    assert err.value.source == str(bomb) and 'exceeds the cap of 1,048,576 bytes' in err.value.reason


def test_gzip_bomb_is_skipped_by_the_loader_with_the_configured_cap(tmp_path, bomb, caplog):
    config, _ = load_tiny_config(tmp_path, online=False, dataset={'max_log_bytes': 1 << 20})
    assert config['dataset']['max_log_bytes'] == 1 << 20
    (tmp_path / 'd').mkdir()
    assert load_tiny_config(tmp_path / 'd', online=False)[0]['dataset']['max_log_bytes'] == 64 << 20  # the default
    write_grp(config)
    trainer = fake_trainer(config)
    data = trainer.data_loader([str(bomb), str(LOGS[0])], ['0']).dataset
    assert data.loader_options['max_log_bytes'] == 1 << 20
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        batches = list(data)
    assert time.monotonic() - start < 10
    assert sum(len(b[1]) for b in batches) == 212 and data.skipped == 1  # seat '0' of the good log (test_dataloader's count)
    assert f'skipped log {bomb}: decompressed log exceeds the cap of 1,048,576 bytes' in caplog.text
    # the readers' default cap stops it too
    loader = GameplayLoader(3)
    assert loader.load_gz_log_files([bomb]) == [[]]
    assert 'exceeds the cap of 67,108,864 bytes' in loader.skipped_files[0][1]


# -- 7a / 7b: bad logs through the normal skip message -------------------------------------------------------------

def test_masked_tiles_are_a_skip_message_not_a_rust_panic(tmp_path, capfd):
    events = _events(LOGS[0])
    first = next(i for i, e in enumerate(events) if e['type'] == 'start_kyoku')
    events[first]['tehais'][3] = ['?'] * 13  # the 4th seat's hand masked, as in one player's view
    path = tmp_path / 'masked.json'
    path.write_text(''.join(json.dumps(e) + '\n' for e in events))
    loader = GameplayLoader(3)
    capfd.readouterr()
    assert loader.load_gz_log_files([path]) == [[]]
    err = capfd.readouterr().err
    assert 'panicked' not in err and 'update.rs' not in err
    assert loader.skipped_files == [(str(path), f"skipped log {path}: line {first + 1}: start_kyoku tehais of seat 3 "
                                                 f"hold masked tiles '?' (a log from another player's view?); "
                                                 f"training needs full hands")]
    # only the seats that are replayed matter: the other three train as before
    assert [len(g) for g in GameplayLoader(3, player_names=['0', '1', '2']).load_log_file(path)] == [212, 215, 216]


def test_haipai_dialect_is_named():
    events = _events(LOGS[0])
    first = next(i for i, e in enumerate(events) if e['type'] == 'start_kyoku')
    events[first]['haipais'] = events[first].pop('tehais')
    with pytest.raises(BadLogError) as err:
        parse_log(''.join(json.dumps(e) + '\n' for e in events), 'h.json')
    assert err.value.line == first + 1
    assert "start_kyoku has no 'tehais' (it has 'haipais'): a haipai-dialect log?" in err.value.reason
    assert '4-player' not in err.value.reason


# -- 7d: config check and scheduler agree ----------------------------------------------------------------------------

@pytest.mark.parametrize('warm_up, max_steps, peak, final, init', [
    (1000, 0, 1e-4, 1e-4, None), (1000, 0, 1e-3, 1e-4, 1e-6), (0, 0, 1e-4, 1e-4, None), (10, 10, 1e-4, 1e-5, None),
    (100, 50, 1e-4, 1e-4, None), (0, 0, 1e-5, 1e-4, None), (10, 100, 1e-4, 1e-5, 1e-4)])
def test_scheduler_accepts_exactly_what_the_config_accepts(tmp_path, warm_up, max_steps, peak, final, init):
    from mortal.config import ConfigError
    shape = {'warm_up_steps': warm_up, 'max_steps': max_steps, 'peak': peak, 'final': final}
    if init is not None:
        shape['init'] = init
    try:
        config, _ = load_tiny_config(tmp_path, **{'optim.scheduler': shape})
        config_ok = True
    except ConfigError:
        config_ok = False
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1)
    try:
        sched = LinearWarmUpCosineAnnealingLR(opt, **shape)
        sched_ok = True
    except ValueError:
        sched_ok = False
    assert config_ok == sched_ok
    if sched_ok and max_steps == 0:
        # no annealing: linear warm-up to peak, then final
        start = shape.get('init', 1e-8)
        if warm_up:
            assert sched.factor(warm_up // 2) == pytest.approx(start + (peak - start) / 2)
        assert sched.factor(warm_up) == sched.factor(10 ** 7) == final


def test_warm_up_without_annealing_trains(tmp_path):
    config, _ = load_tiny_config(tmp_path, online=False, **{'optim.scheduler': {'warm_up_steps': 1000, 'max_steps': 0}})
    trainer = fake_trainer(config)
    trainer.train_batch(*random_batch())
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-8 + (1e-3 - 1e-8) / 1000)


# -- 7e: no countdown without test play ------------------------------------------------------------------------------

@pytest.mark.parametrize('offline_test_every', [0, 20])
def test_offline_bootstrap_prints_a_countdown_only_with_test_play(tmp_path, caplog, offline_test_every):
    from mortal.tools import offline_epochs, quickstart_config
    cfg = load_config(quickstart_config.write_config(tmp_path, preset='short'))
    cfg['bootstrap']['offline_test_every'] = offline_test_every
    offline = offline_epochs.offline_config(cfg)
    trainer = fake_trainer(offline, test_player=offline_epochs.RulebaseTestPlayer(offline))
    trainer.steps = 740
    n = offline['control']['batch_size']
    with caplog.at_level(logging.INFO, logger='mortal.train'):
        for i in range(10):
            trainer.train_batch(*random_batch(n, seed=i))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('total steps')]
    assert lines == (['total steps: 750'] if offline_test_every == 0 else ['total steps: 750 (~10)'])


def test_a_learner_starting_after_its_test_play_counts_down_a_whole_cycle(tmp_path, caplog):
    # The online learner restarts at a multiple of test_every, right after that step's test play: its first line
    # said "(~0)" as if a test play were due (a new user's trial). The line before a due test play keeps 0.
    from mortal.train import steps_to_next_test
    assert steps_to_next_test(600, 600, None) == 600
    assert steps_to_next_test(600, 600, None, tested=False) == 0
    assert steps_to_next_test(601, 600, None) == 599
    assert steps_to_next_test(1199, 600, None, tested=False) == 1
    config, _ = load_tiny_config(tmp_path, online=False)
    trainer = fake_trainer(config)
    trainer.steps = 3 * trainer.test_every
    with caplog.at_level(logging.INFO, logger='mortal.train'):
        trainer.log_total_steps()
    assert caplog.records[-1].getMessage() == f'total steps: {trainer.steps:,} (~{trainer.test_every:,})'


# -- one learner per state file, one client per log_dir (issue 35, cases 1 and 6) ----------------------------------

def _holder_line(pid):
    import socket
    return f'PID {pid} on host {socket.gethostname()} since '


@pytest.mark.parametrize('online', [False, True])
def test_a_second_learner_on_one_state_file_refuses_before_reading_anything(tmp_path, capsys, monkeypatch, online):
    """While a learner holds [control] state_file, a second mortal.train on the same config exits 2 at once (the
    supervisor, online, before it starts a child), naming the holder and the key; it built no Trainer."""
    from mortal.util import runlock
    config, path = load_tiny_config(tmp_path, online=online)
    for name in ('baseline.pth', 'grp.pth'):  # the learner's input files (train.missing_inputs)
        (tmp_path / name).write_bytes(b'')

    def no_trainer(*a, **k):
        raise AssertionError('the second learner read the state')
    monkeypatch.setattr(tr, 'Trainer', no_trainer)
    monkeypatch.setattr(tr, 'supervise', lambda *a, **k: no_trainer())
    monkeypatch.setattr('sys.argv', ['train.py'])
    with runlock.hold(config['control']['state_file'], who='learner', key='[control] state_file', fix='-'):
        with pytest.raises(SystemExit) as info:
            tr.main(['-c', str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: another learner runs on [control] state_file = {config['control']['state_file']}: " in err
    assert _holder_line(os.getpid()) in err and 'its own [control] state_file' in err


@linux_only
def test_a_lock_left_by_a_sigkilled_holder_is_taken_over_with_a_log_line(tmp_path, caplog):
    """A process holds the lock and is SIGKILLed: the kernel frees the OS lock, the holder's record stays; the next
    taker takes it over and logs the dead holder's PID."""
    from mortal.util import runlock
    target = tmp_path / 'state' / 'mortal.pth'
    code = (f'import sys, time; sys.path.insert(0, {str(ROOT)!r})\n'
            f'from mortal.util import runlock\n'
            f'with runlock.hold({str(target)!r}, who="learner", key="k", fix="-"):\n'
            f'    print("held", flush=True); time.sleep(60)\n')
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == 'held\n'
        with pytest.raises(runlock.LockHeld, match=_holder_line(proc.pid)):
            with runlock.hold(str(target), who='learner', key='[control] state_file', fix='-'):
                pass
        proc.kill()
        proc.wait()
        with caplog.at_level(logging.WARNING, logger='mortal.util.runlock'):
            with runlock.hold(str(target), who='learner', key='[control] state_file', fix='-'):
                assert runlock.holder_if_held(str(target)) is not None
        assert f'its holder (PID {proc.pid} on host ' in caplog.text and 'ended without releasing it' in caplog.text
        assert runlock.holder_if_held(str(target)) is None
        assert not os.path.exists(runlock.lock_path_for(str(target)) + runlock.OWNER_SUFFIX)  # a clean release
    finally:
        proc.kill()
        proc.wait()


def test_a_second_client_on_one_log_dir_refuses_naming_the_key_and_the_profile(tmp_path, capsys, monkeypatch):
    """While a client holds its [train_play.default] log_dir, a second client on the same config exits 2, naming
    the holder, the key and the other way out (a profile of its own); it made no Client."""
    from mortal import client as cl
    from mortal.util import runlock
    config, path = load_tiny_config(tmp_path, online=True)

    def no_client(*a, **k):
        raise AssertionError('the second client started')
    monkeypatch.setattr(cl, 'Client', no_client)
    monkeypatch.delenv('TRAIN_PLAY_PROFILE', raising=False)
    log_dir = config['train_play']['default']['log_dir']
    with runlock.hold(log_dir, who='client', key='k', fix='-'):
        with pytest.raises(SystemExit) as info:
            cl.main(['-c', str(path), '--rounds', '1'])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f'error: another client runs on [train_play.default] log_dir = {log_dir}: ' in err
    assert _holder_line(os.getpid()) in err
    assert 'set another [train_play.default] log_dir, or run this client with a profile of its own' in err
    assert 'TRAIN_PLAY_PROFILE=<name>' in err
