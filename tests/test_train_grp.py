"""train_grp: a few steps on the fixture logs, checkpoint format, resume, loss goes down."""

import gzip
import logging
import os

import pytest
import torch
from torch import optim

from mortal.config import section
from mortal.model.networks import GRP
from mortal.data.reward import load_grp
from mortal.model.checkpoint import atomic_torch_save as save_checkpoint
from mortal.train_grp import GrpFileDatasetsIter, build_file_index, collate, train, train_step
from mortal.train_grp import main as train_grp_main

from conftest import DATA_DIR


def typed_grp(cfg):
    """What train() takes: the typed [grp] of the plain table ``cfg`` (``mortal.config.section``)."""
    return section({"grp": cfg}, "grp")


@pytest.fixture
def cfg(tmp_path):
    data = tmp_path / "data" / "2024"
    data.mkdir(parents=True)
    for i, name in enumerate(["riichienv_selfplay_hanchan.jsonl", "meta_annotated_hanchan.jsonl"]):
        (data / f"{i}.json.gz").write_bytes(gzip.compress((DATA_DIR / name).read_bytes()))
    (data / "bad.json.gz").write_bytes(gzip.compress(b"<mjloggm/>"))
    return {
        "state_file": str(tmp_path / "grp.pth"),
        "network": {"hidden_size": 64, "num_layers": 2},
        "control": {"device": "cpu", "enable_cudnn_benchmark": False, "tensorboard_dir": str(tmp_path / "tb"),
                    "batch_size": 8, "save_every": 2, "val_steps": 1},
        "dataset": {"train_globs": [str(tmp_path / "data" / "**" / "*.json.gz")],
                    "val_globs": [str(data / "1.json.gz")],
                    "file_index": str(tmp_path / "index.pth"), "file_batch_size": 2},
        "optim": {"lr": 1e-3},
    }


def test_train_writes_checkpoint_tensorboard_and_resumes(cfg, tmp_path):
    assert train(typed_grp(cfg), max_steps=4, num_workers=0, progress=False) == 4
    state = torch.load(cfg["state_file"], weights_only=True)
    assert set(state) == {"model", "optimizer", "steps", "timestamp"}
    assert state["steps"] == 4
    assert set(state["model"]) == set(GRP().state_dict())
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]
    # add_scalars writes one run folder per tag/key pair
    tb = set(os.listdir(cfg["control"]["tensorboard_dir"]))
    assert {"loss_train", "loss_val", "acc_train", "acc_val"} <= tb
    index = torch.load(cfg["dataset"]["file_index"], weights_only=True)
    assert len(index["train_file_list"]) == 3 and len(index["val_file_list"]) == 1
    assert train(typed_grp(cfg), max_steps=6, num_workers=0, progress=False) == 6
    assert torch.load(cfg["state_file"], weights_only=True)["steps"] == 6
    grp = load_grp(cfg["state_file"], typed_grp(cfg).network)  # what RewardCalculator uses
    assert not grp.training


def test_samples_are_prefixes_with_final_rank(cfg):
    files, _ = build_file_index(cfg["dataset"]["train_globs"], [], None)
    ds = GrpFileDatasetsIter([f for f in files if f.endswith("0.json.gz")], file_batch_size=1)
    samples = list(ds)
    assert sorted(len(x) for x, _ in samples) == list(range(1, 13))
    assert all(r.tolist() == [3, 2, 1, 0] for _, r in samples)


def test_all_bad_files_raise_instead_of_cycling(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b""))
    with pytest.raises(RuntimeError, match="1 skipped"):
        next(iter(GrpFileDatasetsIter([str(bad)], cycle=True)))


def test_empty_globs_rejected(cfg, tmp_path):
    cfg["dataset"]["val_globs"] = [str(tmp_path / "nothing" / "*.gz")]
    cfg["dataset"]["file_index"] = str(tmp_path / "other_index.pth")
    with pytest.raises(ValueError, match="0 val"):
        train(typed_grp(cfg), max_steps=1, num_workers=0, progress=False)


def test_loss_decreases_on_a_repeated_batch(cfg):
    files, _ = build_file_index(cfg["dataset"]["train_globs"], [], None)
    batch = collate(list(GrpFileDatasetsIter(files, file_batch_size=3)))
    torch.manual_seed(0)
    grp = GRP()
    opt = optim.AdamW(grp.parameters(), lr=1e-3)
    losses = [train_step(grp, opt, *batch)[0] for _ in range(30)]
    assert losses[-1] < losses[0] - 0.5


def test_save_checkpoint_atomic(tmp_path):
    path = tmp_path / "x.pth"
    save_checkpoint({"a": 1}, path)
    save_checkpoint({"a": 2}, path)
    assert torch.load(path, weights_only=True) == {"a": 2} and os.listdir(tmp_path) == ["x.pth"]


def test_progress_line_in_epochs_under_package_logger(cfg, caplog):
    with caplog.at_level(logging.INFO, logger="mortal.train_grp"):
        train(typed_grp(cfg), max_steps=4, num_workers=0, progress=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "mortal.train_grp"
             and r.getMessage().startswith("total steps")]
    # save_every 2: at start (0), after steps 2 and 4; 3 train logs x ~10 kyoku, batch 8 -> 8/30 epoch a step
    assert lines == [f"total steps: {n} est. {n * 8 / 30:.2f} epochs (3 train logs, ~10 kyoku each)"
                     for n in (0, 2, 4)]
    assert lines[-1] == "total steps: 4 est. 1.07 epochs (3 train logs, ~10 kyoku each)"


