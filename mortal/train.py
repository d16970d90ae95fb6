"""The learner (Mortal's ``mortal/train.py``), online and offline.

Online (``[control] online = true``): ``main()`` runs a supervisor that starts the learner as a child process and
restarts it 3 s after it exits with status 0 (it stops, with the child's status, on anything else). The child
submits its parameters to the server as idle, drains replays (polling every 5 s) and hard-links them into its own
``<drain_dir>.trainer`` (the server empties ``drain_dir`` at its next drain and at every start, possibly while the
learner still reads), learns from the ``trainee`` seat only, submits parameters every ``submit_every`` steps (and at
a save that missed a submit), saves every ``save_every`` steps, runs a test play every ``test_every`` steps and then
exits 0 (Mortal restarts the learner there to dodge a hang). It submits idle parameters at the end of every drained
epoch. Which claimed samples are trained is recorded in ``<drain_dir>.trainer/claims.json`` (``mortal.claims``), so a
restarted learner first finishes the claimed logs its predecessor left, and an epoch's leftover samples are trained
with the next drain. The supervisor runs the learner in its own process group and kills what is left of the group
after the learner ends; the learner's loader processes die with it (``mortal.lifetime``).

Offline (``online = false``): the logs of ``[dataset] globs`` (file list cached in ``file_index``, seats filtered
by ``player_names_files``), one epoch per run, with the CQL term.

Loss per batch (Mortal): ``0.5 * MSE(q[action], gamma ** steps_to_done * kyoku_reward)
+ next_rank_weight * CE(next-rank logits, player_rank)`` ``+ min_q_weight * (logsumexp(q) - q[action])`` offline.
AdamW with weight decay on Linear/Conv1d weights only, gradient accumulation over ``opt_step_every`` batches
(keyed on the global step), clipping at ``max_grad_norm`` after unscaling, GradScaler + autocast with
``enable_amp``, Mortal's linear warm-up + cosine learning rate stepped every batch, BatchNorm frozen per
``[freeze_bn] mortal``.

Checkpoints carry Mortal's keys (``mortal``, ``current_dqn``, ``aux_net``, ``optimizer``, ``scheduler``, ``scaler``,
``steps``, ``timestamp``, ``best_perf``, ``config``) and are written to a temporary file then renamed, so a kill at
any moment leaves the previous checkpoint intact.

TensorBoard: Mortal's tags (``loss/dqn_loss``, ``loss/cql_loss`` offline, ``loss/next_rank_loss``, ``hparam/lr``,
histograms ``q_predicted``/``q_target``, the ``test_play/*`` groups) plus data-health tags (online):
``data/logs_per_drain``, ``data/samples_per_drain``, ``data/staleness_mean``/``data/staleness_max`` (parameter
versions between the one a log was played with and the trainer's latest), ``data/wait_seconds`` (learner time
spent waiting for a drain), ``data/samples_dropped`` (samples of claimed logs lost untrained; 0 expected).

Extras, all off by default (Mortal): ``[cql] online_min_q_weight``/``calibrated``, ``[online] anchor_weight``,
``ema_decay`` and ``offline_batch_size`` (offline rows of ``[dataset]`` mixed into each online batch, RLPD-style,
with ``loss/offline_cql_loss``); see ``docs/learning.md``.
"""

if __package__ in (None, ''):  # run as a script: python mortal/train.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import argparse
import copy
import gc
import gzip
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from datetime import datetime
from glob import glob, escape as glob_escape
from itertools import chain
from os import path

import torch
from torch import nn, optim
from torch.optim.lr_scheduler import LambdaLR

from mortal import wire
from mortal.checkpoint import (INITIAL_BEST_PERF, CheckpointError, atomic_torch_save, check_fits_config, describe_error,
                               load_checkpoint, load_model_pair, read_baseline, require_entries)
from mortal.fsutil import atomic_copy, empty_dir, stamped_name
from mortal.diagnostics import Probe, WindowMeans, batch_q_stats
from mortal.loss import anchor_term, cql_term

logger = logging.getLogger('mortal.train' if __name__ == '__main__' else __name__)

IS_SUB_PROC_KEY = 'MORTAL_IS_SUB_PROC'  # set by the supervisor for its child; do not set it by hand
SUPERVISOR_PID_KEY = 'MORTAL_SUPERVISOR_PID'  # set with it: the learner dies with this process
GROUP_GRACE = 3.0  # seconds a finished learner's loader processes get to exit by themselves before a SIGKILL
RESTART_DELAY = 3.0  # seconds between a child's clean exit and the next start (Mortal)
DRAIN_POLL_INTERVAL = 5.0  # seconds between empty drains (Mortal)
DISPLAY_PTS = [90, 45, 0, -135]  # test-play avg pt, display and best.pth rule only; never a training signal
# Extra checkpoint entry 'guard' (mortal.gate, docs/operations.md): the state of the long-run guards.
INITIAL_GUARD = {'worse_streak': 0, 'rotate_streak': 0, 'rollbacks': 0, 'rotations': 0, 'lr_scale': 1.0,
                 'epsilon_scale': 1.0, 'baseline_version': 0, 'test_plays': 0, 'baseline_digest': ''}
HISTOGRAM_STRIDE = 128  # Mortal keeps every 128th q value to keep event files small
CHECKPOINT_KEYS = ('mortal', 'current_dqn', 'aux_net', 'optimizer', 'scheduler', 'scaler', 'steps', 'timestamp',
                   'best_perf', 'config')


