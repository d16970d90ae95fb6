"""The Ray fleet (mortal.tools.fleet): actor plans, the fleet record, start-up errors, and a real fleet of 2 actors against
a real server and trainer, one actor SIGKILLed and restarted by Ray."""

import copy
import os
import re
import signal
import subprocess
import sys

import pytest

from mortal.tools import fleet
from mortal.config import ConfigError, load_config

from conftest import ROOT, load_tiny_config, tiny_config_dict, write_baseline, write_grp
from test_online_loop import Proc, wait_for


def test_actors_take_the_profiles_in_turn_each_with_its_own_log_dir(tmp_path):
    config, _ = load_tiny_config(tmp_path, **{'train_play.fast': {
        'games': 8, 'log_dir': str(tmp_path / 'fast'), 'boltzmann_epsilon': 0.1, 'boltzmann_temp': 1.0,
        'top_p': 1.0, 'repeats': 1}})
    plans = fleet.plan_actors(config, 3, ['default', 'fast'])
    assert [(p.index, p.profile, p.log_dir) for p in plans] == [
        (0, 'default', str(tmp_path / 'train_play.fleet-0')),
        (1, 'fast', str(tmp_path / 'fast.fleet-1')),
        (2, 'default', str(tmp_path / 'train_play.fleet-2'))]
    before = copy.deepcopy(config)
    mine = fleet.actor_config(config, plans[1])
    assert mine['train_play']['fast']['log_dir'] == str(tmp_path / 'fast.fleet-1')
    assert mine['train_play']['default'] == config['train_play']['default']
    assert config == before  # the driver's config is not touched


def test_a_profile_the_config_lacks_is_named_with_the_key_and_the_file(tmp_path):
    config, cfg = load_tiny_config(tmp_path)
    with pytest.raises(ConfigError) as err:
        fleet.plan_actors(config, 1, ['default', 'slow'], str(cfg))  # checked even where no actor plays it yet
    assert str(err.value) == (f"[fleet] profiles in {cfg} names 'slow', but there is no [train_play.slow] "
                              "(profiles there: default)")
    for odd in ('a.b', '../x', '日本', ''):
        with pytest.raises(ConfigError, match=r'\[fleet\] profiles in .* names '):
            fleet.plan_actors(config, 1, [odd], str(cfg))
    # duplicates are fine: the actors take them in turn
    assert [p.profile for p in fleet.plan_actors(config, 3, ['default', 'default'])] == ['default'] * 3


def test_a_share_below_rays_unit_is_refused_before_ray_starts():
    assert fleet.check_shares(1.0, 0.0) == [] and fleet.check_shares(1e-4, 1e-4) == []
    assert fleet.check_shares(1e-9, 5e-5) == [
        '[fleet] num_cpus is 1e-09: Ray counts a CPU or GPU in steps of 0.0001, so reserve at least that',
        '[fleet] num_gpus is 5e-05: Ray counts a CPU or GPU in steps of 0.0001, so reserve at least that']


def test_the_actors_that_fit_on_the_cluster_at_once():
    big, cpu_only = {'CPU': 16.0, 'GPU': 1.0, 'memory': 1e9}, {'CPU': 8.0}
    assert fleet.capacity([big, cpu_only], 2.0, 0.0) == 8 + 4
    assert fleet.capacity([big, cpu_only], 2.0, 0.25) == 4 + 0  # 4 GPU shares on the first node, none on the other
    assert fleet.capacity([{'CPU': 2.0}], 0.1, 0.0) == 20  # 2 / 0.1 is 20.000000000000004 in floats
    assert fleet.capacity([{'CPU': 2.0}], 0.3, 0.0) == 6
    assert fleet.capacity([], 1.0, 0.0) == 0
    assert fleet.resource_problem([{'CPU': 2.0}], 1.0, 0.0, 2) is None
    assert fleet.resource_problem([{'CPU': 2.0}], 1.0, 0.0, 100000) == (
        '100000 actors need [fleet] num_cpus = 1 each, but the Ray cluster (2 CPUs 0 GPUs) runs 2 of them at once: '
        'Ray would queue the other 99998; start at most 2 (--actors, [fleet] actors) or reserve less')
    assert fleet.resource_problem([{'CPU': 2.0}], 1.0, 0.5, 1) == (
        'an actor needs [fleet] num_cpus = 1 and num_gpus = 0.5, but no node of the Ray cluster (2 CPUs 0 GPUs) has '
        'that much: Ray would queue every actor; reserve less')


