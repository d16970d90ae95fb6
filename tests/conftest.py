"""Shared pytest fixtures."""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Rust errors carry a slow full backtrace when this is set (engine_choice.md).
os.environ.pop("RUST_BACKTRACE", None)

import pytest  # noqa: E402
import torch  # noqa: E402

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


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_config_dict(root):
    """A small, valid config (Mortal layout) with every path under ``root``; see the tiny_config fixture."""
    root = pathlib.Path(root)

    def p(name):
        return str(root / name)

    return {
        "control": {
            "version": 3, "online": True,
            "state_file": p("mortal.pth"), "best_state_file": p("best.pth"), "tensorboard_dir": p("tb"),
            "device": "cpu", "enable_cudnn_benchmark": False, "enable_amp": False, "enable_compile": False,
            "batch_size": 32, "opt_step_every": 1, "save_every": 4, "test_every": 8, "submit_every": 4,
        },
        "train_play": {"default": {
            "games": 4, "log_dir": p("train_play"), "boltzmann_epsilon": 0.005, "boltzmann_temp": 0.05,
            "top_p": 1.0, "repeats": 1,
        }},
        "test_play": {"games": 4, "log_dir": p("test_play")},
        "dataset": {
            "globs": [p("dataset/**/*.json.gz")], "file_index": p("file_index.pth"), "file_batch_size": 2,
            "reserve_ratio": 0.0, "num_workers": 0, "player_names_files": [], "num_epochs": 1,
            "enable_augmentation": False, "augmented_first": False,
        },
        "env": {"gamma": 1.0, "pts": [6.0, 4.0, 2.0, 0.0]},
        "resnet": {"conv_channels": 16, "num_blocks": 1},
        "cql": {"min_q_weight": 5.0},
        "aux": {"next_rank_weight": 0.2},
        "freeze_bn": {"mortal": True},
        "optim": {
            "eps": 1e-8, "betas": [0.9, 0.999], "weight_decay": 0.1, "max_grad_norm": 1.0,
            "scheduler": {"peak": 1e-4, "final": 1e-4, "warm_up_steps": 0, "max_steps": 0},
        },
        "baseline": {
            "train": {"device": "cpu", "enable_compile": False, "state_file": p("baseline.pth")},
            "test": {"device": "cpu", "enable_compile": False, "state_file": p("baseline.pth")},
        },
        "online": {
            "history_window": 50, "enable_compile": False,
            "remote": {"host": "127.0.0.1", "port": _free_port()},
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


@pytest.fixture
def tiny_config(tmp_path):
    """A small valid config for CPU tests: ``(config, path)``.

    ``config`` is the dict ``mortal.config.load_config(path)`` returns (defaults filled in): version 3,
    ``[resnet]`` 16 channels x 1 block, device ``cpu``, every path under ``tmp_path``, ``[train_play.default]``
    and ``[test_play]`` 4 games, ``capacity`` 4, ``batch_size`` 32, ``opt_step_every`` 1, ``save_every`` 4,
    ``test_every`` 8, ``submit_every`` 4, ``num_workers`` 0, a free loopback port in ``[online.remote]``, plus
    ``[1v3]`` (4 games x 1 iter, seed_key 0) and the ``[grp.*]`` tables. ``path`` is ``tmp_path/'config.toml'``,
    already written; to change a value, edit the dict, ``toml.dump`` it to ``path`` again (or pass the dict on).
    Nothing under ``tmp_path`` besides the config file exists yet (no checkpoints).
    """
    import toml
    from mortal.config import load_config

    path = tmp_path / "config.toml"
    with open(path, "w", encoding="utf-8") as f:
        toml.dump(tiny_config_dict(tmp_path), f)
    return load_config(path), path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny test models on a shared 2-core machine: intra-op threading makes them ~100x slower, so every test
    runs torch single-threaded (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
