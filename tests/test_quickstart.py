"""mortal.tools.quickstart: embedded config, process control, and the CI-sized end-to-end run."""

import io
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from mortal import config as mcfg
from mortal.tools import quickstart, quickstart_config

from conftest import ROOT


@pytest.mark.parametrize('preset', ['full', 'short'])
def test_embedded_config_satisfies_every_process(tmp_path, preset):
    path = quickstart_config.write_config(tmp_path, preset=preset, port=5123)
    sections = mcfg.ONLINE_TRAIN_SECTIONS + mcfg.SERVER_SECTIONS + mcfg.CLIENT_SECTIONS + mcfg.TRAIN_GRP_SECTIONS
    cfg = mcfg.load_config(path, required=sections)
    assert cfg['online']['remote']['port'] == 5123
    assert cfg['control']['version'] == 3 and cfg['control']['device'] == 'cpu'
    # every path lives under the work dir
    work = str(tmp_path.resolve())
    for dotted in ('control.state_file', 'control.tensorboard_dir', 'online.server.buffer_dir', 'grp.state_file',
                   'bootstrap.log_dir', 'baseline.test.state_file'):
        node = cfg
        for part in dotted.split('.'):
            node = node[part]
        assert node.startswith(work + '/'), dotted
    # the server must hold at least one client round, and tests come after whole saves
    assert cfg['online']['server']['capacity'] >= cfg['train_play']['default']['games']
    # the GRP is saved (and validated) every save_every steps; early stopping is on in the embedded config
    assert cfg['bootstrap']['grp_steps'] % cfg['grp']['control']['save_every'] == 0
    assert cfg['bootstrap']['grp_patience'] >= 1
    assert cfg['bootstrap']['offline_max_epochs'] > 1 and cfg['bootstrap']['offline_patience'] >= 1
    assert cfg['env']['reward'] == 'grp'  # until the bootstrap's GRP check says otherwise


def test_the_quickstart_work_dir_can_be_moved(tmp_path):
    # issue 36: continuing from the quickstart's work dir took 18 path rewrites by hand once it was moved or copied
    path = quickstart_config.write_config(tmp_path / 'qs', preset='short', port=5123, relative=True)
    assert "state_file = '{config_dir}/online/mortal.pth'" in path.read_text()
    moved = tmp_path / 'elsewhere'
    (tmp_path / 'qs').rename(moved)
    sections = mcfg.ONLINE_TRAIN_SECTIONS + mcfg.SERVER_SECTIONS + mcfg.CLIENT_SECTIONS + mcfg.TRAIN_GRP_SECTIONS
    cfg = mcfg.load_config(moved / 'config.toml', required=sections)
    typed = mcfg.typed(cfg)
    assert typed.control.state_file == f'{moved}/online/mortal.pth'
    assert typed.online.server.buffer_dir == f'{moved}/online/buffer'
    assert typed.dataset.globs == [f'{moved}/bootstrap/logs/train/**/*.json.gz']
    assert typed.grp.state_file == f'{moved}/bootstrap/grp.pth'


def test_the_summary_ends_with_the_next_commands_for_its_work_dir():
    # issue 36: from the quickstart to the three terminals was a research project
    result = {'timings': {'total': 60.0}, 'work_dir': '/w/qs', 'config': '/w/q s/config.toml',
              'tensorboard': ['/w/q s/online/tensorboard'], 'checkpoints': {}, 'logs': 'l', 'plots': 'p',
              'test_play': {}, 'stopped': {}}
    out = io.StringIO()
    quickstart.report(result, out)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('next: '))
    assert lines[start + 1:start + 7] == [
        "  export MORTAL_CFG='/w/q s/config.toml'",
        '  export OMP_NUM_THREADS=1    # CPU: small models run far faster single-threaded',
        '  python -m mortal.server      # terminal 1',
        '  python -m mortal.train       # terminal 2: the learner (under its supervisor)',
        '  python -m mortal.client      # terminal 3 (a 2nd client: its own [train_play.<name>], '
        'TRAIN_PLAY_PROFILE=<name>)',
        "  tensorboard --logdir '/w/q s/online/tensorboard'"]


