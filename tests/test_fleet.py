"""The Ray fleet (mortal.fleet): actor plans, the fleet record, start-up errors, and a real fleet of 2 actors against
a real server and trainer, one actor SIGKILLed and restarted by Ray."""

import copy
import os
import re
import signal
import subprocess
import sys

import pytest

from mortal import fleet
from mortal.config import ConfigError, load_config

from conftest import ROOT, load_tiny_config, tiny_config_dict, write_baseline, write_grp
from test_online_loop import Proc, wait_for


def test_actors_take_the_profiles_in_turn_each_with_its_own_log_dir(tmp_path):
    config, _ = load_tiny_config(tmp_path, **{'train_play.fast': {
        'games': 8, 'log_dir': str(tmp_path / 'fast'), 'boltzmann_epsilon': 0.1, 'boltzmann_temp': 1.0,
        'top_p': 1.0, 'repeats': 1}})
    plans = fleet.plan_actors(config, 3, ['default', 'fast'])
    assert [(p.index, p.profile, p.log_dir) for p in plans] == [
        (0, 'default', str(tmp_path / 'train_play' / 'fleet-0')),
        (1, 'fast', str(tmp_path / 'fast' / 'fleet-1')),
        (2, 'default', str(tmp_path / 'train_play' / 'fleet-2'))]
    before = copy.deepcopy(config)
    mine = fleet.actor_config(config, plans[1])
    assert mine['train_play']['fast']['log_dir'] == str(tmp_path / 'fast' / 'fleet-1')
    assert mine['train_play']['default'] == config['train_play']['default']
    assert config == before  # the driver's config is not touched


def test_a_profile_the_config_lacks_is_named(tmp_path):
    config, _ = load_tiny_config(tmp_path)
    with pytest.raises(ConfigError, match=r'missing section \[train_play\.slow\]'):
        fleet.plan_actors(config, 2, ['default', 'slow'])


def test_a_cuda_device_needs_a_gpu_share(tmp_path):
    config, _ = load_tiny_config(tmp_path)
    assert fleet.check_devices(config, 0.0) == []
    config['control']['device'] = 'cuda:0'
    problems = fleet.check_devices(config, 0.0)
    assert len(problems) == 1 and problems[0].startswith("[control] device is 'cuda:0' but [fleet] num_gpus is 0")
    assert fleet.check_devices(config, 0.25) == []


def test_fleet_section_defaults_and_bounds(tmp_path):
    import toml
    raw = tiny_config_dict(tmp_path)
    path = tmp_path / 'c.toml'
    path.write_text(toml.dumps(raw))
    assert load_config(path, env={})['fleet'] == {
        'actors': 2, 'profiles': ['default'], 'num_cpus': 1.0, 'num_gpus': 0.0, 'max_restarts': -1, 'address': '',
        'tensorboard_dir': ''}
    raw['fleet'] = {'actors': 0, 'profiles': [], 'num_gpus': 1.5, 'max_restarts': -2}
    path.write_text(toml.dumps(raw))
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    text = str(err.value)
    for key, why in (('actors', 'must be > 0'), ('profiles', 'must name at least one profile'),
                     ('num_gpus', 'must be within [0, 1]'), ('max_restarts', 'must be -1 (no limit) or >= 0')):
        assert f'[fleet] {key} in {path} {why}' in text, (key, text)


class Writer:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass


def test_fleet_record_sums_one_round_of_every_live_actor():
    clock = iter([100.0, 112.0, 130.0]).__next__
    writer = Writer()
    record = fleet.FleetRecord(2, writer, clock=clock)
    assert record.add([1, 1, 1, 1], live=2) is None  # actor 0's round; actor 1's still to come
    line = record.add([2, 0, 0, 2], live=2)
    # 8 games in 12 s = 2400/h; ranks (1*3 + 2*1 + 3*1 + 4*3) / 8 = 2.5; pt (90*3 + 45 - 135*3) / 8 = -11.25
    assert line == ('fleet round 1: 2 rounds of 2 actors, 8 games in 12.0 s (2400 hanchan/h); trainee rankings: '
                    '[3, 1, 1, 3] (2.5, -11.25pt); last 1 fleet rounds: [3, 1, 1, 3] (2.5, -11.25pt); restarts 0')
    record.restarts = 1
    line = record.add([4, 0, 0, 0], live=1)  # one actor left: a fleet round is its round alone
    # window [3,1,1,3] + [4,0,0,0]: ranks (7 + 2 + 3 + 12) / 12 = 2.0; pt (630 + 45 - 405) / 12 = 22.5; 4 games in 18 s
    assert line == ('fleet round 2: 1 rounds of 1 actors, 4 games in 18.0 s (800 hanchan/h); trainee rankings: '
                    '[4, 0, 0, 0] (1.0, 90.0pt); last 2 fleet rounds: [7, 1, 1, 3] (2.0, 22.5pt); restarts 1')
    assert ('fleet/avg_rank', 1.0, 2) in writer.scalars and ('fleet/window_avg_pt', 22.5, 2) in writer.scalars
    assert ('fleet/hanchan_per_hour', 800.0, 2) in writer.scalars and ('fleet/restarts', 1, 2) in writer.scalars
    assert {t for t, _, _ in writer.scalars} == {
        'fleet/avg_rank', 'fleet/avg_pt', 'fleet/window_avg_rank', 'fleet/window_avg_pt', 'fleet/hanchan_per_hour',
        'fleet/actors', 'fleet/restarts'}


