"""Issue 36, days without babysitting: a config typo saved while training runs is waited for instead of ending the
run, every start says what it runs with and every restart what changed, a client that gets no new parameters says
so, and every stop says why and what it kept. Each test failed before its change."""

import logging
import re
import threading
import time

import pytest

from conftest import load_tiny_config, wait_until
from mortal.config import ONLINE_TRAIN_SECTIONS
from mortal.learning import supervisor


class Lines(logging.Handler):
    """The messages of ``mortal.train`` as they come (a thread reads them while the supervisor runs)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))

    def has(self, text):
        return any(text in m for _, m in self.records)


@pytest.fixture
def train_lines():
    """A ``Lines`` on the ``mortal.train`` logger at INFO for the test's length."""
    lines = Lines()
    logger = logging.getLogger('mortal.train')
    logger.addHandler(lines)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(lines)
    logger.setLevel(old_level)


def counting_learner(tmp_path, cfg, edit, status):
    """A fake learner script and the file counting its runs: run n (from 0) replaces ``edit[0]`` with ``edit[1]``
    in ``cfg`` when n is 0, and exits with the Python expression ``status`` of n."""
    counter, script = tmp_path / 'n', tmp_path / 'learner.py'
    script.write_text(
        'import os, sys\n'
        f'p, cfg = {str(counter)!r}, {str(cfg)!r}\n'
        'n = int(open(p).read()) if os.path.exists(p) else 0\n'
        'open(p, "w").write(str(n + 1))\n'
        'if n == 0:\n'
        f'    text = open(cfg).read().replace({edit[0]!r}, {edit[1]!r})\n'
        '    open(cfg, "w").write(text)\n'
        f'sys.exit({status})\n')
    return script, counter


def supervise_while(script, cfg, user, **kwargs):
    """``supervisor.supervise`` of ``script`` on the online config ``cfg`` (``kwargs`` added) while ``user()`` runs
    on a thread, as a person editing the file; returns the supervisor's status."""
    thread = threading.Thread(target=user)
    thread.start()
    try:
        return supervisor.supervise([], script=str(script), restart_delay=0.05, config_path=str(cfg),
                                    required=ONLINE_TRAIN_SECTIONS, env={}, **kwargs)
    finally:
        thread.join(timeout=60)



def test_a_typo_saved_while_training_waits_then_resumes_once_fixed(tmp_path, train_lines):
    lines = train_lines
    # The first learner saves `batch_sise` into the running config (as a user's editor would) and exits 0, as after a
    # test play; the supervisor must not start a learner on it (on main it did, which failed with status 2 and
    # ended the run) but wait, say why at ERROR, remind, and start the next learner once the file is fixed.
    _, cfg = load_tiny_config(tmp_path, online=True)
    good = cfg.read_text()
    assert re.search(r'^batch_size = 8$', good, re.M) and re.search(r'^test_every = 4$', good, re.M)
    script, counter = counting_learner(tmp_path, cfg, ('batch_size = 8', 'batch_sise = 8'), '0 if n == 0 else 3')
    def fix():
        wait_until(lambda: lines.has('still waiting for a valid config'))  # it waits, and says so again
        assert counter.read_text() == '1'  # no learner was started on the broken file
        cfg.write_text(good.replace('test_every = 4', 'test_every = 8'))  # fixed, and one key changed

    code = supervise_while(script, cfg, fix, retry_interval=0.05, remind_every=0.2)
    assert code == 3 and counter.read_text() == '2'  # the second learner ran on the fixed file
    errors = [m for level, m in lines.records if level == logging.ERROR]
    assert errors[0].startswith(f'config {cfg} is broken: the learner is not restarted until it is fixed')
    assert 'batch_size' in errors[0]
    assert any(m.startswith('config ') and 'is valid again' in m for _, m in lines.records)
    assert 'config changed since the last start: [control] test_every 4 -> 8' in [m for _, m in lines.records]
    # the learner's own error still ends the run once the config is valid (the fake exits 3): at ERROR
    assert errors[-1] == 'learner exited with status 3: stopping'