def test_version_4_config_and_a_work_dir_keeps_its_version(tmp_path):
    path = quickstart_config.write_config(tmp_path, preset='short', port=5123, version=4)
    cfg = mcfg.load_config(path, required=mcfg.ONLINE_TRAIN_SECTIONS)
    assert cfg['control']['version'] == 4
    assert quickstart_config.write_config(tmp_path, preset='short', port=5123, version=4) == path  # rerun: same version
    with pytest.raises(ValueError, match='set up for version 4'):
        quickstart_config.write_config(tmp_path, preset='short', version=3)
    with pytest.raises(ValueError, match='3 or 4'):
        quickstart_config.render_config(tmp_path, version=2)


@pytest.mark.parametrize('name', ["it's", "a'\nonline = false\nb"])
def test_a_work_folder_a_toml_literal_cannot_hold_is_refused_not_injected(tmp_path, name):
    # pasted into '...' it ended the string: an unreadable config, or keys of the folder name's choosing
    with pytest.raises(ValueError, match=r"holds a quote \(\'\) or a control character"):
        quickstart_config.write_config(tmp_path / name, preset='short', port=5123)
    assert not (tmp_path / name / 'config.toml').exists()
    # the quickstart's own config names its folder '{config_dir}': any folder name works there
    path = quickstart_config.write_config(tmp_path / name, preset='short', port=5123, relative=True)
    assert mcfg.load_config(path, required=mcfg.ONLINE_TRAIN_SECTIONS)['control']['online'] is True


def test_the_processes_start_from_the_repository():
    # mortal/tools/quickstart.py sits two floors below the repository: its children run there (cwd, PYTHONPATH)
    from conftest import ROOT
    assert quickstart.ROOT == pathlib.Path(ROOT).resolve()
    assert (quickstart.ROOT / 'scripts' / 'plot_tb.py').is_file() and (quickstart.ROOT / 'mortal' / 'server.py').is_file()


def _spawn(code):
    return subprocess.Popen([sys.executable, '-c', code], start_new_session=True)


@pytest.mark.slow
def test_stop_terminates_then_kills():
    polite = _spawn('import time; time.sleep(60)')
    stubborn = _spawn('import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
                      'print("ready", flush=True); time.sleep(60)')
    time.sleep(1.0)  # let the stubborn one install its handler
    t = time.monotonic()
    outcome = quickstart.stop({'polite': polite, 'stubborn': stubborn}, grace=2)
    assert outcome == {'polite': f'exited {-signal.SIGTERM}', 'stubborn': 'killed'}
    assert time.monotonic() - t < 10
    assert polite.poll() is not None and stubborn.poll() is not None


@pytest.mark.slow
def test_wait_for_online_reports_a_dead_process(tmp_path):
    (tmp_path / 'server.log').write_text('line 1\nTraceback: boom\n')
    dead = subprocess.Popen([sys.executable, '-c', 'raise SystemExit(3)'])
    dead.wait()
    with pytest.raises(RuntimeError, match=r'server exited with status 3(.|\n)*Traceback: boom'):
        quickstart.wait_for_online({'server': dead}, str(tmp_path), tmp_path, timeout=5, poll=0.1)


