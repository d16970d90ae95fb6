"""Shared fixtures and helpers of the tests.

The one place for what more than one test file uses (the tiny config, checkpoint writers, fakes of the trainer's
collaborators, a free port): test files import the plain helpers with ``from conftest import ...`` and never from
one another. Under pytest's default (prepend) import mode this is the very module pytest loaded as the conftest.
"""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Rust errors from the mjai/riichienv bindings carry a slow full backtrace when RUST_BACKTRACE is set.
os.environ.pop("RUST_BACKTRACE", None)

import pytest  # noqa: E402

# torch is imported where it is used, not here: under pytest-xdist the controller process loads this file but runs
# no test, and importing torch would cost it about 1.5 s of CPU that the workers need.

DATA_DIR = ROOT / "tests" / "data"
FIXTURE_LOGS = sorted(DATA_DIR.glob("*.jsonl"))


@pytest.fixture
def fixture_logs():
    """Paths of the real public mjai logs in tests/data (see its README)."""
    return list(FIXTURE_LOGS)


def load_script(relpath: str, name: str):
    """Import the script ``ROOT/relpath`` (e.g. ``bench/sprt_cost.py``, not a package module) as ``name``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

_HANCHAN_OBS = {}


def hanchan_observations(version: int):
    """(obs (N, C, 34) float32, masks (N, 46) bool) tensors of every decision of seats 0 and 1 of a public hanchan
    (tests/data), encoded at ``version``; cached per version."""
    if version not in _HANCHAN_OBS:
        import numpy as np
        import torch
        bench = load_script("bench/forward.py", "forward_bench")
        obs, masks = bench.real_observations(version, logs=[DATA_DIR / "riichienv_selfplay_hanchan.jsonl"],
                                             seats=(0, 1))
        _HANCHAN_OBS[version] = torch.from_numpy(np.stack(obs)), torch.from_numpy(np.stack(masks))
    return _HANCHAN_OBS[version]


def wait_until(cond, timeout: float = 30.0, interval: float = 0.01) -> None:
    """Poll ``cond()`` every ``interval`` s until it is true; fails the test after ``timeout`` s."""
    import time
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, 'timed out'
        time.sleep(interval)



def call_unless_stuck_on(fifo, call, what: str):
    """``call()`` on a thread, its result; fails the test, after unblocking the thread, when it waits on the FIFO
    ``fifo`` for 20 s (an ``open()`` of a FIFO blocks until a writer comes)."""
    import threading
    result = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():
        with open(fifo, 'wb'):
            pass
        worker.join(20)
        pytest.fail(f'{what} waited on a FIFO')
    return result[0]


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_param_server(tmp_path, capacity, *, force_sequential=False, host="127.0.0.1", port=0, **kwargs):
    """A ``mortal.net.param_server.ParamServer`` on ``(host, port)`` (0: any free port) over a fresh ReplayStore of
    ``capacity`` in ``tmp_path/'buffer'`` and ``tmp_path/'drain'``, serving from a daemon thread; ``kwargs`` go to
    ParamServer. End it with ``stop_server``."""
    import threading
    from mortal.net.param_server import ParamServer
    from mortal.net.replay_store import ReplayStore
    store = ReplayStore(tmp_path / "buffer", tmp_path / "drain", capacity, force_sequential)
    store.reset_dirs()
    server = ParamServer((host, port), store, **kwargs)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def stop_server(server):
    server.shutdown()
    server.server_close()


# -- the one tiny config -------------------------------------------------------------------------------------------

TINY_VERSION = 3  # the tiny config's model: version 3 (934 obs channels), [resnet] 16 channels x 1 block
TINY_CHANNELS = 934


def tiny_config_dict(root, *, online=True, port=None, **overrides):
    """The raw dict (Mortal layout) of the one small config the tests share, every path under ``root``.

    Version 3, ``[resnet]`` 16 channels x 1 block, device ``cpu``, ``batch_size`` 8, ``opt_step_every`` 1,
    ``save_every`` 2, ``test_every`` 4, ``submit_every`` 2, ``[train_play.default]`` and ``[test_play]`` 4 games,
    ``capacity`` 4, ``num_workers`` 0, ``history_window`` 3, scheduler peak = final = 1e-3, GRP 64 x 2, ``[1v3]``
    4 games x 1 iter (seed_key 0) and the ``[grp.*]`` tables. ``online`` sets ``[control] online`` and
    ``[freeze_bn] mortal``; ``port`` the ``[online.remote]`` port (default: a free loopback one); ``overrides``
    ``{'section.sub': {key: value}}`` are merged in last (``section`` alone is a top-level table).
    """
    root = pathlib.Path(root)

    def p(name):
        return str(root / name)

    cfg = {
        "control": {
            "version": TINY_VERSION, "online": online,
            "state_file": p("mortal.pth"), "best_state_file": p("best.pth"), "tensorboard_dir": p("tb"),
            "device": "cpu", "enable_cudnn_benchmark": False, "enable_amp": False, "enable_compile": False,
            "batch_size": 8, "opt_step_every": 1, "save_every": 2, "test_every": 4, "submit_every": 2,
        },
        "train_play": {"default": {
            "games": 4, "log_dir": p("train_play"), "boltzmann_epsilon": 0.005, "boltzmann_temp": 0.05,
            "top_p": 1.0, "repeats": 1,
        }},
        "test_play": {"games": 4, "log_dir": p("test_play")},
        "dataset": {
            "globs": [p("dataset/*.json*")], "file_index": p("file_index.pth"), "file_batch_size": 2,
            "reserve_ratio": 0.0, "num_workers": 0, "player_names_files": [], "num_epochs": 1,
            "enable_augmentation": False, "augmented_first": False,
        },
        "env": {"gamma": 1.0, "pts": [6.0, 4.0, 2.0, 0.0]},
        "resnet": {"conv_channels": 16, "num_blocks": 1},
        "cql": {"min_q_weight": 5.0},
        "aux": {"next_rank_weight": 0.2},
        "freeze_bn": {"mortal": online},
        "optim": {
            "eps": 1e-8, "betas": [0.9, 0.999], "weight_decay": 0.1, "max_grad_norm": 1.0,
            "scheduler": {"peak": 1e-3, "final": 1e-3, "warm_up_steps": 0, "max_steps": 0},
        },
        "baseline": {
            "train": {"device": "cpu", "enable_compile": False, "state_file": p("baseline.pth")},
            "test": {"device": "cpu", "enable_compile": False, "state_file": p("baseline.pth")},
        },
        "online": {
            "history_window": 3, "enable_compile": False,
            "remote": {"host": "127.0.0.1", "port": free_port() if port is None else port},
            "server": {
                "buffer_dir": p("buffer"), "drain_dir": p("drain"), "sample_reuse_rate": 0,
                "sample_reuse_threshold": 0, "capacity": 4, "force_sequential": False,
            },
        },
        "1v3": {
            "seed_key": 0, "games_per_iter": 4, "iters": 1, "log_dir": p("1v3"),
            "challenger": {
                "device": "cpu", "name": "mortal", "state_file": p("mortal.pth"), "stochastic_latent": False,
                "enable_compile": False, "enable_amp": False, "enable_rule_based_agari_guard": True,
            },
            "champion": {
                "device": "cpu", "name": "baseline", "state_file": p("baseline.pth"), "stochastic_latent": False,
                "enable_compile": False, "enable_amp": False, "enable_rule_based_agari_guard": True,
            },
        },
        "grp": {
            "state_file": p("grp.pth"),
            "network": {"hidden_size": 64, "num_layers": 2},
            "control": {
                "device": "cpu", "enable_cudnn_benchmark": False, "tensorboard_dir": p("grp_tb"),
                "batch_size": 32, "save_every": 4, "val_steps": 2,
            },
            "dataset": {
                "train_globs": [p("dataset/**/*.json.gz")], "val_globs": [p("dataset/**/*.json.gz")],
                "file_index": p("grp_file_index.pth"), "file_batch_size": 2,
            },
            "optim": {"lr": 1e-5},
        },
    }
    for dotted, values in overrides.items():
        table = cfg
        for part in dotted.split("."):
            table = table.setdefault(part, {})
        table.update(values)
    return cfg


def load_tiny_config(root, **kwargs):
    """``tiny_config_dict(root, **kwargs)`` written to ``root/config.toml`` and loaded (validated, defaults filled
    in) through ``mortal.config.load_config`` with an empty environment: returns ``(config, path)``."""
    import toml
    from mortal.config import load_config

    path = pathlib.Path(root) / "config.toml"
    with open(path, "w", encoding="utf-8") as f:
        toml.dump(tiny_config_dict(root, **kwargs), f)
    return load_config(path, env={}), path


@pytest.fixture
def tiny_config(tmp_path):
    """``load_tiny_config(tmp_path)``: ``(config, path)``, the config as load_config returns it and
    ``tmp_path/'config.toml'``, already written. To change a value, edit the dict and ``toml.dump`` it to ``path``
    again (or pass the dict on). Nothing under ``tmp_path`` besides the config file exists yet (no checkpoints)."""
    return load_tiny_config(tmp_path)


def write_baseline(config, filename, seed=0):
    """A randomly initialised checkpoint (seed ``seed``) with Mortal's keys for the tiny config's architecture."""
    import torch
    from mortal.model.networks import AuxNet, Brain, DQN
    torch.manual_seed(seed)
    r = config["resnet"]
    brain = Brain(version=TINY_VERSION, conv_channels=r["conv_channels"], num_blocks=r["num_blocks"])
    dqn = DQN(version=TINY_VERSION)
    torch.save({"mortal": brain.state_dict(), "current_dqn": dqn.state_dict(),
                "aux_net": AuxNet((4,)).state_dict(), "config": config, "steps": 0}, filename)


def write_grp(config):
    """A randomly initialised (seed 0) GRP of ``[grp] network`` at ``[grp] state_file``."""
    import torch
    from mortal.model.networks import GRP
    torch.manual_seed(0)
    grp = GRP(**config["grp"]["network"])
    torch.save({"model": grp.state_dict()}, config["grp"]["state_file"])


def random_batch(n=8, seed=0, *, gamma_steps=None, reward=2.0):
    """A ``Trainer.train_batch`` argument tuple of ``n`` random version-3 samples (seeded): ``steps_to_done``
    0..n-1 unless ``gamma_steps``, every reward ``reward``, ranks 0-3 in turn."""
    import torch
    g = torch.Generator().manual_seed(seed)
    obs = torch.rand((n, TINY_CHANNELS, 34), generator=g)
    masks = torch.rand((n, 46), generator=g) < 0.3
    actions = torch.randint(0, 46, (n,), generator=g)
    masks[torch.arange(n), actions] = True
    steps_to_done = torch.arange(n) if gamma_steps is None else gamma_steps
    rewards = torch.full((n,), reward, dtype=torch.float64)
    ranks = torch.arange(n) % 4
    return obs, actions, masks, steps_to_done, rewards, ranks


# -- fakes of the trainer's collaborators --------------------------------------------------------------------------

class CallSpy:
    """Counts in ``calls`` the calls of ``owner.name`` whose arguments ``when`` accepts (all by default), and makes
    them as before; undone with ``monkeypatch``."""

    def __init__(self, monkeypatch, owner, name, when=lambda *args: True):
        self.calls = 0
        real = getattr(owner, name)

        def counted(*args):
            self.calls += when(*args)
            return real(*args)
        monkeypatch.setattr(owner, name, counted)


class FakeWriter:
    """A SummaryWriter that records what is written."""

    def __init__(self):
        self.scalars, self.groups, self.histograms, self.texts = [], [], [], []

    def add_text(self, tag, text, step):
        self.texts.append((tag, text, step))

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, float(value), step))

    def add_scalars(self, tag, values, step):
        self.groups.append((tag, dict(values), step))

    def add_histogram(self, tag, values, step):
        self.histograms.append((tag, len(values), step))

    def flush(self):
        pass

    def close(self):
        pass

    def tags(self):
        return {t for t, _, _ in self.scalars} | {t for t, _, _ in self.groups} | {t for t, _, _ in self.histograms}


class FakeStat:
    def __init__(self, avg_pt, avg_rank):
        self._pt, self.avg_rank = avg_pt, avg_rank

    def avg_pt(self, pts):
        assert list(pts) == [90, 45, 0, -135]
        return self._pt

    def write_tensorboard(self, writer, step, pts):
        writer.add_scalar("test_play/avg_ranking", self.avg_rank, step)
        writer.add_scalar("test_play/avg_pt", self._pt, step)


class FakeTestPlayer:
    """A test player whose k-th test play has the k-th of ``results``, ``(avg_pt, avg_rank)``."""

    def __init__(self, results):
        self.results = list(results)
        self.calls = []

    def test_play(self, seed_count, mortal, dqn, device):
        self.calls.append(seed_count)
        return FakeStat(*self.results.pop(0))


def fake_trainer(config, *, test_player=None, writer=None, remote=None, drop_submits=False, **kwargs):
    """A ``mortal.train.Trainer`` of ``config`` (online or offline) with fakes for its collaborators.

    ``test_player``: default ``FakeTestPlayer([])`` (no results: a test play fails). ``writer``: default a fresh
    ``FakeWriter`` (``trainer.writer``). ``remote``: default ``wire.Remote('127.0.0.1', 1)``, where nothing listens
    (only an online learner's server traffic uses it; offline it is never read). ``sleep``: a no-op unless given.
    ``drop_submits``: ``trainer.submit_param`` does nothing (no server to publish to). Other ``kwargs`` (``dist``)
    go to the Trainer as they are. Raises what the Trainer raises (a config it refuses).
    """
    from mortal import train as tr
    from mortal.net import wire
    kwargs.setdefault("sleep", lambda s: None)
    trainer = tr.Trainer(config, test_player=FakeTestPlayer([]) if test_player is None else test_player,
                         writer=FakeWriter() if writer is None else writer,
                         remote=wire.Remote("127.0.0.1", 1) if remote is None else remote, **kwargs)
    if drop_submits:
        trainer.submit_param = lambda is_idle=False: None
    return trainer


def trainer_on_round(tmp_path, config, files):
    """An offline ``fake_trainer`` of ``config`` whose dataset is a copy of a self-play round's log ``files`` in
    ``tmp_path/dataset``; the GRP of ``config`` is written (``write_grp``). The config's ``[dataset]`` globs must
    point at that folder."""
    import shutil
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    for f in files:
        shutil.copy(f, dataset / os.path.basename(f))
    trainer = fake_trainer(config)
    write_grp(trainer.config)
    return trainer


class ScriptedRemote:
    """Answers each drain with the next of ``replies`` (then empty drains); records submit_param requests (their
    is_idle) and submit_baseline ones (their baseline_version)."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.host, self.port = "127.0.0.1", 1
        self.submits = []
        self.baselines = []

    def request(self, msg):
        if msg["type"] == "submit_param":
            self.submits.append(msg["is_idle"])
            return {"status": "ok", "param_version": len(self.submits), "server_id": "x"}
        if msg["type"] == "submit_baseline":
            self.baselines.append(msg["baseline_version"])
            return {"status": "ok", "baseline_version": msg["baseline_version"]}
        return self.replies.pop(0)


def empty_drain(drain_dir, server_id, has_param):
    """A server's reply to a drain that found no logs."""
    return {"status": "ok", "count": 0, "drain_dir": drain_dir, "files": [], "param_versions": [],
            "param_version": 0, "has_param": has_param, "server_id": server_id}


# -- logs and tiles ------------------------------------------------------------------------------------------------

def player_view(path, seat):
    """The mjai log at ``path`` as the seat's server would send it: others' haipai and draws masked as '?'."""
    import json
    out = []
    for line in pathlib.Path(path).read_text().splitlines():
        ev = json.loads(line)
        if ev["type"] == "start_kyoku":
            ev["tehais"] = [t if i == seat else ["?"] * 13 for i, t in enumerate(ev["tehais"])]
        elif ev["type"] == "tsumo" and ev["actor"] != seat:
            ev["pai"] = "?"
        out.append(json.dumps(ev))
    return out


_SUIT_OFFSET = {"m": 0, "p": 9, "s": 18, "z": 27}


def hand(s):
    """34 tile counts of a hand written as ``'123m 456p 11z'``."""
    t = [0] * 34
    for grp in s.split():
        for ch in grp[:-1]:
            t[_SUIT_OFFSET[grp[-1]] + int(ch) - 1] += 1
    return t


@pytest.fixture
def two_kyoku(monkeypatch):
    """Arena games (and their counterfactual branches, which use the same flow) end after their second kyoku (a
    renchan of the first counts): for arena tests whose assertions do not depend on how long a game is."""
    import mortal.play.counterfactual as cf_mod
    import mortal.play.game as game_mod
    from mortal.play import kyoku_flow
    real = game_mod.next_kyoku

    def short(state, result):
        out = real(state, result)
        if out.next is not None and (state.kyoku_index > 0 or state.honba > 0):
            return kyoku_flow.KyokuOutcome(None, out.scores, out.kyotaku)
        return out

    monkeypatch.setattr(game_mod, "next_kyoku", short)
    monkeypatch.setattr(cf_mod, "next_kyoku", short)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny test models on a shared 2-core machine: intra-op threading makes them ~100x slower, so every test
    runs torch single-threaded (restored afterwards)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def no_bar_left_open():
    """A test whose trainer is dropped mid-cycle leaves its tqdm bar registered; tqdm then draws every later bar one
    line lower (cursor moves), which breaks tests that read a bar's output. Close what a test left open."""
    yield
    from tqdm import tqdm
    for bar in list(getattr(tqdm, '_instances', ())):
        bar.close()