def test_an_edit_saved_while_the_learner_runs_is_judged_at_once(tmp_path, train_lines):
    lines = train_lines
    # A user saves a typo, then a fix with one changed key, while a learner runs (it would only restart after its
    # next test play, maybe an hour later). On main nothing was said until that restart; now each save is judged
    # within two watch intervals, while the same learner still runs.
    _, cfg = load_tiny_config(tmp_path, online=True)
    good = cfg.read_text()
    release = tmp_path / 'release'
    script = tmp_path / 'learner.py'
    script.write_text(
        'import os, sys, time\n'
        f'deadline = time.time() + 60\n'
        f'while not os.path.exists({str(release)!r}) and time.time() < deadline:\n'
        '    time.sleep(0.02)\n'
        'sys.exit(4)\n')
    def edit():
        wait_until(lambda: lines.has('learner started'))
        cfg.write_text(good.replace('batch_size = 8', 'batch_sise = 8'))
        wait_until(lambda: lines.has('was saved with errors'))
        cfg.write_text(good.replace('test_every = 4', 'test_every = 8'))
        wait_until(lambda: lines.has('saved: valid'))
        release.write_text('')

    code = supervise_while(script, cfg, edit, retry_interval=0.05, remind_every=60, watch_interval=0.05)
    assert code == 4  # one learner ran throughout: both verdicts came while it ran
    errors = [m for level, m in lines.records if level == logging.ERROR]
    assert errors[0].startswith(f'config {cfg} was saved with errors: the running learner keeps its config')
    assert 'batch_sise' in errors[0] or 'batch_size' in errors[0]
    assert f"config {cfg} saved: valid; at the learner's next start: [control] test_every 4 -> 8" in \
        [m for _, m in lines.records]


def test_a_learner_failing_on_a_broken_config_is_waited_for(tmp_path):
    # A config broken after the supervisor's check (the learner fails on it with status 2): the supervisor waits
    # for the fix instead of stopping.
    _, cfg = load_tiny_config(tmp_path, online=True)
    good = cfg.read_text()
    script, counter = counting_learner(tmp_path, cfg, ('batch_size = 8', 'batch_size = -8'),
                                       '2 if n == 0 else 0 if n == 1 else 5')
    seen = []

    def fix():
        wait_until(lambda: counter.exists())
        time.sleep(0.3)
        seen.append(counter.read_text())
        cfg.write_text(good)

    code = supervise_while(script, cfg, fix, retry_interval=0.05, remind_every=60)
    assert seen == ['1'] and code == 5 and counter.read_text() == '3'


def test_a_stop_while_waiting_for_the_config_ends_the_wait(tmp_path):
    _, cfg = load_tiny_config(tmp_path, online=True)
    cfg.write_text(cfg.read_text().replace('batch_size = 8', 'batch_sise = 8'))
    asked = []

    def stop_requested():
        asked.append(1)
        return len(asked) > 3

    assert supervisor.wait_for_config(str(cfg), ONLINE_TRAIN_SECTIONS, {}, stop_requested=stop_requested,
                                      retry_interval=0.01) is None


# -- every start says what it runs with; every stop why and what it kept -------------------------------------------

def run_until(cmd, cfg, ready, tmp_path):
    """Start ``python -m <cmd> -c cfg``, wait for a stderr line containing ``ready``, SIGTERM it; returns
    ``(status, stderr lines)``."""
    import os
    import signal
    import subprocess
    import sys
    from conftest import ROOT
    err = tmp_path / f'{cmd}.err'
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'PYTHONUNBUFFERED': '1'}
    env.pop('MORTAL_CFG', None)
    with open(err, 'w') as f:
        proc = subprocess.Popen([sys.executable, '-m', cmd, '-c', str(cfg)], stderr=f, stdout=subprocess.DEVNULL,
                                cwd=ROOT, env=env)
    try:
        wait_until(lambda: ready in err.read_text() or proc.poll() is not None, timeout=120)
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
    finally:
        proc.kill()
    return status, [line.split(': ', 1)[-1] for line in err.read_text().splitlines()]