def test_the_ray_address_comes_from_the_flag_the_key_then_ray_address():
    env = {'RAY_ADDRESS': 'head:6379'}
    assert fleet.ray_address(None, '', {}) == ''
    assert fleet.ray_address(None, '', env) == 'head:6379'  # ray.init would join it anyway
    assert fleet.ray_address(None, 'key:1', env) == 'key:1'
    assert fleet.ray_address('flag:2', 'key:1', env) == 'flag:2'


def test_an_address_where_nothing_listens_is_named_at_once():
    import socket
    from conftest import free_port
    dead = free_port()
    assert fleet.unreachable(f'127.0.0.1:{dead}').startswith(f'nothing answers at 127.0.0.1:{dead} (')
    assert fleet.unreachable(f'ray://127.0.0.1:{dead}').startswith(f'nothing answers at ray://127.0.0.1:{dead}')
    assert fleet.unreachable('127.0.0.1:99999').startswith('nothing answers at 127.0.0.1:99999')
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen()
        assert fleet.unreachable(f'127.0.0.1:{s.getsockname()[1]}') is None
    if socket.has_ipv6:
        with socket.socket(socket.AF_INET6) as s:
            try:
                s.bind(('::1', 0))
            except OSError:  # no IPv6 loopback here
                pass
            else:
                s.listen()
                assert fleet.unreachable(f'[::1]:{s.getsockname()[1]}') is None
    assert fleet.unreachable('auto') is None and fleet.unreachable('garbage!!') is None  # Ray's own word on those


def _main_error(capsys, argv):
    with pytest.raises(SystemExit) as ex:
        raise SystemExit(fleet.main(argv))
    return ex.value.code, capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_arguments_and_places_are_one_error_line_before_ray_starts(tmp_path, capsys, monkeypatch):
    import toml
    from conftest import free_port
    monkeypatch.setattr(fleet, 'import_ray', lambda: pytest.fail('Ray was started'))
    monkeypatch.delenv('RAY_ADDRESS', raising=False)
    _, cfg = load_tiny_config(tmp_path)
    code, line = _main_error(capsys, ['-c', str(cfg), '--rounds', '-1'])
    assert code == 2 and line.endswith(': error: --rounds must be >= 0')  # argparse's usage error
    dead = free_port()
    assert _main_error(capsys, ['-c', str(cfg), '--address', f'127.0.0.1:{dead}']) == (2, (
        f'error: cannot join the Ray cluster at 127.0.0.1:{dead} (--address, [fleet] address in {cfg}, or '
        f'$RAY_ADDRESS): nothing answers at 127.0.0.1:{dead} ([Errno 111] Connection refused)'))
    (tmp_path / 'a_file').write_text('')
    raw = toml.load(cfg)
    raw['fleet'] = {'tensorboard_dir': str(tmp_path / 'a_file' / 'tb')}
    cfg.write_text(toml.dumps(raw))
    assert _main_error(capsys, ['-c', str(cfg)]) == (2, (
        f"error: cannot write the fleet's TensorBoard records to {tmp_path / 'a_file' / 'tb'} ([fleet] "
        f"tensorboard_dir or [control] tensorboard_dir in {cfg}): [Errno 20] Not a directory: "
        f"'{tmp_path / 'a_file' / 'tb'}'"))