class LinearWarmUpCosineAnnealingLR(LambdaLR):
    """Mortal's schedule; the optimizer's base lr must be 1 so the factor is the learning rate.

    lr(step) with ``s = step + offset`` (then ``s %= epoch_size`` when epoch_size > 0):
    ``init + (peak - init) * s / warm_up_steps`` while ``s < warm_up_steps``; then, while ``s < max_steps``,
    ``final + (peak - final) * (1 + cos(pi * (s - warm_up_steps) / (max_steps - warm_up_steps))) / 2``;
    ``final`` afterwards (so ``max_steps = 0`` with no warm-up is a constant ``final``).
    Raises ValueError on a shape that ``mortal.config.scheduler_problems`` (also the config check) rejects:
    ``peak >= final >= init >= 0`` and ``max_steps`` 0 (``final`` right after the warm-up) or >= ``warm_up_steps``.
    """

    def __init__(self, optimizer, *, peak, final, warm_up_steps, max_steps, init=1e-8, offset=0, epoch_size=0,
                 **kwargs):
        from mortal.config import scheduler_problems  # the same rules as the config check
        problems = scheduler_problems(peak=peak, final=final, warm_up_steps=warm_up_steps, max_steps=max_steps,
                                      init=init, offset=offset, epoch_size=epoch_size)
        if problems:
            raise ValueError('; '.join(f'[optim.scheduler] {key} {rule}' for key, rule in problems))
        self.init, self.peak, self.final = init, peak, final
        self.warm_up_steps, self.max_steps = warm_up_steps, max_steps
        self.offset, self.epoch_size = offset, epoch_size
        self.multiplier = None  # extra: a callable giving the [schedule.lr] x rollback factor (None = 1, Mortal)
        super().__init__(optimizer, lr_lambda=self.factor, **kwargs)

    def factor(self, step: int) -> float:
        scale = 1.0 if self.multiplier is None else self.multiplier()
        return scale * self.base_factor(step)

    def base_factor(self, step: int) -> float:
        """Mortal's learning rate at ``step``, without ``multiplier``."""
        s = step + self.offset
        if self.epoch_size > 0:
            s %= self.epoch_size
        if self.warm_up_steps > 0 and s < self.warm_up_steps:
            return self.init + (self.peak - self.init) / self.warm_up_steps * s
        if s < self.max_steps:
            progress = (s - self.warm_up_steps) / (self.max_steps - self.warm_up_steps)
            return self.final + 0.5 * (self.peak - self.final) * (1 + math.cos(progress * math.pi))
        return self.final

    _SHAPE_KEYS = ('init', 'peak', 'final', 'warm_up_steps', 'max_steps', 'offset', 'epoch_size')

    def state_dict(self):
        """Plain numbers only (loadable with ``weights_only=True``); the factor function is not stored."""
        return {k: v for k, v in self.__dict__.items() if k not in ('optimizer', 'lr_lambdas', 'multiplier')}

    def load_state_dict(self, state_dict):
        """Restore the position in the schedule (``last_epoch`` etc.) but keep the schedule's shape from the
        config, so an edited ``[optim.scheduler]`` takes effect on resume (Mortal silently kept the old one).
        Accepts Mortal's checkpoints (which also hold ``lr_lambdas``)."""
        for key, value in state_dict.items():
            if key not in self._SHAPE_KEYS and key not in ('lr_lambdas', 'multiplier'):
                self.__dict__[key] = value
        self.refresh()

    def refresh(self) -> None:
        """Set the optimizer's learning rates to the schedule's value now (after a load, or a change of
        ``multiplier``'s value)."""
        lrs = [base * self.factor(self.last_epoch) for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group['lr'] = lr
        self._last_lr = lrs


CheckpointMismatchError = CheckpointError  # the old name of a checkpoint that does not fit the config (tests use it)


class TestPlayDone(Exception):
    """Online learner finished a test play: the child exits 0 and the supervisor starts a fresh one."""


def parameter_count(module: nn.Module) -> int:
    """Number of trainable scalars in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def build_param_groups(models, weight_decay: float) -> list:
    """Two AdamW groups: weights of Linear/Conv1d layers decayed by ``weight_decay``; everything else (biases,
    norms) undecayed, each in a deterministic (sorted-name) order, as Mortal."""
    decay, no_decay = [], []
    for model in models:
        params, to_decay = {}, set()
        for mod_name, mod in model.named_modules():
            for name, param in mod.named_parameters(prefix=mod_name, recurse=False):
                params[name] = param
                if isinstance(mod, (nn.Linear, nn.Conv1d)) and name.endswith('weight'):
                    to_decay.add(name)
        decay.extend(params[n] for n in sorted(to_decay))
        no_decay.extend(params[n] for n in sorted(params.keys() - to_decay))
    return [{'params': decay, 'weight_decay': weight_decay}, {'params': no_decay}]


def played_checkpoint(state: dict) -> dict:
    """``state`` with ``mortal``/``current_dqn`` replaced by its ``ema_mortal``/``ema_dqn`` (``[online]
    ema_decay``), without the ema keys: the model that was played, loadable by any Mortal player. Unchanged
    (a shallow copy) without them."""
    state = dict(state)
    if 'ema_mortal' in state and 'ema_dqn' in state:
        state['mortal'], state['current_dqn'] = state.pop('ema_mortal'), state.pop('ema_dqn')
    return state


def is_better(avg_pt: float, avg_rank: float, best_perf: dict) -> bool:
    """Mortal's best.pth rule: avg pt not worse AND avg rank not worse than the best so far."""
    return avg_pt >= best_perf['avg_pt'] and avg_rank <= best_perf['avg_rank']


def units_summary(units: dict) -> tuple:
    """``(avg_rank, avg_pt)`` over every game of ``{nonce: [ranks 1-4]}``, pt by ``DISPLAY_PTS``."""
    ranks = [r for rs in units.values() for r in rs]
    return sum(ranks) / len(ranks), sum(DISPLAY_PTS[r - 1] for r in ranks) / len(ranks)


def iter_full_batches(batches, batch_size: int, on_drop=None):
    """Yield the full-size batches of ``batches`` as they come; shorter ones (e.g. each DataLoader worker's last)
    are pooled and re-cut into full batches at the end; fewer than ``batch_size`` leftover samples are dropped,
    as Mortal. Each batch is a tuple of tensors sharing the first dimension. ``on_drop``, if given, is called
    once with the dropped samples (a tuple like a batch, fewer than ``batch_size`` rows) when there are any."""
    leftovers, leftover_size = [], 0
    for batch in batches:
        size = batch[0].shape[0]
        if size == batch_size:
            yield batch
        else:
            leftovers.append(batch)
            leftover_size += size
    if not leftovers:
        return
    pooled = [torch.cat(parts, dim=0) for parts in zip(*leftovers)]
    full = leftover_size - leftover_size % batch_size
    for start in range(0, full, batch_size):
        yield tuple(t[start:start + batch_size] for t in pooled)
    if full < leftover_size and on_drop is not None:
        on_drop(tuple(t[full:] for t in pooled))


def staleness(drain_reply: dict) -> list:
    """Parameter versions between each drained log's version and the server's current one (unknown ones left out)."""
    current = drain_reply.get('param_version', 0)
    return [current - v for v in drain_reply.get('param_versions', []) if v >= 0]


def claim_dir_for(drain_dir: str) -> str:
    """The learner's own directory next to the server's ``drain_dir``: ``<drain_dir>.trainer``."""
    return path.normpath(drain_dir) + '.trainer'


def _free_name(name: str, taken: set) -> str:
    # Drained names restart at '0_' with every server instance: one may meet a log still kept from before.
    k = 1
    candidate = name
    while candidate in taken:
        candidate = f'{k}+{name}'
        k += 1
    return candidate


def claim_drained(drain_dir: str, files, claim_dir: str, *, keep=(), on_claim=None) -> tuple:
    """Hard-link (copy where links fail, e.g. across file systems) each drained ``drain_dir/name`` of ``files``
    into ``claim_dir``, whose other entries are removed first, except those named in ``keep`` (logs claimed
    earlier and not yet fully trained, the ledger's manifest: ``mortal.claims``).

    A name already in ``keep`` is claimed as ``'<k>+<name>'``. ``on_claim(names)``, if given, is called with the
    names in ``claim_dir`` before anything is linked. The server empties ``drain_dir`` at its next drain and at
    every start (Mortal), possibly while our DataLoader is still reading it; the learner reads only its claimed
    links, which nobody else touches. Returns (claimed paths in ``files`` order, names of ``files`` that had
    vanished before they could be claimed).
    """
    keep = set(keep)
    empty_dir(claim_dir, keep)
    targets = []
    for name in files:
        targets.append(_free_name(name, keep))
        keep.add(targets[-1])
    if on_claim is not None:
        on_claim(targets)
    claimed, vanished = [], []
    for name, target in zip(files, targets):
        src, dst = path.join(drain_dir, name), path.join(claim_dir, target)
        try:
            _link_or_copy(src, dst)
        except FileNotFoundError:
            vanished.append(name)
            continue
        claimed.append(dst)
    return claimed, vanished


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except FileNotFoundError:
        raise
    except OSError:  # EXDEV, EPERM, a file system without hard links: a copy (same bytes, more disk)
        shutil.copyfile(src, dst)


def filtered_trimmed_lines(lines):
    """Non-empty stripped lines."""
    return [line for line in (raw.strip() for raw in lines) if line]


def _first_event(filename: str) -> dict:
    opener = gzip.open if filename.endswith('.gz') else open
    with opener(filename, 'rt', encoding='utf-8') as f:
        return json.loads(next(f))


def build_file_list(dataset_cfg: dict, player_names: set) -> list:
    """Offline file list: ``[dataset] file_index`` if it exists, else expand ``globs`` (keeping files where one
    of ``player_names`` sits, when given), sort descending (Mortal) and cache it in ``file_index`` (an empty list
    is never cached, so fixing the globs takes effect). Raises ValueError naming ``file_index`` when that file is
    not an index this function wrote."""
    file_index = dataset_cfg['file_index']
    if path.exists(file_index):
        try:
            file_list = list(load_checkpoint(file_index)['file_list'])
        except Exception as ex:  # garbage, another format, or no 'file_list' key
            raise ValueError(f'[dataset] file_index {file_index} is not a file index ({describe_error(ex)}); '
                             f'delete it to rebuild it from [dataset] globs') from None
        logger.info('file index loaded from %s', file_index)
        return file_list
    logger.info('building file index...')
    file_list = []
    for pattern in dataset_cfg['globs']:
        file_list.extend(glob(pattern, recursive=True))
    if player_names:
        kept = []
        for filename in file_list:
            try:
                names = _first_event(filename)['names']
            except (OSError, EOFError, StopIteration, ValueError, KeyError, TypeError) as ex:
                logger.warning('skipping %s while indexing: %s: %s', filename, type(ex).__name__, ex)
                continue
            if not player_names.isdisjoint(names):
                kept.append(filename)
        file_list = kept
    file_list.sort(reverse=True)
    if file_list:
        atomic_torch_save({'file_list': file_list}, file_index)
    return file_list


def load_player_names(files) -> set:
    """Union of the names listed one per line in ``[dataset] player_names_files``. Raises ValueError naming the
    key and the file when one cannot be read."""
    names = set()
    for filename in files:
        try:
            with open(filename, encoding='utf-8') as f:
                names.update(filtered_trimmed_lines(f))
        except (OSError, UnicodeDecodeError) as ex:
            raise ValueError(f'[dataset] player_names_files: cannot read {filename}: {ex}') from None
    return names


class Trainer:
    """One learner process: models, optimizer, checkpoint, TensorBoard, server traffic.

    Args:
        config: the full config dict (``load_config``).
        test_player: object with ``test_play(seed_count, mortal, dqn, device) -> Stat``; built from
            ``[baseline.test]`` when None.
        remote: ``wire.Remote`` of the server (online), from ``[online.remote]`` when None.
        writer: a SummaryWriter-like object; ``SummaryWriter([control] tensorboard_dir)`` when None.
        sleep: the sleep function (tests replace it).
    Raises mortal.checkpoint.CheckpointError (a checkpoint that cannot be loaded or does not fit the config),
    UnsupportedVersionError, ValueError for version 1 (Mortal's trainer neither supports it: its phi is a latent
    pair).
    """

    def __init__(self, config: dict, *, test_player=None, remote=None, writer=None, sleep=time.sleep):
        from mortal.model import AuxNet, Brain, DQN
        from mortal.obs import check_version, obs_shape

        self.config = config
        control = config['control']
        self.version = check_version(control['version'])
        if self.version == 1:
            raise ValueError('[control] version = 1 cannot be trained (as in Mortal): use version 2 or 3')
        self.online = control['online']
        self.batch_size = control['batch_size']
        self.opt_step_every = control['opt_step_every']
        self.save_every = control['save_every']
        self.test_every = control['test_every']
        self.submit_every = control['submit_every']
        self.state_file = control['state_file']
        self.best_state_file = control['best_state_file']
        self.enable_amp = control['enable_amp']
        self.test_games = config['test_play']['games']
        test_cfg = config['test_play']
        self.best_rule = test_cfg.get('best_rule', 'paired')
        self.confidence = test_cfg.get('confidence', 0.95)
        self.sprt = None
        if self.best_rule == 'sprt':
            from mortal.gate import Sprt
            self.sprt = Sprt(test_cfg['sprt_delta'], test_cfg['sprt_alpha'], test_cfg['sprt_beta'])
        self.sprt_chunk_deals = test_cfg.get('sprt_chunk', 64) // 4
        self.fresh_deals = test_cfg.get('fresh_deals', False)
        from mortal.config import optional_section
        self.guard_cfg = optional_section(config, 'guard')
        self.rotation_cfg = optional_section(config, 'rotation')
        self.schedules = {name: optional_section(config, f'schedule.{name}') for name in ('lr', 'epsilon', 'temp')}
        self.min_q_weight = config['cql']['min_q_weight']
        # Extras (defaults = Mortal: no CQL online, no anchor); see mortal/loss.py.
        self.online_min_q_weight = config['cql'].get('online_min_q_weight', 0.0)
        self.calibrated_cql = config['cql'].get('calibrated', False)
        self.anchor_weight = config.get('online', {}).get('anchor_weight', 0.0) if self.online else 0.0
        # RLPD-style mix: offline samples of [dataset] appended to each online batch (0 = off, Mortal)
        self.offline_batch_size = config.get('online', {}).get('offline_batch_size', 0) if self.online else 0
        self.next_rank_weight = config['aux']['next_rank_weight']
        self.gamma = config['env']['gamma']
        self.max_grad_norm = config['optim']['max_grad_norm']
        self.sleep = sleep
        self.device = torch.device(control['device'])
        torch.backends.cudnn.benchmark = control['enable_cudnn_benchmark']

        resnet = config['resnet']
        self.mortal = Brain(version=self.version, conv_channels=resnet['conv_channels'],
                            num_blocks=resnet['num_blocks'], dropout=resnet.get('dropout', 0.0)).to(self.device)
        self.dqn = DQN(version=self.version).to(self.device)
        self.aux_net = AuxNet((4,)).to(self.device)
        self.models = (self.mortal, self.dqn, self.aux_net)
        if control['enable_compile']:
            for m in self.models:
                m.compile()
        logger.info('version: %d, obs shape: %s', self.version, obs_shape(self.version))
        logger.info('mortal params: %s, dqn params: %s, aux params: %s', f'{parameter_count(self.mortal):,}',
                    f'{parameter_count(self.dqn):,}', f'{parameter_count(self.aux_net):,}')
        self.mortal.freeze_bn(config['freeze_bn']['mortal'])

        opt_cfg = config['optim']
        self.optimizer = optim.AdamW(build_param_groups(self.models, opt_cfg['weight_decay']), lr=1,
                                     weight_decay=0, betas=tuple(opt_cfg['betas']), eps=opt_cfg['eps'])
        self.scheduler = LinearWarmUpCosineAnnealingLR(self.optimizer, **opt_cfg['scheduler'])
        # With accumulation the scheduler steps every batch but the optimizer every opt_step_every (Mortal).
        warnings.filterwarnings('ignore', message=r'Detected call of `lr_scheduler.step\(\)` before')
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.enable_amp)
        self.best_perf = dict(INITIAL_BEST_PERF)
        self.guard = dict(INITIAL_GUARD)
        self.steps = 0
        self._loaded_ema = None
        self.load_state()
        from mortal.schedule import schedule_factor
        self.scheduler.multiplier = lambda: (schedule_factor(self.schedules['lr'], self.steps)
                                             * self.guard['lr_scale'])
        self.scheduler.refresh()
        # Extra: an EMA of the weights is what gets published, test-played and kept as best.pth (0 = off, Mortal).
        self.ema_decay = config.get('online', {}).get('ema_decay', 0.0) if self.online else 0.0
        self.ema = self._init_ema() if self.ema_decay > 0 else None
        self.optimizer.zero_grad(set_to_none=True)
        self.mse = nn.MSELoss()
        self.ce = nn.CrossEntropyLoss()

        if test_player is None:
            from mortal.player import TestPlayer
            test_player = TestPlayer(config)
        self.test_player = test_player
        self.remote = remote if remote is not None or not self.online else wire.Remote.from_config(config)
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(control['tensorboard_dir'])
        self.writer = writer
        self.reset_stats()
        self.diag = WindowMeans()
        self.last_diag = {}  # the diag/* values of the last save (the guards' instrument bounds read them)
        self.anchor = self._load_anchor() if self.anchor_weight > 0 else None
        self.probe = self._load_probe() if self.online else None
        self.offline_stream = self._checked_offline_stream() if self.offline_batch_size > 0 else None
        self.all_q = torch.zeros((self.save_every, self.batch_size), device=self.device)
        self.all_q_target = torch.zeros((self.save_every, self.batch_size), device=self.device)
        self.idx = 0
        self.pb = None
        self.lost_logs = 0  # drained logs that vanished before the learner claimed them
        self.resubmitted_to = set()  # server_ids of instances found without parameters (each resubmitted to once)
        self.ledger = None  # online: mortal.claims.ClaimLedger of the claim folder (opened by claims())
        self.resumed = False  # online: the claimed logs a previous learner left have been looked at

    # -- checkpoint ------------------------------------------------------------------------------------------

    def load_state(self) -> bool:
        """Resume from ``[control] state_file`` if it exists; returns whether it did.

        An offline checkpoint loaded for online training keeps the config's optimizer/scheduler (Mortal).
        Raises CheckpointError: not loadable, lacking an entry, or weights that do not fit the config.
        """
        if not path.exists(self.state_file):
            logger.info('no checkpoint at %s: starting from scratch', self.state_file)
            return False
        state = load_checkpoint(self.state_file, map_location=self.device)
        require_entries(state, ('mortal', 'current_dqn', 'aux_net', 'steps'), self.state_file)
        ckpt_cfg = state.get('config')
        for model, entry in ((self.mortal, 'mortal'), (self.dqn, 'current_dqn'), (self.aux_net, 'aux_net')):
            check_fits_config(model, state[entry], entry=entry, source=self.state_file, ckpt_cfg=ckpt_cfg,
                              config=self.config)
            model.load_state_dict(state[entry])
        ckpt_online = bool(ckpt_cfg and ckpt_cfg.get('control', {}).get('online'))
        if 'optimizer' not in state or 'scheduler' not in state:
            logger.info('%s has no optimizer/scheduler state (a bare model checkpoint): starting them fresh',
                        self.state_file)
        elif not self.online or ckpt_online:
            self.optimizer.load_state_dict(state['optimizer'])
            self.scheduler.load_state_dict(state['scheduler'])
        else:
            logger.info('offline checkpoint in online mode: optimizer and scheduler start fresh from the config')
        if self.scaler.is_enabled() and state.get('scaler'):
            self.scaler.load_state_dict(state['scaler'])
        self.best_perf = dict(state.get('best_perf', INITIAL_BEST_PERF))
        self.guard = {**INITIAL_GUARD, **state.get('guard', {})}
        self.steps = int(state['steps'])
        if 'ema_mortal' in state and 'ema_dqn' in state:
            self._loaded_ema = (state['ema_mortal'], state['ema_dqn'])
        when = datetime.fromtimestamp(state.get('timestamp', 0)).strftime('%Y-%m-%d %H:%M:%S')
        logger.info('loaded %s (saved %s, steps %d)', self.state_file, when, self.steps)
        return True

    def _init_ema(self):
        """Frozen copies of (mortal, dqn): from the checkpoint's ``ema_mortal``/``ema_dqn`` when it has them, else
        the loaded weights."""
        ema = tuple(copy.deepcopy(m).requires_grad_(False) for m in (self.mortal, self.dqn))
        if self._loaded_ema is not None:
            for model, sd in zip(ema, self._loaded_ema):
                model.load_state_dict(sd)
        logger.info('EMA of the weights, decay %g (%s)', self.ema_decay,
                    'resumed' if self._loaded_ema is not None else 'from the loaded weights')
        return ema

    @torch.no_grad()
    def update_ema(self) -> None:
        """``ema = decay * ema + (1 - decay) * weights`` after an optimizer step; buffers are copied."""
        for ema, model in zip(self.ema, (self.mortal, self.dqn)):
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p.detach(), 1.0 - self.ema_decay)
            for e, b in zip(ema.buffers(), model.buffers()):
                e.copy_(b)

    def played(self) -> tuple:
        """The (mortal, dqn) that self-play, test play and best.pth use: the EMA when ``[online] ema_decay`` > 0."""
        return self.ema if self.ema is not None else (self.mortal, self.dqn)

    def checkpoint(self) -> dict:
        """The checkpoint dict with Mortal's keys (config without the shared token), plus ``ema_mortal`` and
        ``ema_dqn`` with an EMA."""
        from mortal.config import for_checkpoint
        extra = {}
        if self.ema is not None:
            extra = {'ema_mortal': self.ema[0].state_dict(), 'ema_dqn': self.ema[1].state_dict()}
        if self.online:  # the long-run guards' state (run_guards), after Mortal's keys
            extra['guard'] = dict(self.guard)
        return {
            'mortal': self.mortal.state_dict(),
            'current_dqn': self.dqn.state_dict(),
            'aux_net': self.aux_net.state_dict(),
            'optimizer': self.optimizer.state_dict(),
            'scheduler': self.scheduler.state_dict(),
            'scaler': self.scaler.state_dict(),
            'steps': self.steps,
            'timestamp': datetime.now().timestamp(),
            'best_perf': dict(self.best_perf),
            'config': for_checkpoint(self.config),
            **extra,
        }

    def save(self) -> None:
        """Write ``checkpoint()`` to ``[control] state_file`` atomically."""
        atomic_torch_save(self.checkpoint(), self.state_file)

    # -- server traffic --------------------------------------------------------------------------------------

    def submit_param(self, is_idle: bool = False) -> None:
        """Send the current mortal/dqn weights to the server (retrying while it is unreachable).

        A refusal (e.g. an architecture other than the one the running server accepted first) is logged as one
        error line and ends the learner with SystemExit(2): retrying cannot help."""
        mortal, dqn = self.played()
        msg = {
            'type': 'submit_param',
            'mortal': wire.pack_state_dict(mortal.state_dict()),
            'dqn': wire.pack_state_dict(dqn.state_dict()),
            'is_idle': is_idle,
            **self.play_settings(),
        }
        try:
            reply = wire.request_with_retry(self.remote, msg, sleep=self.sleep)
        except wire.RequestRefused as ex:
            logger.error('%s', ex)
            raise SystemExit(2) from None
        logger.info('param has been submitted (version %d%s)', reply.get('param_version', -1),
                    ', idle' if is_idle else '')

    def sync_baseline(self, *, rotated: bool = False) -> None:
        """Submit ``[baseline.train] state_file`` to the server (``submit_baseline``), for clients that fetch it
        (``[baseline.train] from_server``). When its weights differ from those last submitted
        (``wire.baseline_digest``, kept in the checkpoint's ``guard`` entry) and ``rotated`` is False, the file was
        replaced by hand (``scripts/rotate_baseline.py``): ``baseline_version`` is bumped, as a rotation does.
        A missing or unusable file, or a server that refuses it, is logged and skipped: clients then play against
        their own file, as Mortal's do."""
        from mortal.config import lookup
        baseline = lookup(self.config, 'baseline.train.state_file')
        if not baseline:
            return
        try:
            mortal, dqn, arch = read_baseline(baseline)
        except (OSError, CheckpointError) as ex:
            logger.warning('baseline not submitted to the server (clients need their own file): %s', ex)
            return
        digest = wire.baseline_digest(mortal, dqn)
        if digest != self.guard['baseline_digest']:
            if self.guard['baseline_digest'] and not rotated:
                self.guard['baseline_version'] += 1
                logger.info('%s has changed since it was last submitted (rotated by hand?): baseline version %d',
                            baseline, self.guard['baseline_version'])
            self.guard['baseline_digest'] = digest
            if not rotated and path.exists(self.state_file):
                self.save()  # the version survives a crash before the next save
        msg = {'type': 'submit_baseline', 'mortal': wire.pack_state_dict(mortal), 'dqn': wire.pack_state_dict(dqn),
               'arch': arch, 'baseline_version': self.guard['baseline_version'], 'baseline_digest': digest}
        try:
            wire.request_with_retry(self.remote, msg, sleep=self.sleep)
        except wire.RequestRefused as ex:  # e.g. an older server: clients keep their own files
            logger.warning('baseline not submitted to the server: %s', ex)
            return
        logger.info('baseline has been submitted (version %d, digest %s)', self.guard['baseline_version'],
                    digest[:12])

    def play_settings(self) -> dict:
        """What travels with the parameters to the clients (``mortal.schedule``, ``mortal.gate``): ``steps``,
        ``epsilon_factor`` ([schedule.epsilon] x the rollbacks' ``[guard] epsilon_factor``), ``temp_factor``
        ([schedule.temp]) and ``baseline_version`` (bumped by each rotation)."""
        from mortal.schedule import schedule_factor
        return {
            'steps': self.steps,
            'epsilon_factor': schedule_factor(self.schedules['epsilon'], self.steps) * self.guard['epsilon_scale'],
            # never 0: a temperature of 0 cannot sample (the server refuses it)
            'temp_factor': max(schedule_factor(self.schedules['temp'], self.steps), wire.MIN_TEMP_FACTOR),
            'baseline_version': self.guard['baseline_version'],
        }

    def claims(self, claim_dir: str):
        """The ``mortal.claims.ClaimLedger`` of ``claim_dir``, opened (from its manifest) on first use."""
        from mortal.claims import ClaimLedger
        claim_dir = path.abspath(claim_dir)
        if self.ledger is not None and self.ledger.claim_dir == claim_dir:
            return self.ledger
        if self.ledger is not None:
            logger.warning('the server drains to another folder now: claims move from %s to %s; the %d logs left '
                           'in the old one are not trained', self.ledger.claim_dir, claim_dir,
                           len(self.ledger.pending()))
        ds = self.config['dataset']
        signature = {'version': self.version, 'player_names': ['trainee'], 'num_epochs': ds['num_epochs'],
                     'enable_augmentation': ds['enable_augmentation'], 'augmented_first': ds['augmented_first']}
        passes = ds['num_epochs'] * (2 if ds['enable_augmentation'] else 1)
        self.ledger = ClaimLedger.open(claim_dir, signature=signature, passes=passes)
        if self.ledger.lost_samples:  # reported now: this learner may end (test play) before its epoch does
            self.writer.add_scalar('data/samples_dropped', self.ledger.lost_samples, self.steps)
            self.ledger.lost_samples = 0
        return self.ledger

    def drain(self) -> list:
        """Wait for replays (polling every 5 s), claim them (``claim_drained``, tracked by the ledger ``claims``)
        and return the claimed file paths; logs data-health tags. Logs claimed earlier and not yet fully trained
        stay in the claim folder.

        A poll that finds the server without parameters (it restarted) makes the learner resubmit its current ones
        as idle, once per server instance (``server_id``). Logs that vanished before they were claimed (a server
        restart right after the drain) are counted in ``lost_logs`` and logged once per drain.
        """
        start = time.monotonic()
        while True:
            reply = wire.request_with_retry(self.remote, {'type': 'drain'}, sleep=self.sleep)
            server_id = reply.get('server_id')
            if not reply.get('has_param', True) and server_id not in self.resubmitted_to:
                logger.info('server holds no parameters (restarted?): resubmitting')
                self.sync_baseline()
                self.submit_param(is_idle=True)
                self.resubmitted_to.add(server_id)
            if reply['count'] > 0:
                ledger = self.claims(claim_dir_for(reply['drain_dir']))
                targets = []

                def on_claim(names):
                    targets.extend(names)
                    ledger.add(names)

                files, vanished = claim_drained(reply['drain_dir'], reply['files'], ledger.claim_dir,
                                                keep=ledger.names() | ledger.reserved_names(), on_claim=on_claim)
                claimed = set(files)
                ledger.forget([n for n in targets if path.join(ledger.claim_dir, n) not in claimed])
                if vanished:
                    self.lost_logs += len(vanished)
                    logger.warning('%d of %d drained logs vanished from %s before the learner could read them '
                                   '(server restarted?): lost, %d in total', len(vanished), reply['count'],
                                   reply['drain_dir'], self.lost_logs)
                if files:
                    break
            self.sleep(DRAIN_POLL_INTERVAL)
        waited = time.monotonic() - start
        lost = set(vanished)
        versions = [v for name, v in zip(reply['files'], reply.get('param_versions', [])) if name not in lost]
        behind = staleness({**reply, 'param_versions': versions})
        self.writer.add_scalar('data/logs_per_drain', len(files), self.steps)
        self.writer.add_scalar('data/wait_seconds', waited, self.steps)
        if behind:
            self.writer.add_scalar('data/staleness_mean', sum(behind) / len(behind), self.steps)
            self.writer.add_scalar('data/staleness_max', max(behind), self.steps)
        logger.info('drained %d logs after %.1f s; staleness %s', len(files), waited,
                    f'mean {sum(behind) / len(behind):.2f}, max {max(behind)}' if behind else 'unknown')
        return files

    # -- reference models and instruments ------------------------------------------------------------------

    def _baseline_file(self) -> str:
        return self.config['baseline']['train']['state_file']

    def _load_anchor(self):
        """The frozen (brain, dqn) of ``[baseline.train] state_file`` that ``anchor_term`` pulls towards.
        Raises FileNotFoundError, CheckpointError (also for a baseline of another feature version)."""
        brain, dqn, version = load_model_pair(self._baseline_file())
        if version != self.version:
            raise CheckpointError(self._baseline_file(), f'the anchor is version {version}, '
                                                         f'[control] version is {self.version}')
        for m in (brain, dqn):
            m.to(self.device).requires_grad_(False)
        logger.info('anchor: %s, weight %g', self._baseline_file(), self.anchor_weight)
        return brain, dqn

    def _load_probe(self):
        """The policy-drift probe (``[online] probe_file``, built from ``[dataset] globs`` once), with the
        baseline's greedy actions; None when it cannot be built (logged, never fatal)."""
        from mortal.reward import load_grp
        online = self.config.get('online', {})
        probe_file = online.get('probe_file') or path.join(path.dirname(path.abspath(self.state_file)),
                                                            'probe.pth')
        size = online.get('probe_size', 2048)
        if size <= 0:
            return None
        try:
            grp_cfg = self.config['grp']
            probe = Probe.load_or_build(probe_file, version=self.version, globs=self.config['dataset']['globs'],
                                        pts=self.config['env']['pts'], size=size,
                                        grp=lambda: load_grp(grp_cfg['state_file'], grp_cfg['network']))
            if probe is None:
                return None
            if self.anchor is not None:
                brain, dqn = self.anchor
            else:
                brain, dqn, _ = load_model_pair(self._baseline_file())
                brain.to(self.device)
                dqn.to(self.device)
            probe.set_baseline(brain, dqn, self.device)
            return probe
        except Exception as ex:  # an instrument must never stop training
            logger.warning('policy-drift probe disabled: %s: %s', type(ex).__name__, ex)
            return None

    def write_diagnostics(self) -> None:
        """The ``diag/*`` TensorBoard tags of this save window (``mortal/diagnostics.py``)."""
        self.last_diag = dict(self.diag.means())
        for key, value in self.last_diag.items():
            self.writer.add_scalar(f'diag/{key}', value, self.steps)
        self.diag.reset()
        if self.probe is not None:
            if self.ema is None:  # the played model is the trained one: one pass over the probe gives both
                drift, loss = self.probe.measure(self.mortal, self.dqn, self.aux_net, self.device)
            else:  # drift of the published EMA; the next-rank head belongs to the trained weights
                drift = self.probe.drift(*self.ema, self.device)
                loss = self.probe.next_rank_loss(self.mortal, self.aux_net, self.device)
            self.last_diag['policy_drift'] = drift
            self.writer.add_scalar('diag/policy_drift', drift, self.steps)
            self.writer.add_scalar('diag/next_rank_loss_probe', loss, self.steps)

    # -- learning --------------------------------------------------------------------------------------------

    def reset_stats(self) -> None:
        """Zero the loss sums averaged into TensorBoard at each save."""
        self.stats = {'dqn_loss': 0.0, 'cql_loss': 0.0, 'anchor_loss': 0.0, 'offline_cql_loss': 0.0,
                      'next_rank_loss': 0.0}

    def train_batch(self, obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks) -> None:
        """One backward pass on a batch; optimizer step every ``opt_step_every`` global steps; submit/save/test.

        obs (B, C, 34) float32, actions (B,) int64, masks (B, 46) bool, steps_to_done (B,) int64,
        kyoku_rewards (B,) float64, player_ranks (B,) int64 in 0..3, B = batch_size.
        With ``[online] offline_batch_size`` = O > 0, O offline rows from ``offline_batches`` are appended; they
        share the MSE and next-rank terms and carry the offline CQL term (``[cql] min_q_weight``), while the
        online extras (anchor, online CQL) and the instruments stay on the B online rows.
        Raises ValueError when an action is masked out; TestPlayDone (online) after a test play.
        """
        dev = self.device
        n = obs.shape[0]  # online (or, offline, all) rows
        if self.offline_stream is not None:
            extra = next(self.offline_stream)
            obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks = (
                torch.cat((a, b.to(a.dtype))) for a, b in zip(
                    (obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks), extra))
        obs = obs.to(dtype=torch.float32, device=dev)
        actions = actions.to(dtype=torch.int64, device=dev)
        masks = masks.to(dtype=torch.bool, device=dev)
        steps_to_done = steps_to_done.to(dtype=torch.int64, device=dev)
        kyoku_rewards = kyoku_rewards.to(dtype=torch.float64, device=dev)
        player_ranks = player_ranks.to(dtype=torch.int64, device=dev)
        rows = torch.arange(obs.shape[0], device=dev)
        if not masks[rows, actions].all():
            raise ValueError('a training sample has an action outside its legal mask')

        q_target = (self.gamma ** steps_to_done * kyoku_rewards).to(torch.float32)
        mixed = obs.shape[0] > n
        with torch.autocast(dev.type, enabled=self.enable_amp):
            phi = self.mortal(obs)
            q_out = self.dqn(phi, masks)
            q = q_out[rows, actions]
            dqn_loss = 0.5 * self.mse(q.float(), q_target)
            cql_weight = self.online_min_q_weight if self.online else self.min_q_weight
            cql_loss = 0
            if not self.online or cql_weight > 0:
                cql_loss = cql_term(q_out[:n], actions[:n], q_target[:n], calibrated=self.calibrated_cql)
            offline_cql_loss = 0
            if mixed:
                offline_cql_loss = cql_term(q_out[n:], actions[n:], q_target[n:], calibrated=self.calibrated_cql)
            anchor_loss = 0
            if self.anchor is not None:
                with torch.no_grad():
                    q_ref = self.anchor[1](self.anchor[0](obs[:n]), masks[:n])
                anchor_loss = anchor_term(q_out[:n], q_ref, masks[:n], actions[:n])
            next_rank_logits, = self.aux_net(phi)
            next_rank_loss = self.ce(next_rank_logits.float(), player_ranks)
            loss = (dqn_loss + cql_loss * cql_weight + anchor_loss * self.anchor_weight
                    + offline_cql_loss * self.min_q_weight + next_rank_loss * self.next_rank_weight)
        self.scaler.scale(loss / self.opt_step_every).backward()

        with torch.no_grad():
            self.stats['dqn_loss'] += dqn_loss.item()
            if not self.online or cql_weight > 0:
                self.stats['cql_loss'] += cql_loss.item()
            if self.anchor is not None:
                self.stats['anchor_loss'] += anchor_loss.item()
            if mixed:
                self.stats['offline_cql_loss'] += offline_cql_loss.item()
            self.stats['next_rank_loss'] += next_rank_loss.item()
            self.diag.add(batch_q_stats(q_out[:n], masks[:n], actions[:n], q_target[:n]))
            slot = self.idx % self.save_every
            self.all_q[slot, :n] = q[:n].float()
            self.all_q_target[slot, :n] = q_target[:n]

        self.steps += 1
        self.idx += 1
        if self.steps % self.opt_step_every == 0:
            self.optimizer_step()
        self.scheduler.step()
        if self.pb is not None:
            self.pb.update(1)

        if self.online and self.steps % self.submit_every == 0:
            self.submit_param(is_idle=False)
        if self.steps % self.save_every == 0:
            self.on_save()

    def optimizer_step(self) -> None:
        """Unscale, clip to ``max_grad_norm`` (when > 0), step, update the scaler, clear the gradients."""
        if self.max_grad_norm > 0:
            self.scaler.unscale_(self.optimizer)
            params = chain.from_iterable(g['params'] for g in self.optimizer.param_groups)
            nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.update_ema()

    def on_save(self) -> None:
        """Every ``save_every`` steps: TensorBoard, checkpoint, a missed submit, and test play when due."""
        if self.pb is not None:
            self.pb.close()
            self.pb = None
        n = self.save_every
        w = self.writer
        w.add_scalar('loss/dqn_loss', self.stats['dqn_loss'] / n, self.steps)
        if not self.online or self.online_min_q_weight > 0:
            w.add_scalar('loss/cql_loss', self.stats['cql_loss'] / n, self.steps)
        if self.anchor is not None:
            w.add_scalar('loss/anchor_loss', self.stats['anchor_loss'] / n, self.steps)
        if self.offline_stream is not None:
            w.add_scalar('loss/offline_cql_loss', self.stats['offline_cql_loss'] / n, self.steps)
        w.add_scalar('loss/next_rank_loss', self.stats['next_rank_loss'] / n, self.steps)
        w.add_scalar('hparam/lr', self.scheduler.get_last_lr()[0], self.steps)
        if self.online:
            settings = self.play_settings()
            w.add_scalar('hparam/epsilon_factor', settings['epsilon_factor'], self.steps)
            w.add_scalar('hparam/temp_factor', settings['temp_factor'], self.steps)
        w.add_histogram('q_predicted', self.all_q.cpu().numpy().flatten()[::HISTOGRAM_STRIDE], self.steps)
        w.add_histogram('q_target', self.all_q_target.cpu().numpy().flatten()[::HISTOGRAM_STRIDE], self.steps)
        self.write_diagnostics()
        w.flush()
        self.reset_stats()
        self.idx = 0
        self.log_total_steps()

        self.save()
        if self.online and self.steps % self.submit_every != 0:
            self.submit_param(is_idle=False)
        if self.steps % self.test_every == 0:
            self.test_play()
        self.pb = self._progress_bar()

    def steps_to_next_test(self):
        """Steps left until the next test play (0 right at one), as Mortal's progress line; None when this
        trainer never test-plays (its test player has ``enabled = False``, as the offline bootstrap's without
        ``[bootstrap] offline_test_every``)."""
        if not getattr(self.test_player, 'enabled', True):
            return None
        return (self.test_every - self.steps % self.test_every) % self.test_every

    def log_total_steps(self) -> None:
        """Mortal's ``total steps: N (~steps to the next test play)`` line; without the countdown when there is
        no test play."""
        to_test = self.steps_to_next_test()
        if to_test is None:
            logger.info('total steps: %s', f'{self.steps:,}')
        else:
            logger.info('total steps: %s (~%s)', f'{self.steps:,}', f'{to_test:,}')

    def test_play(self) -> None:
        """Play ``[test_play] games`` against ``[baseline.test]``, log, judge and maybe replace best.pth, then the
        guards (rollback, rotation); online: TestPlayDone.

        With a test player that gives per-deal results (``play_units``: ``mortal.player.TestPlayer``, online and
        offline), the challenger is paired deal by deal with best.pth's record and judged by ``[test_play]
        best_rule`` (``mortal.gate``); one with ``test_play`` only (the bootstrap's test play against
        RulebaseBots, tests' fakes) is judged by Mortal's rule and drives no guard."""
        from mortal import gate
        verdict = None
        # Nothing to compare with yet (no best.pth, a fresh best_perf): the first test play makes best.pth, as
        # Mortal's does.
        first = (not path.exists(self.best_state_file) and not self.best_perf.get('deals')
                 and self.best_perf.get('avg_rank', 4.0) >= INITIAL_BEST_PERF['avg_rank'])
        if hasattr(self.test_player, 'play_units'):
            self.test_player.begin()
            mortal, dqn = self.played()
            rule = 'paired' if first and self.best_rule == 'sprt' else self.best_rule  # a full record
            reference = gate.reference_of(self.best_perf)
            if self.fresh_deals and path.exists(self.best_state_file):
                reference = self._best_replay()
            verdict = gate.run_test_play(
                lambda first, count: self.test_player.play_units(first, count, mortal, dqn, self.device),
                nonce_start=self._test_nonce(), deals=self.test_games // 4,
                reference=reference, rule=rule, confidence=self.confidence,
                sprt=self.sprt, chunk_deals=self.sprt_chunk_deals,
                mortal_better=lambda units: is_better(*reversed(units_summary(units)), self.best_perf))
            stat = self.test_player.stat()
        else:
            stat = self.test_player.test_play(self.test_games // 4, *self.played(), self.device)
        self.mortal.train()
        self.dqn.train()
        avg_pt = stat.avg_pt(DISPLAY_PTS)
        avg_rank = stat.avg_rank
        better = verdict.better if verdict is not None else is_better(avg_pt, avg_rank, self.best_perf)
        if first and not better:
            better = True  # nothing to compare with: logged below
        past_best = dict(self.best_perf)
        if better:
            self.best_perf = {'avg_pt': avg_pt, 'avg_rank': avg_rank}
            if verdict is not None:
                self.best_perf['deals'] = {int(n): [int(r) for r in rs] for n, rs in verdict.units.items()}
        logger.info('avg rank: %.6f', avg_rank)
        logger.info('avg pt: %.6f', avg_pt)
        stat.write_tensorboard(self.writer, self.steps, DISPLAY_PTS)
        if verdict is not None:
            logger.info('test play: %s%s', verdict.describe(),
                        ' (no best.pth yet: this first test play makes it)' if first else '')
            self.writer.add_scalar('test_play/paired_diff', verdict.diff, self.steps)
            if not math.isnan(verdict.ci):
                self.writer.add_scalar('test_play/paired_diff_ci', verdict.ci, self.steps)
            self.writer.add_scalar('test_play/games', verdict.games, self.steps)
            if verdict.llr is not None:
                self.writer.add_scalar('test_play/sprt_llr', verdict.llr, self.steps)
        self.writer.flush()
        if better:
            self.save()  # the checkpoint now records the new best_perf
            logger.info('a new record has been made, pt: %.4f -> %.4f, rank: %.4f -> %.4f, saving to %s',
                        past_best['avg_pt'], avg_pt, past_best['avg_rank'], avg_rank, self.best_state_file)
            if self.ema is None:
                atomic_copy(self.state_file, self.best_state_file)
            else:  # best.pth holds the weights that were test-played
                atomic_torch_save(played_checkpoint(self.checkpoint()), self.best_state_file)
        if verdict is not None and self.fresh_deals:
            self.guard['test_plays'] += 1
            self.save()  # the next test play meets the next deals, also after this learner's restart
        if self.online and verdict is not None:
            self.run_guards(verdict, became_best=better)
        if self.online:
            raise TestPlayDone()

    def _test_nonce(self) -> int:
        """First nonce of this test play: Mortal's fixed one, or with ``[test_play] fresh_deals`` the next unused
        block (``guard['test_plays']`` test plays of ``games / 4`` deals each since the start)."""
        from mortal.player import TEST_SEED
        if not self.fresh_deals:
            return TEST_SEED[0]
        return TEST_SEED[0] + self.guard['test_plays'] * (self.test_games // 4)

    def _best_replay(self):
        """``(first_nonce, count) -> units`` of best.pth on the same deals as the challenger (logs beside the test
        play's, under ``<log_dir>_best``)."""
        brain, dqn, _ = load_model_pair(self.best_state_file)
        brain.to(self.device)
        dqn.to(self.device)
        log_dir = path.normpath(self.test_player.log_dir) + '_best'
        empty_dir(log_dir)
        return lambda first, count: self.test_player.play_units(first, count, brain, dqn, self.device,
                                                                 log_dir=log_dir, name='best')

    # -- long-run guards (docs/operations.md) ----------------------------------------------------------------

    def run_guards(self, verdict, *, became_best: bool = False) -> None:
        """After an online test play: the degradation alarm (``[guard]``) and the baseline rotation
        (``[rotation]``); ``became_best``: this test play has just made best.pth. Saves the checkpoint when their
        state changed."""
        from mortal import gate
        before = dict(self.guard)
        g = self.guard_cfg
        self.guard['worse_streak'] = self.guard['worse_streak'] + 1 if verdict.worse else 0
        reasons = []
        if g['rollback_after'] and self.guard['worse_streak'] >= g['rollback_after']:
            reasons.append(f"{self.guard['worse_streak']} test plays in a row significantly worse than best.pth "
                           f'(last: {verdict.describe()})')
        drift, q_gap = self.last_diag.get('policy_drift'), self.last_diag.get('q_gap')
        if became_best:  # the model just became best.pth: rolling back would restore itself
            drift = q_gap = None
        if g['max_policy_drift'] and drift is not None and drift > g['max_policy_drift']:
            reasons.append(f"diag/policy_drift {drift:.3f} above [guard] max_policy_drift {g['max_policy_drift']}")
        if g['min_q_gap'] and q_gap is not None and q_gap < g['min_q_gap']:
            reasons.append(f"diag/q_gap {q_gap:.3f} below [guard] min_q_gap {g['min_q_gap']}")
        if reasons:
            self.rollback('; '.join(reasons))
        r = self.rotation_cfg
        if r['after']:
            means = list(gate.unit_means(verdict.units).values())
            mean, ci = gate.mean_and_ci(means, self.confidence)
            beats = not math.isnan(ci) and mean <= r['max_rank'] and mean + ci < gate.BASELINE_RANK
            self.guard['rotate_streak'] = self.guard['rotate_streak'] + 1 if beats else 0
            if self.guard['rotate_streak'] >= r['after']:
                self.rotate_baseline(f"{self.guard['rotate_streak']} test plays in a row beat the baseline "
                                     f"(last: avg rank {mean:.3f} ± {ci:.3f}, at most {r['max_rank']})")
        self.writer.add_scalar('guard/worse_streak', self.guard['worse_streak'], self.steps)
        if self.guard != before:
            self.save()

    def rollback(self, reason: str) -> bool:
        """Restore the weights and optimizer state of best.pth into this learner and ``state_file`` (steps,
        schedule position and ``best_perf`` go on). The replaced ``state_file`` is kept as
        ``<state_file>.<YYYYmmdd-HHMMSS>.rollback`` (the newest ``[guard] keep`` of them); the learning rate and
        the clients' ε are multiplied by ``[guard] lr_factor`` / ``epsilon_factor``. Returns False (logged) when
        best.pth is missing or does not fit."""
        try:
            best = load_checkpoint(self.best_state_file, map_location=self.device)
            for model, entry in ((self.mortal, 'mortal'), (self.dqn, 'current_dqn'), (self.aux_net, 'aux_net')):
                check_fits_config(model, best[entry], entry=entry, source=self.best_state_file,
                                  ckpt_cfg=best.get('config'), config=self.config)
        except Exception as ex:  # missing, corrupt or foreign: the guard must never stop training
            logger.error('ROLLBACK not possible (%s): %s: %s', reason, type(ex).__name__, ex)
            return False
        kept = self._keep_for_rollback()
        for model, entry in ((self.mortal, 'mortal'), (self.dqn, 'current_dqn'), (self.aux_net, 'aux_net')):
            model.load_state_dict(best[entry])
        try:
            if not best.get('optimizer'):
                raise ValueError('it has none')
            self.optimizer.load_state_dict(best['optimizer'])
        except Exception as ex:  # another optimizer layout: the weights still roll back, with fresh moments
            logger.warning('optimizer state of %s not restored (%s): starting it fresh', self.best_state_file, ex)
            self.optimizer.state.clear()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            for ema, model in zip(self.ema, (self.mortal, self.dqn)):
                ema.load_state_dict(model.state_dict())
        g = self.guard_cfg
        self.guard.update(rollbacks=self.guard['rollbacks'] + 1, worse_streak=0,
                          lr_scale=self.guard['lr_scale'] * g['lr_factor'],
                          epsilon_scale=self.guard['epsilon_scale'] * g['epsilon_factor'])
        self.scheduler.refresh()
        self.save()
        line = (f"ROLLBACK #{self.guard['rollbacks']} at step {self.steps}: {reason}; {self.state_file} restored "
                f"from {self.best_state_file} (its step {best.get('steps', '?')}), the replaced one kept as {kept}; "
                f"lr x{self.guard['lr_scale']:g}, epsilon x{self.guard['epsilon_scale']:g}")
        self._guard_event('guard/rollbacks', self.guard['rollbacks'], line)
        return True

    def _guard_event(self, tag: str, count: int, line: str) -> None:
        """One warning line, the count under ``tag`` and the line as a ``guard/events`` text in TensorBoard."""
        logger.warning('%s', line)
        self.writer.add_scalar(tag, count, self.steps)
        self.writer.add_text('guard/events', line, self.steps)

    def _keep_for_rollback(self) -> str:
        """Copy ``state_file`` to a new timestamped ``.rollback`` name; remove the oldest beyond ``[guard] keep``."""
        kept = stamped_name(self.state_file, datetime.now().strftime('%Y%m%d-%H%M%S'), '.rollback')
        atomic_copy(self.state_file, kept)
        old = sorted(glob(f'{glob_escape(self.state_file)}.*.rollback'), key=path.getmtime)
        for name in old[:-self.guard_cfg['keep']]:
            os.remove(name)
        return kept

    def rotate_baseline(self, reason: str) -> bool:
        """Promote best.pth to ``[baseline.train]``/``[baseline.test]`` (``mortal.rotation.rotate``: the old
        baselines kept as ``.bak``), reset ``best_perf``, bump ``baseline_version`` (clients reload their baseline
        when it changes). Returns False (logged) when best.pth cannot be promoted."""
        import filecmp
        from mortal.config import lookup
        from mortal.rotation import rotate
        baseline = lookup(self.config, 'baseline.train.state_file')
        try:
            if baseline is None:
                raise ValueError('[baseline.train] state_file is not set')
            if path.exists(baseline) and filecmp.cmp(self.best_state_file, baseline, shallow=False):
                logger.info('rotation skipped (%s): best.pth is the baseline already', reason)
                self.guard['rotate_streak'] = 0
                return False
            done = rotate(self.config, self.best_state_file)
        except (ValueError, OSError) as ex:
            logger.error('ROTATION not possible (%s): %s', reason, ex)
            return False
        self.best_perf = dict(INITIAL_BEST_PERF)
        self.guard.update(baseline_version=self.guard['baseline_version'] + 1, rotate_streak=0, worse_streak=0,
                          rotations=self.guard['rotations'] + 1)
        self.sync_baseline(rotated=True)
        self.save()
        line = (f"ROTATION #{self.guard['rotations']} at step {self.steps}: {reason}; {self.best_state_file} "
                f"promoted to {', '.join(t for t, _ in done)} (baseline version {self.guard['baseline_version']}, "
                f"previous kept as {', '.join(b for _, b in done if b) or 'nothing'}); best_perf reset")
        self._guard_event('guard/rotations', self.guard['rotations'], line)
        return True

    def _progress_bar(self):
        from tqdm.auto import tqdm
        return tqdm(total=self.save_every, desc='TRAIN', initial=self.steps % self.save_every, unit='batch',
                    dynamic_ncols=True, ascii=True)

    def file_list(self):
        """(file_list, player_names) of this epoch: claimed logs + ['trainee'] online, the dataset offline.

        Online, the first epoch of a learner finishes the claimed logs a previous one left (``mortal.claims``;
        the claim folder is found from ``[online.server] drain_dir``) without draining; later epochs drain and
        train the new logs together with what earlier epochs left over.
        """
        if self.online:
            from mortal.config import lookup
            self.epoch_drained = False
            drain_dir = lookup(self.config, 'online.server.drain_dir')
            if not self.resumed:
                self.resumed = True
                if drain_dir:
                    ledger = self.claims(claim_dir_for(drain_dir))
                    pending = ledger.pending()
                    if pending:
                        logger.info('resuming %d claimed logs not yet read (%d of them partly trained) before '
                                    'draining again', len(pending), ledger.partly_trained())
                        return pending, ['trainee']
            self.drain()
            self.epoch_drained = True
            return self.ledger.pending(), ['trainee']
        dataset_cfg = self.config['dataset']
        names = load_player_names(dataset_cfg['player_names_files'])
        logger.info('loaded %s players', f'{len(names):,}')
        return build_file_list(dataset_cfg, names), sorted(names)

    def _checked_offline_stream(self):
        """``offline_batches`` with its first batch already loaded, so that a dataset without one full batch fails
        at start-up, before the first drain, rather than at the first training step."""
        stream = self.offline_batches()
        first = next(stream)
        return chain([first], stream)

    def offline_batches(self):
        """Endless full batches of ``[online] offline_batch_size`` samples from the offline logs of ``[dataset]``
        (the seats of ``player_names_files``, all seats when none), reshuffled every pass, loaded in this process.

        Yields the six tensors of ``train_batch``. Raises ValueError when one pass holds no full batch."""
        ds = self.config['dataset']
        names = load_player_names(ds['player_names_files'])
        files = build_file_list(ds, names)
        logger.info('offline mix: %d samples per batch from %s offline logs', self.offline_batch_size,
                    f'{len(files):,}')
        passes = 0
        while True:
            random.shuffle(files)
            loader = self.data_loader(list(files), sorted(names), batch_size=self.offline_batch_size,
                                      num_workers=0)
            count = 0
            for batch in iter_full_batches(iter(loader), self.offline_batch_size):
                count += 1
                yield batch
            if count == 0:
                source = (f"[dataset] file_index {ds['file_index']} ({len(files)} files)"
                          if path.exists(ds['file_index']) else f"[dataset] globs {ds['globs']}")
                raise ValueError(f'[online] offline_batch_size = {self.offline_batch_size}: the logs of {source} '
                                 f'hold no full batch (readable logs and their samples are listed above)')
            passes += 1
            logger.info('offline mix: pass %d over the offline logs done (%d batches)', passes, count)

    def data_loader(self, file_list, player_names, ledger=None, *, batch_size=None, num_workers=None):
        """DataLoader of ``FileDatasetsIter`` batches (``[dataset]`` settings, GRP reward from ``[grp]``).

        With a ``mortal.claims.ClaimLedger``, each batch ends with the ``(B, 4)`` sample ids and the samples
        it lists as trained are left out. ``batch_size``/``num_workers`` default to ``[control] batch_size`` and
        ``[dataset] num_workers``."""
        from mortal.dataloader import FileDatasetsIter, make_dataloader
        from mortal.mjai_log import DEFAULT_MAX_LOG_BYTES
        from mortal.reward import load_grp

        ds = self.config['dataset']
        num_workers = ds['num_workers'] if num_workers is None else num_workers
        if num_workers > 1:
            random.shuffle(file_list)
        grp = load_grp(self.config['grp']['state_file'], self.config['grp']['network'])
        data = FileDatasetsIter(
            self.version, file_list, self.config['env']['pts'], grp,
            file_batch_size=ds['file_batch_size'],
            reserve_ratio=ds['reserve_ratio'],
            player_names=player_names or None,
            num_epochs=ds['num_epochs'],
            enable_augmentation=ds['enable_augmentation'],
            augmented_first=ds['augmented_first'],
            max_log_bytes=ds.get('max_log_bytes', DEFAULT_MAX_LOG_BYTES),
            sample_ids=ledger is not None,
            trained=ledger.trained_map() if ledger is not None else None,
        )
        return make_dataloader(data, batch_size=batch_size or self.batch_size, num_workers=num_workers,
                               pin_memory=self.device.type == 'cuda')

    def train_epoch(self) -> int:
        """One pass over this epoch's files; returns the number of batches trained.

        Online, the ledger (``mortal.claims``) records every trained batch and is committed at each checkpoint
        and at the test play that ends the learner; samples the epoch leaves over stay claimed for the next.
        ``data/samples_dropped`` counts the claimed samples lost nonetheless (0 in a healthy run)."""
        file_list, player_names = self.file_list()
        ledger = self.ledger if self.online else None
        logger.info('file list size: %s', f'{len(file_list):,}')
        self.log_total_steps()
        self.pb = self._progress_bar()
        batches = 0
        loader = self.data_loader(file_list, player_names, ledger=ledger)
        on_drop = None
        if ledger is not None:
            ledger.begin_epoch(loader.dataset.files)
            on_drop = lambda rest: ledger.note_dropped(rest[-1])  # noqa: E731 - the ids are the last tensor
        loader_iter = iter(loader)
        try:
            for batch in iter_full_batches(loader_iter, self.batch_size, on_drop=on_drop):
                if ledger is None:
                    self.train_batch(*batch)
                else:
                    self._train_tracked(batch, ledger)
                batches += 1
        finally:
            # No loader worker may still read this epoch's files when the next drain replaces them.
            shutdown = getattr(loader_iter, '_shutdown_workers', None)
            if shutdown is not None:
                shutdown()
            del loader_iter
            if self.pb is not None:
                self.pb.close()
                self.pb = None
        if self.online:
            dropped = ledger.end_epoch()
            if dropped:
                logger.warning('%d samples of claimed logs were lost before they could be trained', dropped)
            if self.epoch_drained:
                self.writer.add_scalar('data/samples_per_drain', batches * self.batch_size, self.steps)
            self.writer.add_scalar('data/samples_dropped', dropped, self.steps)
            self.submit_param(is_idle=True)
        return batches

    def _train_tracked(self, batch, ledger) -> None:
        """``train_batch`` on a batch whose last tensor holds the sample ids; record them in ``ledger`` and commit
        it right after each checkpoint (the save inside ``train_batch``), so that the claim manifest always
        matches the last checkpoint. The test play that ends an online learner follows a save: committed too."""
        *data, ids = batch
        try:
            self.train_batch(*data)
        except TestPlayDone:
            ledger.record(ids)
            ledger.commit()
            raise
        ledger.record(ids)
        if self.steps % self.save_every == 0:
            ledger.commit()

    def run(self) -> None:
        """Online: submit idle parameters, then epochs until a test play ends the process. Offline: one epoch."""
        dev = self.device
        logger.info('device: %s%s', dev, f' ({torch.cuda.get_device_name(dev)})' if dev.type == 'cuda' else '')
        if self.online:
            self.sync_baseline()
            self.submit_param(is_idle=True)
        while True:
            self.train_epoch()
            gc.collect()
            if not self.online:
                break  # one epoch per offline run, for easier control (Mortal)


def run_learner(config: dict) -> int:
    """The learner process body; returns its exit status (0 after an online test play)."""
    trainer = Trainer(config)
    try:
        trainer.run()
    except TestPlayDone:
        logger.info('test play done: exiting so that the supervisor restarts the learner')
    finally:
        trainer.writer.close()
    return 0


def reap_process_group(pgid: int, grace: float = GROUP_GRACE) -> bool:
    """After the leader of process group ``pgid`` (the learner) has exited and been waited for: give the rest of
    the group (DataLoader fork server and workers, multiprocessing's resource tracker) ``grace`` seconds to exit
    by themselves (they die with the learner, see ``mortal.lifetime``; the tracker then cleans up), then SIGKILL
    whatever is left. Reaps members that are this process's children. Returns True when something was killed;
    False also where process groups do not exist (not POSIX)."""
    if not hasattr(os, 'killpg'):
        return False

    def alive() -> bool:
        try:
            while os.waitpid(-pgid, os.WNOHANG)[0] > 0:  # members re-parented to us (we may be PID 1)
                pass
        except ChildProcessError:
            pass
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    deadline = time.monotonic() + grace
    while alive():
        if time.monotonic() >= deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                return False
            logger.warning('processes of the learner were still running %.0f s after it ended: killed them '
                           '(process group %d)', grace, pgid)
            for _ in range(20):
                if not alive():
                    break
                time.sleep(0.05)
            return True
        time.sleep(0.05)
    return False


def supervise(argv, *, restart_delay: float = RESTART_DELAY, script: str = None) -> int:
    """Run ``python mortal/train.py argv`` (or ``script``) as a child with MORTAL_IS_SUB_PROC=1; restart it
    ``restart_delay`` seconds after each exit with 0; return its status otherwise (128 + signal number when
    killed). SIGTERM and Ctrl-C (SIGINT) to the supervisor are passed on to the child.

    The child runs in its own session and process group; whenever it has ended, however it ended, what is left
    of its group is killed (``reap_process_group``), so no process of a learner outlives it."""
    cmd = [sys.executable, script or path.abspath(__file__), *argv]
    env = {**os.environ, IS_SUB_PROC_KEY: '1', SUPERVISOR_PID_KEY: str(os.getpid())}
    child = None
    stopping = False

    def forward(signum, frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            # A session of its own: the whole learner (with its loader processes) is one process group to reap.
            child = subprocess.Popen(cmd, env=env, start_new_session=True)
            logger.info('learner started (pid %d)', child.pid)
            while True:
                try:
                    code = child.wait()
                    break
                except KeyboardInterrupt:  # the terminal's Ctrl-C does not reach the child's session: pass it on
                    stopping = True
                    if child.poll() is None:
                        child.send_signal(signal.SIGINT)
            reap_process_group(child.pid)
            if code != 0 or stopping:
                if code < 0:
                    code = 128 - code
                if stopping:
                    logger.info('learner stopped on request (status %d)', code)
                else:
                    logger.info('learner exited with status %d: stopping', code)
                return code
            logger.info('learner exited normally; restarting in %.0f s', restart_delay)
            try:
                time.sleep(restart_delay)
            except KeyboardInterrupt:
                stopping = True
            if stopping:  # a SIGTERM/SIGINT in the pause had no child to reach: honour it here
                logger.info('stop requested between learners: not restarting')
                return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv=None):
    """Entry point: ``python mortal/train.py`` (config from MORTAL_CFG or ``--config``)."""
    from mortal import entry
    from mortal.config import ONLINE_TRAIN_SECTIONS, TRAIN_SECTIONS, ConfigError, require
    argv = list(sys.argv[1:] if argv is None else argv)
    args = entry.start(entry.parser(__doc__.splitlines()[0]), argv)
    config = entry.load_config_or_exit(args, TRAIN_SECTIONS)
    online = config['control']['online']
    if online:
        try:
            require(config, *ONLINE_TRAIN_SECTIONS, path=args.config, env=args.overrides)
        except ConfigError as exc:
            sys.exit(entry.error(exc))
    try:
        if not online or os.environ.get(IS_SUB_PROC_KEY) == '1':
            supervisor = os.environ.get(SUPERVISOR_PID_KEY, '')
            if online and supervisor.isdigit():
                # Out of the terminal's session (see supervise): end with the supervisor, e.g. after its SIGKILL.
                from mortal.lifetime import die_with_parent
                die_with_parent(signal.SIGTERM, expected_parent=int(supervisor))
            code = run_learner(config)
        else:
            code = supervise(argv)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == '__main__':
    main()