def test_server_says_its_settings_at_start_and_why_it_stopped(tmp_path):
    # issue 36: the server printed no settings and stopped on SIGTERM (status 143) without a line
    config, cfg = load_tiny_config(tmp_path, online=True)
    port = config['online']['remote']['port']
    status, lines = run_until('mortal.server', cfg, 'listening on', tmp_path)
    assert status == 143
    assert f'settings (config {cfg}):' in lines
    assert f"  [online.remote] host = '127.0.0.1', port = {port}" in lines
    assert (f"  [online.server] capacity = 4, force_sequential = false, buffer_dir = '{tmp_path / 'buffer'}', "
            f"drain_dir = '{tmp_path / 'drain'}'") in lines
    assert lines[-1] == 'stopped on SIGTERM; no buffered log discarded; no parameters held'


@pytest.mark.slow
def test_client_says_its_settings_at_start_and_why_it_stopped(tmp_path):
    # no server: the client waits for it; a SIGTERM then ends it with a line (on main: none, status 143)
    from conftest import write_baseline
    config, cfg = load_tiny_config(tmp_path, online=True)
    write_baseline(config, config['baseline']['train']['state_file'])  # else it waits for the trainer's first
    status, lines = run_until('mortal.client', cfg, 'unreachable', tmp_path)
    assert status == 143
    assert (f"  [train_play.default] games = 4, boltzmann_epsilon = 0.005, boltzmann_temp = 0.05, top_p = 1.0, "
            f"repeats = 1, log_dir = '{tmp_path / 'train_play'}'") in lines
    assert "  [control] version = 3, device = 'cpu'" in lines
    assert lines[-1] == 'stopped on SIGTERM; no round in progress; 0 rounds submitted'


def test_a_stopped_round_says_how_many_games_it_discards(tmp_path):
    # "stopped on SIGTERM; round in progress discarded (9 of 16 games)": a round stopped after 9 of its 16 games
    import signal
    from mortal import client as cl
    from mortal.entry import Stopped
    config, _ = load_tiny_config(tmp_path, online=True)
    log_dir = tmp_path / 'round'
    log_dir.mkdir()

    class Player:
        seed_count = 4  # 16 games
        log_dir = str(tmp_path / 'round')

        def train_play(self, mortal, dqn, device):
            for i in range(9):
                (log_dir / f'{i}.json.gz').write_bytes(b'')
            raise Stopped(signal.SIGTERM)

    client = cl.Client(config, train_player=Player(), remote=object(), sleep=lambda s: None)
    client.sync_params = lambda: None
    with pytest.raises(Stopped):
        client.run_round()
    assert client.stop_summary() == 'round in progress discarded (9 of 16 games, parameters version -1); 0 rounds ' \
                                    'submitted'


def _learners_last_line(trainer, run, monkeypatch, caplog) -> str:
    """Run ``run_learner`` with ``trainer`` doing ``run`` (which must end in a stop): its last log line."""
    from mortal import train as tr
    trainer.run = run
    monkeypatch.setattr(tr, 'Trainer', lambda config, dist=None: trainer)
    with caplog.at_level(logging.INFO, logger=tr.logger.name):
        assert tr.run_learner(trainer.config) == 143
    return caplog.records[-1].getMessage()


def test_a_stopped_learner_says_what_it_kept(tmp_path, monkeypatch, caplog):
    # issue 36: a learner stopped on SIGTERM ended without a word; now its last line says why and which steps were
    # lost since its last save
    import signal
    from conftest import FakeTestPlayer, FakeWriter, fake_trainer, random_batch
    from mortal.entry import Stopped
    config, _ = load_tiny_config(tmp_path, online=False, control={'save_every': 2, 'test_every': 100})
    trainer = fake_trainer(config, test_player=FakeTestPlayer([]), writer=FakeWriter())

    def run():
        for i in range(3):  # a save at step 2; step 3 is not saved
            trainer.train_batch(*random_batch(seed=i))
        raise Stopped(signal.SIGTERM)

    assert _learners_last_line(trainer, run, monkeypatch, caplog) == (
        f'stopped on SIGTERM at step 3; the 1 steps since the last save discarded ({trainer.state_file} keeps '
        'step 2)')
    trainer.saved_steps = None
    assert trainer.stop_summary() == 'the 3 steps trained discarded (no checkpoint written yet)'