@pytest.mark.slow  # a subprocess
def test_without_ray_the_command_says_how_to_install_it(tmp_path):
    _, cfg = load_tiny_config(tmp_path)
    code = ('import sys; sys.modules["ray"] = None; from mortal import fleet; '
            f'sys.exit(fleet.main(["-c", {str(cfg)!r}]))')
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == f'error: {fleet.INSTALL_HINT}'


ANSI = re.compile(r'\x1b\[[0-9;]*m')


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_actor_is_restarted_and_its_logs_arrive(tmp_path):
    pytest.importorskip('ray')
    config, cfg = load_tiny_config(tmp_path, online=True, control={
        'batch_size': 8, 'save_every': 2, 'submit_every': 2, 'test_every': 1000})
    write_baseline(config, config['baseline']['train']['state_file'])
    write_grp(config)
    server = Proc(tmp_path, 'server', 'server.py', cfg)
    procs = [server]
    driver = None
    try:
        wait_for(lambda: 'listening on' in server.text(), 60, 'the server', procs)
        procs.append(Proc(tmp_path, 'trainer', 'train.py', cfg))
        driver = Proc(tmp_path, 'fleet', 'fleet.py', cfg, '--actors', '2')
        procs.append(driver)

        def text():
            return ANSI.sub('', driver.text())

        ready = re.compile(r'actor (\d) ready \(pid (\d+) on \S+, profile default, log_dir (\S+)\)')
        wait_for(lambda: len(ready.findall(text())) == 2, 180, 'two actors', procs)
        started = {int(i): (int(pid), d) for i, pid, d in ready.findall(text())}
        assert started[0][1] == str(tmp_path / 'train_play' / 'fleet-0')
        assert started[1][1] == str(tmp_path / 'train_play' / 'fleet-1')
        victim = started[0][0]

        def submitted_by(pid):
            return re.search(rf'\(SelfPlayActor pid={pid}\).*\d+ logs have been submitted', text())

        wait_for(lambda: submitted_by(victim), 180, 'a round of actor 0', procs)
        os.kill(victim, signal.SIGKILL)
        restarted = re.compile(r'actor 0 restarted \(pid (\d+) on \S+; restart 1 of the fleet\)')
        wait_for(lambda: restarted.search(text()), 120, 'actor 0 restarted', procs)
        new_pid = int(restarted.search(text()).group(1))
        assert new_pid != victim
        wait_for(lambda: submitted_by(new_pid), 180, 'a round of the restarted actor', procs)
        wait_for(lambda: re.search(r'fleet round \d+: .*restarts 1$', text(), re.M), 120, 'a fleet round after it',
                 procs)
        assert driver.alive()
        # the restarted actor's logs reached the server as a submission of 4 logs
        assert re.search(r'submission \d+: 4 logs', server.text())
    finally:
        if driver is not None and driver.alive():
            driver.p.send_signal(signal.SIGINT)  # ray.shutdown() stops the local instance's processes
            try:
                driver.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            p.kill()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(os.path.join(config['control']['tensorboard_dir'], 'fleet'))
    acc.Reload()
    assert {'fleet/avg_rank', 'fleet/hanchan_per_hour', 'fleet/restarts'} <= set(acc.Tags()['scalars'])
    assert acc.Scalars('fleet/restarts')[-1].value == 1


def test_bench_round_times_per_client_after_the_first_round():
    from conftest import load_script
    bench = load_script('bench/fleet.py', 'bench_fleet')
    text = '\n'.join([
        '2026-12-02 01:00:00,000 INFO mortal.client: 8 logs have been submitted',  # a plain client
        '2026-12-02 01:00:10,000 INFO mortal.client: 8 logs have been submitted',
        '2026-12-02 01:00:30,000 INFO mortal.client: 8 logs have been submitted',
    ])
    times, games = bench.round_times(text)
    assert times == {0: [10.0, 20.0]} and games == 8
    assert bench.steady_rate(times, games) == pytest.approx(8 / 15)
    fleet_text = '\n'.join([
        '\x1b[36m(SelfPlayActor pid=11)\x1b[0m 2026-12-02 01:00:00,000 INFO mortal.client: 8 logs have been submitted',
        '(SelfPlayActor pid=12) 2026-12-02 01:00:01,000 INFO mortal.client: 8 logs have been submitted',
        '(SelfPlayActor pid=11) 2026-12-02 01:00:20,000 INFO mortal.client: 8 logs have been submitted',
        '(SelfPlayActor pid=12) 2026-12-02 01:00:11,500 INFO mortal.client: 8 logs have been submitted',
    ])
    times2, _ = bench.round_times(fleet_text)
    assert times2 == {0: [20.0], 1: [10.5]}
    # two clients at once: 8/20 + 8/10.5 games/s, against the plain client's 8/15
    ratio, low, high = bench.ratio_ci(times2, times, games, n=200)
    assert ratio == pytest.approx((8 / 20 + 8 / 10.5) / (8 / 15))
    assert low <= ratio <= high
    with pytest.raises(RuntimeError, match='one round size'):
        bench.round_times(text + '\n2026-12-02 01:00:40,000 INFO mortal.client: 4 logs have been submitted')