@pytest.mark.slow
def test_wait_for_online_times_out(tmp_path):
    alive = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    try:
        with pytest.raises(RuntimeError, match='no test play'):
            quickstart.wait_for_online({'client': alive}, str(tmp_path), tmp_path, timeout=0.5, poll=0.1)
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_short_quickstart_end_to_end(tmp_path):
    """The CI-sized run of the README's main job: bootstrap, server + trainer + client, test play, training on."""
    env = dict(os.environ)
    env.pop('RUST_BACKTRACE', None)
    r = subprocess.run([sys.executable, '-m', 'mortal.tools.quickstart', '--short', '--no-progress',
                        '--work-dir', str(tmp_path / 'qs')], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = r.stdout
    assert 'quickstart finished in' in out
    assert 'test_play (challenger `mortal` vs 3x baseline' in out
    assert '(not written)' not in out  # every listed checkpoint exists
    # the summary's duplicate evaluation of best.pth and the final model against 3x the start (4 deals, 16 games)
    assert 'evaluation against 3x the start model' in out
    assert re.search(r'  final [1-4]\.\d{3} ± \d\.\d{3} rank, [-+]\d+\.\d\d ± \d+\.\d\d pt '
                     r'\(16 games; unreliable: 4 sets\)', out), out
    assert "  export MORTAL_CFG=" in out and '  python -m mortal.train ' in out  # the next commands
    work = tmp_path / 'qs'
    for rel in ('online/mortal.pth', 'online/best.pth', 'online/baseline.pth', 'bootstrap/grp.pth',
                'bootstrap/offline/best.pth', 'plots/test_play.png', 'plots/loss.png'):
        assert (work / rel).is_file(), rel
    # the embedded config trains on after its test play ([online] restart_after_test_play = false): one learner
    # start (its own event file) whose losses go on past the test play's step
    assert len(list((work / 'online' / 'tensorboard').glob('events.out.tfevents.*'))) == 1
    scalars = quickstart.read_scalars(str(work / 'online' / 'tensorboard'), prefix='')
    tested = scalars['test_play/avg_ranking'][0][0]
    assert max(step for step, _ in scalars['loss/dqn_loss']) > tested
    # the start against 3 RulebaseBots (2 deals with --short) and the reward the bootstrap chose
    assert re.search(r'start vs 3 RulebaseBots: avg rank [1-4]\.\d{3} ± \d\.\d{3} \(95% CI, 2 deals = 8 games',
                     out), out
    assert re.search(r"kyoku reward: \[env\] reward = '(grp|points)'", out), out
    # the processes were stopped by signal (SIGTERM), not left running
    assert "'server': 'exited" in out or "'server': 'killed'" in out
    assert 'leaked semaphore' not in r.stderr  # the pools' workers were closed, not terminated


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gen_logs_and_evaluation_pool_workers_exit_without_being_terminated(tmp_path, monkeypatch):
    """Each pool worker's arena takes tqdm's lock, a named semaphore under forkserver: a worker the pool's exit
    terminates leaks it, and the resource tracker warned of it at the quickstart's end."""
    import multiprocessing.process
    from mortal.config import load_config
    from mortal.play.evaluation import play_duplicate
    from mortal.tools.rulebase_games import gen_logs
    terminated = []
    real = multiprocessing.process.BaseProcess.terminate

    def terminate(self):
        terminated.append(self.name)
        real(self)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, 'terminate', terminate)
    cfg = load_config(quickstart_config.write_config(tmp_path, preset='short'))
    cfg['bootstrap'].update(games=4, val_games=0, workers=2)
    assert gen_logs(cfg, progress=False) == 4
    units = play_duplicate(('rulebase', None), ('rulebase', None), sets=2, key=7, chunk=1, workers=2)
    assert sorted(len(r) for r in units.values()) == [4, 4]
    assert terminated == []