def test_a_stop_inside_a_test_play_says_it_was_cut_short(tmp_path, monkeypatch, caplog):
    # a new user's trial: a learner stopped during its test play said "nothing discarded", and its restart went on
    # to the next test play without a word about the one cut short
    import signal
    from conftest import FakeTestPlayer, FakeWriter, fake_trainer, random_batch
    from mortal.entry import Stopped
    config, _ = load_tiny_config(tmp_path, online=False, control={'save_every': 2, 'test_every': 2})
    trainer = fake_trainer(config, test_player=FakeTestPlayer([]), writer=FakeWriter())

    def stopped_inside():
        raise Stopped(signal.SIGTERM)
    monkeypatch.setattr(trainer.guards, 'test_play', stopped_inside)

    def run():
        for i in range(2):  # the save and the test play at step 2
            trainer.train_batch(*random_batch(seed=i))
        raise AssertionError('the stop inside the test play did not end the learner')

    assert _learners_last_line(trainer, run, monkeypatch, caplog) == (
        f'stopped on SIGTERM at step 2; nothing discarded ({trainer.state_file} holds step 2); the test play of step 2 '
        'cut short (next: step 4)')


def test_a_sigterm_inside_a_checkpoint_write_lands_after_it(tmp_path, monkeypatch, caplog):
    # a SIGTERM in torch's zip writer (about 3% of stops: 45 ms of every 20 steps) ended the learner with status 1
    # and a traceback ("unexpected pos"); now the write finishes, and the stop says the checkpoint holds its step
    import os
    import signal
    import torch
    from conftest import FakeTestPlayer, FakeWriter, fake_trainer, random_batch
    from mortal import entry
    config, _ = load_tiny_config(tmp_path, online=False, control={'save_every': 2, 'test_every': 100})
    trainer = fake_trainer(config, test_player=FakeTestPlayer([]), writer=FakeWriter())
    real_save, written = torch.save, []

    def save_hit_by_sigterm(obj, f, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # lands while the file is being written
        real_save(obj, f, *args, **kwargs)
        written.append(obj['steps'])
    monkeypatch.setattr(torch, 'save', save_hit_by_sigterm)

    def run():
        for i in range(2):  # the save at step 2 is hit
            trainer.train_batch(*random_batch(seed=i))
        raise AssertionError('the stop did not land after the save')

    previous = entry.stop_on_sigterm()
    try:
        last_line = _learners_last_line(trainer, run, monkeypatch, caplog)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert written == [2]
    assert torch.load(trainer.state_file, weights_only=False)['steps'] == 2  # whole, and this step's
    assert last_line == f'stopped on SIGTERM at step 2; nothing discarded ({trainer.state_file} holds step 2)'


@pytest.mark.parametrize('signum', ['SIGINT', 'SIGTERM'])
def test_stops_deferred_hands_the_first_stop_to_its_own_handler_on_leaving(signum):
    import os
    import signal
    from mortal import entry
    signum = getattr(signal, signum)
    previous = entry.stop_on_sigterm()
    # Python's own Ctrl-C handler (a background job starts with SIGINT ignored)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    steps = []
    try:
        with pytest.raises(KeyboardInterrupt) as stop:  # Stopped is a KeyboardInterrupt
            with entry.stops_deferred():
                os.kill(os.getpid(), signum)
                steps.append('after the signal')
                os.kill(os.getpid(), signal.SIGINT)  # a second stop: the first decides
                steps.append('done')
        assert steps == ['after the signal', 'done']
        assert entry.stop_cause(stop.value) == signal.Signals(signum).name
        # the handlers are back: outside, a stop lands at once
        assert signal.getsignal(signal.SIGTERM) is entry._raise_stopped
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with entry.stops_deferred():
            steps.append('no stop')
        assert steps[-1] == 'no stop'
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def test_changed_keys_name_each_key_with_both_values():
    from mortal.util.config_diff import changed_keys
    old = {'control': {'test_every': 600, 'device': 'cpu'}, 'train_play': {'default': {'boltzmann_epsilon': 0.005}},
           'guard': {'keep': 3}}
    new = {'control': {'test_every': 300, 'device': 'cpu'}, 'train_play': {'default': {'boltzmann_epsilon': 0.01}},
           'online': {'anchor_weight': 1.0}}
    assert changed_keys(old, new) == ['[control] test_every 600 -> 300',
                                      '[train_play.default] boltzmann_epsilon 0.005 -> 0.01 (used by clients: at '
                                      'their restart)',
                                      '[online] anchor_weight (unset) -> 1.0', '[guard] keep 3 -> (unset)']
    assert changed_keys(new, new) == []
    # the server's table, not the learner's: the line says so (the new user read a client key as applied)
    assert changed_keys({'online': {'server': {'capacity': 64}}}, {'online': {'server': {'capacity': 32}}}) == [
        '[online.server] capacity 64 -> 32 (used by the server: at its restart)']


@pytest.mark.slow
def test_a_line_logged_while_the_train_bar_is_drawn_starts_a_line_of_its_own(tmp_path):
    # A new user's trial saw "TRAIN: ... it/s]2026-... INFO mortal.train: ..." glued together: the learner logged
    # while its bar was on the terminal. Every process now logs through entry.AboveBars (tqdm.write).
    import os
    import subprocess
    import sys
    _, cfg = load_tiny_config(tmp_path, online=False)
    for name in ('baseline.pth', 'grp.pth'):  # the learner's input files (train.missing_inputs)
        (tmp_path / name).write_bytes(b'')
    code = (
        'import logging, sys\n'
        'from tqdm import tqdm\n'
        'from mortal import train\n'
        'def fake_learner(config, dist):\n'
        '    pb = tqdm(total=10, desc="TRAIN", ascii=True)\n'
        '    pb.update(3)\n'
        '    logging.getLogger("mortal.train").info("a line while the bar is drawn")\n'
        '    pb.close()\n'
        '    return 0\n'
        'train.run_learner = fake_learner\n'
        f'train.main(["-c", {str(cfg)!r}])\n')
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}
    env.pop('MORTAL_CFG', None)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    before, _, _ = out.stderr.partition('INFO mortal.train: a line while the bar is drawn')
    assert before, out.stderr
    line_start = before.rsplit('\n', 1)[-1].rsplit('\r', 1)[-1]  # what precedes it on its terminal line
    assert re.fullmatch(r'[\d\-:, ]+', line_start), repr(before[-120:])