def test_an_actor_whose_client_cannot_start_reports_why_instead_of_raising(tmp_path, monkeypatch):
    import logging
    import torch
    monkeypatch.setattr(logging, 'basicConfig', lambda **kw: None)  # the actor's own logging setup, not pytest's
    monkeypatch.setattr(torch, 'set_num_threads', lambda n: None)
    config, _ = load_tiny_config(tmp_path, **{'baseline.train': {'from_server': False}})
    actor = fleet.SelfPlayActor(config, 'default', os.getcwd())  # cwd: the actor enters it
    info = actor.ready()
    assert info['pid'] == os.getpid() and actor.client is None
    assert info['error'] == (f"FileNotFoundError: [Errno 2] No such file or directory: "
                             f"'{config['baseline']['train']['state_file']}'")
    (tmp_path / 'a_file').write_text('')
    config['train_play']['default']['log_dir'] = str(tmp_path / 'a_file' / 'fleet-0')
    info = fleet.SelfPlayActor(config, 'default', os.getcwd()).ready()
    assert info['error'] == f"NotADirectoryError: [Errno 20] Not a directory: '{tmp_path / 'a_file' / 'fleet-0'}'"


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
    code = ('import sys; sys.modules["ray"] = None; from mortal.tools import fleet; '
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
        driver = Proc(tmp_path, 'fleet', 'tools/fleet.py', cfg, '--actors', '2')
        procs.append(driver)

        def text():
            return ANSI.sub('', driver.text())

        ready = re.compile(r'actor (\d) ready \(pid (\d+) on \S+, profile default, log_dir (\S+)\)')
        wait_for(lambda: len(ready.findall(text())) == 2, 180, 'two actors', procs)
        started = {int(i): (int(pid), d) for i, pid, d in ready.findall(text())}
        assert started[0][1] == str(tmp_path / 'train_play.fleet-0')
        assert started[1][1] == str(tmp_path / 'train_play.fleet-1')
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
    """Just what mortal.tools.fleet.Fleet uses of ray: each actor answers its calls from a script, in order; a script
    entry is a value or an exception to raise from ray.get."""

    class exceptions:
        pass

    exceptions.RayActorError = RayActorError
    exceptions.ActorUnavailableError = ActorUnavailableError
    exceptions.RayTaskError = RayTaskError

    def __init__(self, scripts, stalls=0):
        self.scripts = scripts  # actor index -> list of outcomes
        self.stalls = stalls  # the first waits that time out with nothing ready
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

    def wait(self, refs, num_returns=1, timeout=None):
        if self.stalls:
            self.stalls -= 1
            return [], refs
        return refs[:1], refs[1:]

    def available_resources(self):
        return {'CPU': 0.5, 'memory': 1e9}

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
    return {'rankings': ranks}


class FakeClock:
    """The driver's ``time``: sleeping advances it (``slept`` lists the sleeps), nothing waits for real."""

    def __init__(self):
        self.t, self.slept = 1000.0, []

    def monotonic(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s


def run_fake(tmp_path, monkeypatch, caplog, scripts, rounds, actors, stalls=0):
    import logging
    monkeypatch.setattr(fleet, 'RETRY_SECONDS', 0)
    config, _ = load_tiny_config(tmp_path)
    ray = FakeRay(scripts, stalls)
    ray.clock = FakeClock()
    monkeypatch.setattr(fleet, 'time', ray.clock)
    from mortal.config import typed
    record = fleet.FleetRecord(3, clock=iter(range(0, 1000, 10)).__next__)
    with caplog.at_level(logging.INFO, logger='mortal.tools.fleet'):
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


def test_backoff_doubles_from_the_second_failed_round_up_to_ten_minutes():
    assert [fleet.backoff_seconds(k) for k in (1, 2, 3, 4, 8, 9, 10, 1000)] == [0, 5, 10, 20, 320, 600, 600, 600]


def test_a_round_that_keeps_failing_holds_its_actor_back_longer_each_time(tmp_path, monkeypatch, caplog):
    full = RayTaskError(ValueError('disk full'))
    scripts = {0: [ready(1), full, ready(2), full, ready(3), full, ready(4), round_([1, 1, 1, 1]), full, ready(5),
                   round_([4, 0, 0, 0])]}
    status, ray, record = run_fake(tmp_path, monkeypatch, caplog, scripts, rounds=2, actors=1)
    assert status == 0 and ray.killed == [(0, False)] * 4
    failed = [line.split('restarting it')[1] for line in caplog.text.splitlines() if 'its round failed' in line]
    # the 1st, 2nd and 3rd failures in a row, then a good round resets the count
    assert failed == ['', '; next start in 5 s (2 failed rounds in a row)',
                      '; next start in 10 s (3 failed rounds in a row)', '']
    assert ray.clock.slept == [5.0, 10.0] and record.restarts == 4


def test_the_driver_drops_an_actor_whose_client_cannot_start_and_tells_of_actors_not_started(tmp_path, monkeypatch,
                                                                                             caplog):
    scripts = {0: [{**ready(5), 'error': "FileNotFoundError: [Errno 2] No such file or directory: 'b.pth'"}],
               1: [ready(6), round_([1, 1, 1, 1])]}
    status, ray, record = run_fake(tmp_path, monkeypatch, caplog, scripts, rounds=1, actors=2, stalls=1)
    assert status == 0 and ray.killed == [(0, True)] and record.fleet_rounds == 1
    text = caplog.text
    # the first wait timed out with both actors still starting
    assert 'actors 0, 1 not started yet: Ray has not placed them (free in the cluster: 0.5 CPUs, 0 GPUs)' in text
    assert ("actor 0 dropped: its client could not start: FileNotFoundError: [Errno 2] No such file or directory: "
            "'b.pth'") in text
    assert 'actor 0 ready' not in text and 'actor 1 ready (pid 6' in text


def _descendants(pid):
    """Pids of the processes below ``pid`` now (from /proc: a local Ray instance's are the driver's children)."""
    children = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    ppid = int(f.read().rsplit(')', 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


@pytest.mark.slow  # a local Ray instance
@pytest.mark.timeout(300)
def test_sigterm_stops_the_fleet_and_its_local_ray_instance(tmp_path):
    pytest.importorskip('ray')
    config, cfg = load_tiny_config(tmp_path)  # no server: the started actors wait for it
    write_baseline(config, config['baseline']['train']['state_file'])
    driver = Proc(tmp_path, 'fleet', 'tools/fleet.py', cfg, '--actors', '1', env={'RAY_ADDRESS': ''})
    try:
        wait_for(lambda: 'actor 0 ready (pid' in driver.text(), 180, 'the actor', [driver])
        ray_pids = _descendants(driver.p.pid)
        assert len(ray_pids) >= 3  # at least the GCS, the raylet and the actor
        driver.p.send_signal(signal.SIGTERM)
        assert driver.p.wait(timeout=60) == 0  # before: Ray's handler aborted the driver (status -6)
        assert 'INFO mortal.tools.fleet: stopping the fleet' in driver.text()
        wait_for(lambda: not any(map(_alive, ray_pids)), 30, 'the Ray processes to end')
    finally:
        driver.kill()


@pytest.mark.slow  # a local Ray instance
@pytest.mark.timeout(300)
def test_a_local_instance_too_small_for_the_actors_is_refused(tmp_path):
    pytest.importorskip('ray')
    _, cfg = load_tiny_config(tmp_path, fleet={'num_cpus': 1e6})
    driver = Proc(tmp_path, 'fleet', 'tools/fleet.py', cfg, '--actors', '1', env={'RAY_ADDRESS': ''})
    try:
        assert driver.p.wait(timeout=240) == 2  # before: the actor was queued without a word, for good
        line = driver.text().strip().splitlines()[-1]
        assert re.fullmatch(r'error: an actor needs \[fleet\] num_cpus = 1e\+06, but no node of the Ray cluster '
                            r'\(\d+ CPUs \d+ GPUs\) has that much: Ray would queue every actor; reserve less', line)
    finally:
        driver.kill()


def test_no_address_starts_a_new_local_instance_and_ray_address_joins_a_cluster(tmp_path, capsys, monkeypatch):
    """'' must not join a `ray start` instance that ray.init() would find on its own (the local instance's
    object_store_memory then made ray.init raise); RAY_ADDRESS is a cluster to join like --address."""
    import socket
    calls = []

    class StopRay:
        @staticmethod
        def init(**kw):
            calls.append(kw)
            raise RuntimeError('no Ray in this test')

        @staticmethod
        def shutdown():
            calls.append('shutdown')

    monkeypatch.setattr(fleet, 'import_ray', lambda: StopRay)
    monkeypatch.delenv('RAY_ADDRESS', raising=False)
    _, cfg = load_tiny_config(tmp_path)
    assert _main_error(capsys, ['-c', str(cfg)]) == (2, 'error: cannot start a local Ray instance: no Ray in this test')
    assert calls == [{'address': 'local', 'include_dashboard': False, 'log_to_driver': True,
                      'object_store_memory': fleet.LOCAL_OBJECT_STORE_BYTES}, 'shutdown']
    calls.clear()
    with socket.socket() as s:  # something answers there
        s.bind(('127.0.0.1', 0))
        s.listen()
        head = f'127.0.0.1:{s.getsockname()[1]}'
        monkeypatch.setenv('RAY_ADDRESS', head)
        assert _main_error(capsys, ['-c', str(cfg)]) == (2, (
            f'error: cannot join the Ray cluster at {head} (--address, [fleet] address in {cfg}, or $RAY_ADDRESS): '
            'no Ray in this test'))
    assert calls == [{'address': head, 'include_dashboard': False, 'log_to_driver': True}, 'shutdown']