def test_start_vs_rulebase_line(tmp_path, monkeypatch):
    """The summary's line: the start model (the test baseline) as challenger against 3x ('rulebase', None)."""
    from mortal.config import load_config
    from mortal.play import evaluation
    config = load_config(quickstart_config.write_config(tmp_path, preset='short', port=5123))
    assert quickstart.evaluate_start_vs_rulebase(config, 2) is None  # no start model yet
    start = config['baseline']['test']['state_file']
    os.makedirs(os.path.dirname(start))
    open(start, 'wb').close()
    calls = []

    def fake_play(challenger, champion, *, sets, key, workers, progress=None):
        calls.append((challenger, champion, sets, key))
        return {10000: [1, 2, 3, 4], 10001: [2, 3, 3, 4]}  # per deal: mean 2.5 and 3.0

    monkeypatch.setattr(evaluation, 'play_duplicate', fake_play)
    summary = quickstart.evaluate_start_vs_rulebase(config, 2)
    assert calls == [(('mortal', start), ('rulebase', None), 2, quickstart.EVAL_KEY)]
    assert (summary['avg_rank'], summary['deals'], summary['games']) == (2.75, 2, 8)
    result = {'timings': {'total': 60.0}, 'work_dir': 'w', 'config': 'c', 'tensorboard': ['tb'], 'checkpoints': {},
              'logs': 'l', 'plots': 'p', 'test_play': {}, 'rulebase': summary, 'reward': 'points', 'stopped': {}}
    out = io.StringIO()
    quickstart.report(result, out)
    text = out.getvalue()
    assert f"start vs 3 RulebaseBots: avg rank 2.750 ± {summary['avg_rank_ci']:.3f} (95% CI, 2 deals = 8 games; unreliable: 2 sets; 2.500 = even)" in text
    assert "kyoku reward: [env] reward = 'points'" in text
    assert quickstart_config.PRESETS['full']['rulebase_sets'] == 40  # 160 games by default
    # a new user's trial: nothing said whether 2.86 against the bots or a final level with the start was expected,
    # and 'exited 143' read as a failure
    assert '  reading them: a start cloned from a few rule-based hanchan is expected below its teacher' in text
    assert text.splitlines()[text.splitlines().index('processes:    {}') - 1].startswith('kyoku reward:')
    out = io.StringIO()
    quickstart.report({**result, 'rulebase': None, 'stopped': {'server': 'exited 143', 'client': 'killed'}}, out)
    assert 'reading them' not in out.getvalue()
    assert ("processes:    {'server': 'exited 143', 'client': 'killed'}  (143: stopped by SIGTERM, the normal end)"
            in out.getvalue())


@pytest.mark.parametrize('reward, note', [('grp', ''), ('points', "  (unused: [env] reward = 'points')")])
def test_the_summary_names_the_port_and_an_unused_grp(tmp_path, reward, note):
    # a new user's trial: the GRP was listed as if in use after the bootstrap fell back to 'points', and the
    # quickstart's free port was only in the config
    grp = tmp_path / 'grp.pth'
    grp.write_bytes(b'x')
    result = {'timings': {'total': 60.0}, 'work_dir': 'w', 'config': 'c', 'server': '127.0.0.1:40123',
              'tensorboard': ['tb'], 'checkpoints': {'grp': str(grp), 'baseline': str(tmp_path / 'none.pth')},
              'logs': 'l', 'plots': 'p', 'test_play': {}, 'reward': reward, 'stopped': {}}
    out = io.StringIO()
    quickstart.report(result, out)
    lines = out.getvalue().splitlines()
    assert 'server:       127.0.0.1:40123  ([online.remote] in the config)' in lines
    assert f'checkpoint:   grp              {grp}{note}' in lines
    assert f"checkpoint:   baseline         {tmp_path / 'none.pth'}  (not written)" in lines


def _weights(path, scale, step=0):
    import torch
    torch.save({'mortal': {'w': torch.arange(4.0) * scale}, 'current_dqn': {'v': torch.ones(2) * scale},
                'steps': step, 'timestamp': float(step)}, path)


def test_same_weights_compares_the_networks_only(tmp_path):
    a, b, c, d = (tmp_path / f'{n}.pth' for n in 'abcd')
    _weights(a, 1.0, step=10)
    _weights(b, 1.0, step=20)  # other step and timestamp, same networks
    _weights(c, 2.0, step=10)
    import torch
    torch.save({'mortal': {'w': torch.arange(4.0)}}, d)  # no current_dqn
    assert quickstart.same_weights(a, b) is True
    assert quickstart.same_weights(a, c) is False
    assert quickstart.same_weights(a, d) is False
    e, f = tmp_path / 'e.pth', tmp_path / 'f.pth'
    torch.save({'mortal': {'w': torch.arange(4.0)}, 'current_dqn': {'v': torch.zeros(2)}}, e)  # only the DQN differs
    torch.save([1, 2], f)  # not a checkpoint dict
    assert quickstart.same_weights(a, e) is False
    assert quickstart.same_weights(a, f) is False
    (tmp_path / 'g.pth').write_bytes(b'not a checkpoint')
    assert quickstart.same_weights(a, tmp_path / 'g.pth') is False  # unreadable: played, not assumed
    assert quickstart.same_weights(a, tmp_path / 'missing.pth') is False