# -- the learner's input files: a missing one is a broken config, not a crash at the next test play ---------------

def test_a_missing_baseline_or_grp_file_is_named_with_its_key_and_path(tmp_path):
    # A new user pointed [baseline.test] state_file at a typo: the learner died at its next start with a bare
    # FileNotFoundError naming no key. Online with anchor_weight 0: the anchor's [baseline.train] is not read.
    from mortal.config import typed
    from mortal.config_paths import learner_input_errors
    config, cfg = load_tiny_config(tmp_path, online=True)
    config['baseline']['test']['state_file'] = str(tmp_path / 'baselnie.pth')
    (tmp_path / 'baseline.pth').write_bytes(b'')  # [baseline.train] (and [control] state_file stays absent)
    assert learner_input_errors(typed(config), str(cfg)) == [
        f"[baseline.test] state_file = '{tmp_path}/baselnie.pth' in {cfg}: no such file; the learner "
        'reads it at its start (test play plays against it)',
        f"[grp] state_file = '{tmp_path}/grp.pth' in {cfg}: no such file; the learner reads it "
        "at its start ([env] reward = 'grp' needs it)"]
    config['env']['reward'] = 'points'  # no GRP read: its missing file is fine
    config['online']['anchor_weight'] = 0.5  # the anchor is read now
    (tmp_path / 'baselnie.pth').write_bytes(b'')
    (tmp_path / 'baseline.pth').unlink()
    assert learner_input_errors(typed(config), str(cfg)) == [
        f"[baseline.train] state_file = '{tmp_path}/baseline.pth' in {cfg}: no such file; the learner reads "
        'it at its start ([online] anchor_weight > 0 needs it)']