# --- the driver's loop against a scripted Ray -----------------------------------------------------------------------

class RayActorError(Exception):
    pass


class ActorUnavailableError(RayActorError):
    pass


class RayTaskError(Exception):
    def __init__(self, cause):
        super().__init__(f'{type(cause).__name__}: {cause}')
        self.cause = cause


class FakeRay:
    """Just what mortal.fleet.Fleet uses of ray: each actor answers its calls from a script, in order; a script
    entry is a value or an exception to raise from ray.get."""

    class exceptions:
        pass

    exceptions.RayActorError = RayActorError
    exceptions.ActorUnavailableError = ActorUnavailableError
    exceptions.RayTaskError = RayTaskError

    def __init__(self, scripts):
        self.scripts = scripts  # actor index -> list of outcomes
        self.killed = []
        self.made = 0

    def remote(self, cls):
        ray = self

        class Handle:
            def __init__(self, index):
                self.index = index
                self.ready = self.run_round = self  # method.remote() -> the next outcome of the script

            def remote(self):
                return Outcome(ray.scripts[self.index].pop(0))

        class Options:
            def options(self, **kw):
                return self

            def remote(self, *args):
                ray.made += 1
                return Handle(ray.made - 1)

        return Options()

    def wait(self, refs, num_returns=1):
        return refs[:1], refs[1:]

    def get(self, ref):
        if isinstance(ref.value, BaseException):
            raise ref.value
        return ref.value

    def kill(self, handle, no_restart=True):
        self.killed.append((handle.index, no_restart))


class Outcome:
    """An ObjectRef stand-in: a distinct, hashable object per call (the driver keys its calls by it)."""

    def __init__(self, value):
        self.value = value


def ready(pid):
    return {'pid': pid, 'node': 'n'}


def round_(ranks):
    return {'rankings': ranks, 'seconds': 1.0, 'param_version': 1}


def run_fake(tmp_path, monkeypatch, caplog, scripts, rounds, actors):
    import logging
    monkeypatch.setattr(fleet, 'RETRY_SECONDS', 0)
    config, _ = load_tiny_config(tmp_path)
    ray = FakeRay(scripts)
    from mortal.config import typed
    record = fleet.FleetRecord(3, clock=iter(range(0, 1000, 10)).__next__)
    with caplog.at_level(logging.INFO, logger='mortal.fleet'):
        status = fleet.Fleet(ray, config, typed(config).fleet, fleet.plan_actors(config, actors, ['default']),
                             record).run(rounds)
    return status, ray, record


def test_the_driver_restarts_a_dead_actor_and_drops_a_refused_one(tmp_path, monkeypatch, caplog):
    from mortal.net.wire import RequestRefused
    scripts = {
        0: [ready(100), round_([1, 0, 0, 3]), ActorUnavailableError('socket closed'), ready(101),
            round_([4, 0, 0, 0]), round_([0, 4, 0, 0]), round_([0, 0, 4, 0])],
        1: [ready(200), RayTaskError(RequestRefused('frame too big'))],
    }
    status, ray, record = run_fake(tmp_path, monkeypatch, caplog, scripts, rounds=4, actors=2)
    assert status == 0 and record.restarts == 1
    assert ray.killed == [(1, True)]
    text = caplog.text
    assert 'actor 1 dropped: its round was refused: frame too big' in text
    assert 'actor 0 died during a round: socket closed' in text
    assert 'actor 0 restarted (pid 101 on n; restart 1 of the fleet)' in text
    # 4 rounds of actor 0 in all, the fleet rounds closed at 2 live actors, then at 1
    assert [line for line in text.splitlines() if 'fleet round' in line][-1].endswith('restarts 1')
    assert record.fleet_rounds == 3


def test_the_driver_drops_an_actor_whose_start_fails_and_exits_1_without_actors(tmp_path, monkeypatch, caplog):
    scripts = {0: [RayActorError('The actor died because of an error raised in its creation task')],
               1: [ready(7), RayTaskError(ValueError('disk full')), ready(8), RayTaskError(ValueError('disk full')),
                   RayActorError('no restart left')]}
    status, ray, record = run_fake(tmp_path, monkeypatch, caplog, scripts, rounds=0, actors=2)
    assert status == 1
    assert 'actor 0 dropped: the actor is dead and Ray does not restart it: The actor died because' in caplog.text
    # a round that raises restarts its actor (killed with restarts allowed) until Ray gives up on it
    assert ray.killed == [(0, True), (1, False), (1, False), (1, True)]
    assert record.restarts == 1 and 'no actor is left' in caplog.text