@pytest.mark.parametrize('final_scale, plays', [(1.0, 1), (2.0, 2)])
def test_final_with_best_weights_is_not_played_again(tmp_path, monkeypatch, final_scale, plays):
    from mortal.config import load_config
    from mortal.play import evaluation
    config = load_config(quickstart_config.write_config(tmp_path, preset='short', port=5123))
    best, final = config['control']['best_state_file'], config['control']['state_file']
    os.makedirs(os.path.dirname(best), exist_ok=True)
    _weights(best, 1.0, step=60)
    _weights(final, final_scale, step=60)
    calls, ticks = [], []

    def fake_play(challenger, champion, *, sets, key, workers, progress=None):
        calls.append(challenger)
        if progress:
            progress(4 * sets)
        return {10000: [1, 2, 3, 4], 10001: [2, 3, 3, 4]}

    monkeypatch.setattr(evaluation, 'play_duplicate', fake_play)
    monkeypatch.setattr(quickstart, '_games_bar', lambda label, total, progress: _Bar(ticks, label, total))
    out = quickstart.evaluate_against_start(config, 2, progress=True)
    assert calls == [('mortal', best), ('mortal', final)][:plays]
    assert ticks == [('eval best vs 3x start', 8, 8), ('eval final vs 3x start', 8, 8)][:plays]
    assert out['final']['avg_rank'] == out['best']['avg_rank'] == 2.75
    assert out['final'].get('same_as') == ('best' if plays == 1 else None)
    result = {'timings': {'total': 60.0}, 'work_dir': 'w', 'config': 'c', 'tensorboard': ['tb'], 'checkpoints': {},
              'logs': 'l', 'plots': 'p', 'test_play': {}, 'evaluation': out, 'stopped': {}}
    text = io.StringIO()
    quickstart.report(result, text)
    assert ('(same weights as best: not played again)' in text.getvalue()) == (plays == 1)


class _Bar:
    """A stand-in for the tqdm bar: records (label, total, games counted) at close."""

    def __init__(self, ticks, label, total):
        self.ticks, self.label, self.total, self.n = ticks, label, total, 0

    def update(self, n):
        self.n += n

    def close(self):
        self.ticks.append((self.label, self.total, self.n))


def test_the_learners_bar_is_drawn_on_a_terminal_only(monkeypatch):
    # a new user's `nohup python -m mortal.train > train.log` got 86 KB of bar redraws in 3 minutes
    import io
    from types import SimpleNamespace
    from mortal.train import Trainer

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    host = SimpleNamespace(dist=SimpleNamespace(is_main=True), save_every=20, steps=45)
    for stream, drawn in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, 'stderr', stream)
        bar = Trainer._progress_bar(host)
        bar.update(2)
        off = bool(bar.disable)  # close() sets it
        bar.close()
        assert off != drawn and ('TRAIN' in stream.getvalue()) == drawn
    assert bar.n == 7 and '7/20' in stream.getvalue()  # the cycle's 5 steps done, and 2 more


def test_children_draw_no_bar_into_their_log_file(tmp_path):
    """The pipeline's processes write to log files: a tqdm bar there is kept at every redraw, so their environment
    turns bars off (tqdm reads TQDM_DISABLE as its default, for bars without an explicit setting)."""
    env = quickstart.child_env(tmp_path / 'config.toml')
    assert env['TQDM_DISABLE'] == '1'
    code = ('import sys\nfrom tqdm.auto import tqdm\nbar = tqdm(total=3, desc="TRAIN")\nbar.update(3)\nbar.close()\n'
            'print(bar.disable)')
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == 'True' and 'TRAIN' not in out.stderr


