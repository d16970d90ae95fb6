"""The quickstart's embedded config: size presets and the template in Mortal's layout."""

import socket
from pathlib import Path

import toml

from mortal.config import CONFIG_DIR, lookup
from mortal.util.fsutil import atomic_write_bytes

# Sizes of the two presets; games are multiples of 4 (one duplicate set). Early stopping is on in both (the schema
# keeps Mortal's fixed lengths). test_every 600: on 2 cores restarts every 60 steps starved the client
# (docs/learning.md, part 4, arm test600). 64 games a round: more rows a forward, 0.64x the client's CPU a hanchan
# (docs/performance.md, the online system on 2 cores); capacity holds two rounds.
PRESETS = {
    'full': dict(online_timeout=900, boot_games=96, boot_val_games=16, grp_steps=400, grp_save_every=10,
                 grp_patience=3, offline_epochs=1, offline_max_epochs=3,
                 train_games=64, test_games=16, batch_size=64, save_every=20, test_every=600,
                 submit_every=20, capacity=128, eval_sets=100, rulebase_sets=40),
    'short': dict(online_timeout=900, boot_games=8, boot_val_games=4, grp_steps=40, grp_save_every=10,
                  grp_patience=1, offline_epochs=1, offline_max_epochs=2,
                  train_games=8, test_games=8, batch_size=64, save_every=10, test_every=20,
                  submit_every=10, capacity=32, eval_sets=4, rulebase_sets=2),
}

# The online loss extras of the embedded config (docs/learning.md); config_online.toml keeps Mortal's (none).
ONLINE_REMEDY = dict(anchor_weight=1.0, offline_batch_size=64)

# Mortal's config layout; {work} is the work dir (or '{config_dir}'), the rest comes from a preset.
CONFIG_TEMPLATE = """\
# Written by mortal.tools.quickstart: a tiny CPU setup that runs the whole pipeline in minutes.
[control]
version = {version}
online = true
state_file = '{work}/online/mortal.pth'
best_state_file = '{work}/online/best.pth'
tensorboard_dir = '{work}/online/tensorboard'
device = 'cpu'
enable_cudnn_benchmark = false
enable_amp = false
enable_compile = false
batch_size = {batch_size}
opt_step_every = 1
save_every = {save_every}
test_every = {test_every}
submit_every = {submit_every}

[train_play.default]
games = {train_games}
log_dir = '{work}/online/train_play'
boltzmann_epsilon = 0.005
boltzmann_temp = 0.05
top_p = 1.0
repeats = 1

[test_play]
games = {test_games}
log_dir = '{work}/online/test_play'

[dataset]
globs = ['{work}/bootstrap/logs/train/**/*.json.gz']
file_index = '{work}/bootstrap/file_index.pth'
file_batch_size = 8
reserve_ratio = 0.0
num_workers = 1
player_names_files = []
num_epochs = {offline_epochs}
enable_augmentation = false
augmented_first = false

[env]
gamma = 1
pts = [6.0, 4.0, 2.0, 0.0]

[resnet]
conv_channels = 32
num_blocks = 2

[cql]
min_q_weight = 5

[aux]
next_rank_weight = 0.2

[freeze_bn]
mortal = true

[optim]
eps = 1e-8
betas = [0.9, 0.999]
weight_decay = 0.1
max_grad_norm = 1.0

[optim.scheduler]
# online learning rate, Mortal's online reference; the offline bootstrap uses [bootstrap] offline_lr
peak = 1e-5
final = 1e-5
warm_up_steps = 0
max_steps = 0

[baseline.train]
device = 'cpu'
enable_compile = false
state_file = '{work}/online/baseline.pth'

[baseline.test]
device = 'cpu'
enable_compile = false
state_file = '{work}/online/baseline.pth'

[online]
history_window = 50
enable_compile = false
# Not Mortal's default (0): hold the untaken actions' Q to the baseline's, which stops the collapse that Mortal's
# online loss causes in this small model (docs/learning.md).
anchor_weight = {anchor_weight}
# Not Mortal's default (0): 64 bootstrap samples ([dataset]) with the offline CQL loss join each online batch
# (RLPD-style); where the gain of the online phase comes from is in docs/learning.md.
offline_batch_size = {offline_batch_size}
# Not Mortal's default (true): the learner trains on after each test play instead of exiting and being restarted
# 3 s later: on 2 cores 12% more hanchan in the same minutes, learning the same (docs/performance.md, session 26).
restart_after_test_play = false

[online.remote]
host = '127.0.0.1'
port = {port}

[online.server]
buffer_dir = '{work}/online/buffer'
drain_dir = '{work}/online/drain'
capacity = {capacity}
force_sequential = false

[grp]
state_file = '{work}/bootstrap/grp.pth'

[grp.network]
hidden_size = 64
num_layers = 2

[grp.control]
device = 'cpu'
enable_cudnn_benchmark = false
tensorboard_dir = '{work}/bootstrap/grp_tensorboard'
batch_size = 64
save_every = {grp_save_every}
val_steps = 4

[grp.dataset]
train_globs = ['{work}/bootstrap/logs/train/*.json.gz']  # as the bootstrap's GRP index has them
val_globs = ['{work}/bootstrap/logs/val/*.json.gz']
file_index = '{work}/bootstrap/grp_file_index.pth'
file_batch_size = 8

[grp.optim]
lr = 1e-3

[bootstrap]
games = {boot_games}
val_games = {boot_val_games}
log_dir = '{work}/bootstrap/logs'
work_dir = '{work}/bootstrap'
# at most grp_steps: early stopping on the val logs' cross entropy, best kept (schema default 0 = off)
grp_steps = {grp_steps}
grp_patience = {grp_patience}
offline_lr = 1e-4
# early stopping of the offline run on the val logs' offline loss (schema default: 1 epoch, as before), after
# [bootstrap] offline_patience (the schema's 1) epochs without a new lowest one
offline_max_epochs = {offline_max_epochs}
"""


def free_port():
    """A TCP port that is free right now on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def render_config(work_dir, *, preset='full', port=None, version=3, relative=False):
    """Config text for ``work_dir``, ``preset`` and ``version``; ``relative``: paths from ``{config_dir}``."""
    if version not in (3, 4):
        raise ValueError(f"quickstart version must be 3 or 4, got {version!r}")
    work = CONFIG_DIR if relative else Path(work_dir).expanduser().resolve().as_posix()
    if any(c == "'" or ord(c) < 32 or ord(c) == 127 for c in work):  # a TOML literal string cannot hold them
        raise ValueError(f'{work!r}: a work folder whose path holds a quote (\') or a control character cannot be '
                         f'written into the config; choose another folder')
    # (str.format ignores the preset's sizes that are not config values: online_timeout, eval_sets, rulebase_sets)
    return CONFIG_TEMPLATE.format(work=work, port=port or free_port(), version=version, **PRESETS[preset],
                                  **ONLINE_REMEDY)


def write_config(work_dir, *, preset='full', port=None, version=3, relative=False):
    """Write ``work_dir/config.toml``; ValueError when the dir holds a config of another version."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    path = work / 'config.toml'
    if path.exists():
        old = lookup(toml.load(path), 'control.version')  # the file as it is, checked or not
        if old is not None and old != version:
            raise ValueError(f"{work} was set up for version {old}; use --version {old} or another --work-dir")
    text = render_config(work, preset=preset, port=port, version=version, relative=relative)
    atomic_write_bytes(text.encode(), path)
    return path