@pytest.mark.parametrize("flag", ["-c", "--config"])
def test_cli_config_short_flag(tmp_path, capsys, flag):
    missing = tmp_path / "nope.toml"
    assert train_grp_main([flag, str(missing)]) == 2  # parsed by argparse, then the config is looked up
    assert f"config file {missing} not found" in capsys.readouterr().err


@pytest.mark.parametrize("max_steps", ["3", "0", "-2"])
def test_cli_max_steps_must_be_whole_saves(cfg, tmp_path, capsys, max_steps):
    # save_every 2: 3 steps trained and wrote nothing, exit 0; 0 and -2 did nothing, exit 0
    import toml
    path = tmp_path / "c.toml"
    path.write_text(toml.dumps({"grp": cfg}))
    assert train_grp_main(["-c", str(path), "--max-steps", max_steps]) == 2
    assert (f"--max-steps {max_steps} must be a positive multiple of [grp.control] save_every = 2 (the GRP is saved "
            "only then)" in capsys.readouterr().err)
    assert not os.path.exists(cfg["state_file"])


def test_early_stopping_state():
    from mortal.train_grp import early_stopping_state
    assert early_stopping_state([], 2) == (-1, False)
    curve = [3.0, 2.9, 2.95, 3.1]  # turns after the 2nd check
    assert early_stopping_state(curve, 2) == (1, True)
    assert early_stopping_state(curve, 3) == (1, False)
    assert early_stopping_state(curve, 0) == (1, False)  # 0 = never stop
    assert early_stopping_state([2.0, 2.0, 2.0], 2) == (0, True)  # no strict improvement: the first stays best


@pytest.fixture
def overfit_cfg(cfg, tmp_path):
    """Train on game 0 only and validate on games 0 and 1: the val cross entropy first falls (game 0 is learned),
    then rises as the model grows sure of game 0's order, which game 1 does not have (about step 10 at lr 1e-3)."""
    data = tmp_path / "data" / "2024"
    cfg["dataset"]["train_globs"] = [str(data / "0.json.gz")]
    cfg["dataset"]["val_globs"] = [str(data / "0.json.gz"), str(data / "1.json.gz")]
    cfg["dataset"]["file_index"] = str(tmp_path / "overfit_index.pth")
    return cfg


def test_early_stopping_stops_where_the_val_curve_turns_and_keeps_the_best(overfit_cfg):
    import random
    from mortal.train_grp import load_samples, mean_ce
    cfg = overfit_cfg
    torch.manual_seed(0)
    random.seed(0)
    steps = train(typed_grp(cfg), max_steps=400, num_workers=0, progress=False, patience=2)
    state = torch.load(cfg["state_file"], weights_only=True)
    es = state["early_stopping"]
    ces = [ce for _, ce in es["history"]]
    best = ces.index(min(ces))
    assert best > 0 and ces[0] > ces[best]  # the curve fell first
    # stopped 2 validations (of save_every = 2 steps) after the lowest one, long before max_steps
    assert es["stopped"] and steps == state["steps"] < 400
    assert len(ces) == best + 3 and steps == es["best_steps"] + 2 * 2
    assert ces[best + 1] > ces[best] and ces[best + 2] > ces[best]
    assert (es["best_steps"], es["best_ce"]) == (es["history"][best][0], ces[best])
    assert "best_model" not in state
    # the file's model is the best validated one: its val cross entropy is the recorded best
    val = load_samples(cfg["dataset"]["val_globs"])
    assert mean_ce(load_grp(cfg["state_file"], typed_grp(cfg).network), val) == pytest.approx(es["best_ce"], abs=1e-9)
    # a stopped run is finished: a rerun trains nothing
    assert train(typed_grp(cfg), max_steps=400, num_workers=0, progress=False, patience=2) == steps
    assert torch.load(cfg["state_file"], weights_only=True)["timestamp"] == state["timestamp"]


def test_without_patience_training_runs_to_max_steps(overfit_cfg):
    torch.manual_seed(0)
    assert train(typed_grp(overfit_cfg), max_steps=40, num_workers=0, progress=False) == 40
    state = torch.load(overfit_cfg["state_file"], weights_only=True)
    assert set(state) == {"model", "optimizer", "steps", "timestamp"}  # Mortal's layout, no early stopping record


def test_one_bar_for_the_whole_run(cfg, capsys):
    """save_every 2 over 6 steps: one TRAIN bar for the run, the 3 validations shown on it (no bar of their own),
    instead of a fresh TRAIN bar and a VAL bar every save_every steps."""
    capsys.readouterr()
    assert train(typed_grp(cfg), max_steps=6, num_workers=0, progress=True) == 6
    err = capsys.readouterr().err
    assert 'VAL' not in err and err.count('validating') >= 3
    # a bar's last state before its line ends (the fixture's bad log warns in between, outside any handler)
    bars = [line.split('\r')[-1] for line in err.split('\n') if line.split('\r')[-1].startswith('TRAIN')]
    assert len(bars) == 1 and bars[0].startswith('TRAIN: 100%') and '6/6' in bars[0]