def test_ctrl_c_ends_with_one_line_and_status_130(tmp_path, monkeypatch, caplog):
    """Ctrl-C during the run: no traceback, a line naming the work folder to rerun with, exit status 130."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(quickstart, 'run', interrupted)
    work = str(tmp_path / 'qs')
    assert quickstart.main(['--work-dir', work, '--no-progress']) == 130
    assert any('stopped by Ctrl-C' in r.getMessage() and work in r.getMessage() for r in caplog.records)


def test_the_grp_globs_are_those_the_bootstrap_indexes(tmp_path):
    """Else the doctor warns on the quickstart's untouched config, and the next GRP run rebuilds the index."""
    from mortal.config import load_config, typed
    from mortal.tools import bootstrap
    config = load_config(quickstart_config.write_config(tmp_path, preset='short', port=5123))
    indexed = bootstrap._grp_config(config, typed(config).bootstrap).dataset
    written = typed(config).grp.dataset
    assert (written.train_globs, written.val_globs) == (indexed.train_globs, indexed.val_globs)
    assert written.train_globs[0].endswith('/bootstrap/logs/train/*.json.gz')


def test_without_restarts_the_online_phase_waits_for_a_save_after_the_test_play(tmp_path, caplog):
    from torch.utils.tensorboard import SummaryWriter
    with pytest.raises(RuntimeError), caplog.at_level(logging.INFO, 'mortal'):
        quickstart.wait_for_online({}, str(tmp_path), tmp_path, timeout=0, poll=0, restarts=False)
    writer = SummaryWriter(str(tmp_path))
    writer.add_scalar('loss/dqn_loss', 1.0, 10)
    writer.flush()
    with pytest.raises(RuntimeError), caplog.at_level(logging.INFO, 'mortal'):
        quickstart.wait_for_online({}, str(tmp_path), tmp_path, timeout=0, poll=0, restarts=False)
    writer.add_scalar('loss/dqn_loss', 1.0, 20)
    writer.add_scalar('test_play/avg_ranking', 2.5, 20)  # the test play of step 20, after its save
    writer.flush()
    with pytest.raises(RuntimeError, match='no test play \\+ save after it'), caplog.at_level(logging.INFO, 'mortal'):
        quickstart.wait_for_online({}, str(tmp_path), tmp_path, timeout=0, poll=0, restarts=False)
    # a new user's trial read 'test_play logged: False, learner starts: 0, trained after it: False' as cryptic
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith('online:')] == [
        "online: waiting for the learner's first save",
        'online: learner started 1 time(s); training until its first test play',
        'online: learner started 1 time(s); test play done, waiting for a save after it']
    writer.add_scalar('loss/dqn_loss', 0.9, 40)  # the same learner's next save
    writer.flush()
    quickstart.wait_for_online({}, str(tmp_path), tmp_path, timeout=0, poll=0, restarts=False)
    with pytest.raises(RuntimeError, match='no test play \\+ restart'):  # Mortal's cycle needs a second start
        quickstart.wait_for_online({}, str(tmp_path), tmp_path, timeout=0, poll=0)
    writer.close()


def test_a_learner_counts_as_started_once_it_has_written_scalars(tmp_path):
    # the quickstart stops the processes after a restart: not while the new learner is still starting
    from torch.utils.tensorboard import SummaryWriter
    trained = SummaryWriter(str(tmp_path), filename_suffix='.a')
    trained.add_scalar('loss/dqn_loss', 1.0, 20)
    trained.close()
    starting = SummaryWriter(str(tmp_path), filename_suffix='.b')  # its event file exists, without scalars
    starting.flush()
    assert len(list(tmp_path.glob('events.out.tfevents.*'))) == 2
    assert quickstart.learner_starts(str(tmp_path)) == 1
    starting.add_scalar('loss/dqn_loss', 2.0, 40)
    starting.flush()
    assert quickstart.learner_starts(str(tmp_path)) == 2
    starting.close()