def test_a_missing_baseline_at_the_first_start_exits_2_naming_key_and_path(tmp_path, capsys, monkeypatch):
    # On main the learner built its Trainer and died with a traceback (FileNotFoundError) instead of exit 2.
    from mortal import train
    _, cfg = load_tiny_config(tmp_path, online=False)
    (tmp_path / 'grp.pth').write_bytes(b'')
    monkeypatch.setattr('sys.argv', ['train.py'])
    with pytest.raises(SystemExit) as info:
        train.main(['-c', str(cfg)])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: [baseline.test] state_file = '{tmp_path}/baseline.pth' in {cfg}: no such file; the learner "
        "reads it at its start (test play plays against it)"]


def test_a_baseline_path_saved_missing_waits_until_the_file_exists(tmp_path, train_lines):
    # The user's run: a valid edit of [baseline.test] state_file to a file that does not exist. On main the
    # supervisor said `saved: valid`, restarted the learner after its test play, the learner crashed (status 1) and
    # the whole trainer stopped. Now the saved config is broken: no learner starts until the file is there.
    from mortal import train
    lines = train_lines
    _, cfg = load_tiny_config(tmp_path, online=True)
    for name in ('baseline.pth', 'grp.pth'):
        (tmp_path / name).write_bytes(b'')
    missing = tmp_path / 'baselnie.pth'
    block = f'[baseline.test]\ndevice = "cpu"\nenable_compile = false\nstate_file = "{tmp_path}/baseline.pth"\n'
    assert block in cfg.read_text()
    script, counter = counting_learner(tmp_path, cfg, (block, block.replace('baseline.pth', 'baselnie.pth')),
                                       '0 if n == 0 else 3')

    def fix():
        wait_until(lambda: lines.has('still waiting for a valid config'))
        assert counter.read_text() == '1'  # no learner was started on the missing file
        missing.write_bytes(b'')

    code = supervise_while(script, cfg, fix, retry_interval=0.05, remind_every=0.2, inputs=train.missing_inputs)
    assert code == 3 and counter.read_text() == '2'  # the second learner ran once the file was there
    errors = [m for level, m in lines.records if level == logging.ERROR]
    assert errors[0].startswith(f'config {cfg} is broken: the learner is not restarted until it is fixed')
    assert errors[0].endswith(f"  - [baseline.test] state_file = '{missing}' in {cfg}: no such file; "
                              'the learner reads it at its start (test play plays against it)')
    assert any('is valid again' in m for _, m in lines.records)


def test_a_supervisor_line_on_a_terminal_erases_the_learners_bar_first():
    # The supervisor's lines came after the learner's full-width bar (another process: tqdm.write in the supervisor
    # cannot clear it), so the timestamp's first "2" ended that terminal line and the next one began "026-...".
    # On a terminal a line now starts by going back to column 0 and erasing the line (the bar redraws below it).
    import io
    from mortal.entry import AboveBars

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def emitted(stream):
        handler = AboveBars(stream)
        handler.setFormatter(logging.Formatter('%(levelname)s %(name)s: %(message)s'))
        handler.emit(logging.LogRecord('mortal.train', logging.INFO, __file__, 1, 'learner started (pid %d)', (7,),
                                       None))
        return stream.getvalue()

    terminal = Terminal('TRAIN:  30%|###       | 3/10 [00:01<00:02, 3.00it/s]')
    terminal.seek(0, io.SEEK_END)
    assert emitted(terminal).endswith('3.00it/s]\r\x1b[KINFO mortal.train: learner started (pid 7)\n')
    assert emitted(io.StringIO()) == 'INFO mortal.train: learner started (pid 7)\n'  # a file or pipe: no codes
