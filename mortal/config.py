"""Loading and validating the TOML configuration shared by every process.

The file is Mortal's ``config.toml`` layout (``[control]``, ``[train_play.<profile>]``, ``[online.server]``, ...):
every key of Mortal's ``config.example.toml`` is understood with Mortal's meaning, plus a few documented extras
(``[resnet] dropout``, ``[online.remote] token``, ``[online.server] max_frame_bytes``). The result is the plain
nested dict Mortal uses (``config['control']['version']``), with defaults filled in for optional keys, so it can be
stored in a checkpoint as ``state['config']`` and read back with ``torch.load(..., weights_only=True)``.

Nothing is read at import time: each process calls :func:`load_config` once in ``main()`` and passes the dict down.

Validation happens at load time and is strict for every section that is present (a missing, ill-typed or
out-of-range key is an error that names the key and the file). Which sections must exist depends on the process:
pass one of the ``*_SECTIONS`` tuples below as ``required``. Problems that would not crash but would make a run
misbehave (a buffer ``capacity`` that can never be filled, ignored keys, typos) are logged as warnings.
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import toml

logger = logging.getLogger(__name__)

DEFAULT_PATH = 'config.toml'
ENV_PATH = 'MORTAL_CFG'
ENV_PROFILE = 'TRAIN_PLAY_PROFILE'
ENV_SP_THREADS = 'MORTAL_SP_THREADS'
DEFAULT_PROFILE = 'default'
#: Feature/model versions of ``[control] version`` (Mortal's 1-3, plus 4 with the single-player block).
SUPPORTED_VERSIONS = (1, 2, 3, 4)
# Frames above this are refused by the wire protocol (mortal.net.wire) unless [online.server] max_frame_bytes says
# otherwise. 512 MiB holds a 192x40 model's parameters (~40 MB) or a submission of thousands of gz logs with a wide
# margin.
DEFAULT_MAX_FRAME_BYTES = 512 * 1024 * 1024
# [dataset] max_log_bytes (also the readers' default, mortal.data.mjai_log): a hanchan is well under 1 MB of mjai JSON.
DEFAULT_MAX_LOG_BYTES = 64 * 1024 * 1024
SCHEDULER_DEFAULT_INIT = 1e-8  # Mortal's LinearWarmUpCosineAnnealingLR default for [optim.scheduler] init
BEST_RULES = ('paired', 'sprt', 'mortal')  # [test_play] best_rule (mortal.learning.gate)
SCHEDULE_KINDS = ('constant', 'inverse', 'cosine')  # [schedule.*] kind (mortal.learning.schedule)

# Section names required by each process. 'train_play' means the [train_play.<profile>] table of the
# TRAIN_PLAY_PROFILE in use (see train_play_profile).
CORE_SECTIONS = ('control', 'resnet', 'env')
SERVER_SECTIONS = ('online', 'online.remote', 'online.server')
CLIENT_SECTIONS = CORE_SECTIONS + ('online', 'online.remote', 'baseline.train', 'train_play')
TRAIN_SECTIONS = CORE_SECTIONS + (
    'test_play', 'dataset', 'cql', 'aux', 'freeze_bn', 'optim', 'optim.scheduler', 'baseline.test', 'grp',
    'grp.network')
ONLINE_TRAIN_SECTIONS = TRAIN_SECTIONS + ('online', 'online.remote')
ONE_VS_THREE_SECTIONS = ('1v3', '1v3.challenger', '1v3.champion')
TRAIN_GRP_SECTIONS = ('grp', 'grp.network', 'grp.control', 'grp.dataset', 'grp.optim')
BOT_SECTIONS = ('control',)


class ConfigError(ValueError):
    """The configuration file is missing, unparsable or invalid.

    ``str(err)`` names the file and, for each problem, the key as ``[section] key``.
    Attributes: ``path`` (str), ``problems`` (list of str, one per problem, each naming key and file).
    """

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f'{len(self.problems)} problems in {path}:\n' + '\n'.join(f'  - {p}' for p in self.problems)
        super().__init__(text)


class UnsupportedVersionError(ValueError):
    """The requested feature version is not one of Mortal's versions 1-4 (or not an integer)."""


def check_version(version) -> int:
    """Return ``version`` as ``int`` if it is one of ``SUPPORTED_VERSIONS`` (1, 2, 3 or 4).

    The one check of a feature/model version (``[control] version``, a checkpoint's, a model's): call it at
    process start-up so that a bad version fails before any work begins. Raises ``UnsupportedVersionError``
    (a ``ValueError``) for anything that is not an integer 1-4 (``bool``, ``str`` and ``float`` are refused).
    """
    # bool is an int subclass; True would silently mean version 1. numpy integers are numbers.Integral.
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise UnsupportedVersionError(
            f"feature version must be an integer 1-4, got {version!r} ({type(version).__name__})")
    version = int(version)
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(f"unknown feature version {version}; Mortal defines versions 1-4")
    return version


# ------------------------------------------------------------------------------------------------------------------
# Schema

_REQUIRED = object()  # marker: the key has no default
MAX_OFFLINE_BATCH = 1 << 16  # rows; ~8 GB of version-3 observations, far past any sane mix
_ABSENT = object()  # marker: an optional key that is accepted but not filled in when missing


@dataclass(frozen=True)
class Key:
    """One config key: its type, default and meaning (the README's key table is checked against these)."""

    kind: str  # 'int', 'float', 'bool', 'str', 'str_list', 'float_list'
    doc: str
    default: Any = _REQUIRED
    check: Callable[[Any], str | None] | None = None  # returns the reason the value is out of range, or None
    length: int | None = None  # exact length of a list

    @property
    def required(self) -> bool:
        """True when the key has no default and must be in the file."""
        return self.default is _REQUIRED


def _positive(v):
    return None if v > 0 else 'must be > 0'


def _non_negative(v):
    return None if v >= 0 else 'must be >= 0'


def _unit_closed(v):
    return None if 0 <= v <= 1 else 'must be within [0, 1]'


def _multiple_of_4(v):
    if v <= 0:
        return 'must be > 0'
    return None if v % 4 == 0 else 'must be a multiple of 4 (one duplicate set is 4 games with rotated seats)'


def _version(v):
    try:
        check_version(v)
    except UnsupportedVersionError:
        *most, last = SUPPORTED_VERSIONS
        return f'must be {", ".join(map(str, most))} or {last}'
    return None


def _top_p(v):
    return None if 0 < v <= 1 else 'must be within (0, 1]'


def _port(v):
    return None if 0 <= v <= 65535 else 'must be within [0, 65535]'


def _dropout(v):
    return None if 0 <= v < 1 else 'must be within [0, 1)'


def _reserve_ratio(v):
    return None if 0 <= v < 1 else 'must be within [0, 1)'


def _betas(v):
    return None if all(0 <= b < 1 for b in v) else 'each beta must be within [0, 1)'


def _token(v):
    return None if v else 'must not be empty (leave the key out for no token)'


def _seed_key(v):
    return None if v == -1 or 0 <= v < 2 ** 64 else 'must be -1 (random) or within [0, 2^64)'


_MODEL_SLOT = {
    'device': Key('str', "torch device of this model, e.g. 'cuda:0' or 'cpu'"),
    'enable_compile': Key('bool', 'torch.compile the model'),
    'state_file': Key('str', 'checkpoint to load the model from (Mortal checkpoint layout)'),
}

def _side_type(v):
    return None if v in ('mortal', 'rulebase') else "must be 'mortal' or 'rulebase'"


# Keys a `type = 'rulebase'` side (mjai's RulebaseBot) does not need.
_MODEL_ONLY_1V3 = ('device', 'state_file', 'stochastic_latent', 'enable_compile', 'enable_amp',
                   'enable_rule_based_agari_guard')

_ENGINE_1V3 = {
    'type': Key('str', "'mortal' (a checkpoint) or 'rulebase' (mjai's RulebaseBot)", default='mortal',
                check=_side_type),
    'device': Key('str', "torch device of this engine"),
    'name': Key('str', 'engine name written into the logs'),
    'state_file': Key('str', 'checkpoint to load'),
    'stochastic_latent': Key('bool', 'sample the latent instead of taking its mean (Mortal v1 models only)'),
    'enable_compile': Key('bool', 'torch.compile the model'),
    'enable_amp': Key('bool', 'autocast inference'),
    'enable_rule_based_agari_guard': Key('bool', 'never let the model decline a hora that a rule allows'),
}

def _sprt_error(v):
    return None if 0 < v < 0.5 else 'must be within (0, 0.5)'


def _factor(v):
    return None if 0 < v <= 1 else 'must be within (0, 1]'


def _schedule_kind(v):
    return None if v in SCHEDULE_KINDS else f'must be one of {", ".join(SCHEDULE_KINDS)}'


_SCHEDULE_KIND_DOC = ("extra: a factor on {what} against trainer steps: 'constant' (1, Mortal), 'inverse' "
                      "(1 / (1 + rate * steps)) or 'cosine' (1 to final over max_steps)")
_SCHEDULE = {
    'rate': Key('float', "extra: 'inverse': the rate per step", default=0.0, check=_non_negative),
    'final': Key('float', "extra: 'cosine': the factor reached at max_steps and kept after", default=0.0,
                 check=_unit_closed),
    'max_steps': Key('int', "extra: 'cosine': trainer steps of the descent", default=0, check=_non_negative),
}



def _schedule_table(what: str) -> dict:
    return {'kind': Key('str', _SCHEDULE_KIND_DOC.format(what=what), default='constant', check=_schedule_kind),
            **_SCHEDULE}


SCHEMA: dict[str, dict[str, Key]] = {
    'control': {
        'version': Key('int', 'model/feature version (1-4); 4 adds the single-player block (mortal.features.obs_v4)',
                       check=_version),
        'online': Key('bool', 'online training: replays come from the server, no CQL term (unless [cql] online_min_q_weight)'),
        'state_file': Key('str', 'trainer checkpoint (read at start, written every save_every steps)'),
        'best_state_file': Key('str', 'copy of the checkpoint with the best test-play result'),
        'tensorboard_dir': Key('str', 'TensorBoard event directory'),
        'device': Key('str', "torch device of the trainee, e.g. 'cuda:0' or 'cpu'"),
        'enable_cudnn_benchmark': Key('bool', 'torch.backends.cudnn.benchmark while training'),
        'enable_amp': Key('bool', 'automatic mixed precision for training'),
        'enable_compile': Key('bool', 'torch.compile the trainee'),
        'batch_size': Key('int', 'samples per backward pass', check=_positive),
        'opt_step_every': Key('int', 'backward passes per optimizer step (gradient accumulation)',
                              check=_positive),
        'save_every': Key('int', 'steps between checkpoints; a multiple of opt_step_every', check=_positive),
        'test_every': Key('int', 'steps between test plays; a multiple of save_every', check=_positive),
        'submit_every': Key('int', 'steps between parameter submissions to the server (online)',
                            check=_positive),
    },
    'train_play.*': {
        'games': Key('int', 'games per client round (multiple of 4)', check=_multiple_of_4),
        'log_dir': Key('str', 'where the client writes its self-play logs (wiped each round)'),
        'boltzmann_epsilon': Key('float', 'probability of sampling instead of acting greedily', check=_unit_closed),
        'boltzmann_temp': Key('float', 'temperature of the Boltzmann sampling over Q', check=_positive),
        'top_p': Key('float', 'nucleus (top-p) cut applied before sampling', check=_top_p),
        'repeats': Key('int', 'rounds played on the same seeds before moving on', check=_positive),
    },
    'test_play': {
        'games': Key('int', 'games per test play (multiple of 4)', check=_multiple_of_4),
        'log_dir': Key('str', 'where test-play logs are written'),
        'best_rule': Key('str', "extra: when best.pth is replaced: 'paired' (the CI of the per-deal paired "
                                "difference to best.pth below 0), 'sprt' (the SPRT says better) or 'mortal' "
                                "(avg pt and avg rank both not worse, Mortal's rule)", default='paired',
                         check=lambda v: None if v in BEST_RULES else f'must be one of {", ".join(BEST_RULES)}'),
        'confidence': Key('float', 'extra: two-sided confidence of the paired CI (best_rule, [guard])',
                          default=0.95, check=lambda v: None if 0.5 <= v < 1 else 'must be within [0.5, 1)'),
        'sprt_delta': Key('float', 'extra: SPRT H1, the challenger better by this avg rank (H0: not better)',
                          default=0.05, check=lambda v: None if 0 < v <= 1 else 'must be within (0, 1]'),
        'sprt_alpha': Key('float', 'extra: SPRT chance of calling an equal model better', default=0.05,
                          check=_sprt_error),
        'sprt_beta': Key('float', 'extra: SPRT chance of missing a model better by sprt_delta', default=0.05,
                         check=_sprt_error),
        'sprt_chunk': Key('int', 'extra: games between two looks of the SPRT (multiple of 4)', default=64,
                          check=_multiple_of_4),
        'fresh_deals': Key('bool', 'extra: every test play meets new deals and best.pth is played on them too '
                                   '(twice the games; no winner\'s curse of a record on fixed deals); false = '
                                   "Mortal's fixed test seeds", default=False),
    },
    'dataset': {
        'globs': Key('str_list', 'glob patterns of gzip mjai logs (offline training)'),
        'file_index': Key('str', 'cache of the expanded file list'),
        'file_batch_size': Key('int', 'log files decoded per shuffle pool', check=_positive),
        'reserve_ratio': Key('float', 'fraction of a pool kept back to mix with the next', check=_reserve_ratio),
        'num_workers': Key('int', 'DataLoader worker processes', check=_non_negative),
        'player_names_files': Key('str_list', 'files listing player names whose actions are learned'),
        'num_epochs': Key('int', 'passes over the file list (offline)', check=_positive),
        'enable_augmentation': Key('bool', 'also train on suit-permuted copies of each log'),
        'augmented_first': Key('bool', 'put the augmented copy before the original'),
        'max_log_bytes': Key('int', 'extra: largest decompressed log in bytes; a larger one is skipped (a '
                                    'decompression bomb)', default=DEFAULT_MAX_LOG_BYTES, check=_positive),
    },
    'env': {
        'gamma': Key('float', 'discount per decision step of the kyoku reward', check=lambda v: (
            None if 0 < v <= 1 else 'must be within (0, 1]')),
        'pts': Key('float_list', 'reward points for final rank 1-4, used by the GRP reward', length=4),
    },
    'resnet': {
        'conv_channels': Key('int', 'channels of the residual tower', check=_positive),
        'num_blocks': Key('int', 'residual blocks', check=_positive),
        'dropout': Key('float', 'extra: dropout in residual blocks during training (0 = off, as Mortal)',
                       default=0.0, check=_dropout),
    },
    'cql': {
        'min_q_weight': Key('float', 'CQL regularizer weight (offline only; unused online)', check=_non_negative),
        'online_min_q_weight': Key('float', 'extra: CQL weight kept in online training (0 = none, as Mortal)',
                                   default=0.0, check=_non_negative),
        'calibrated': Key('bool', 'extra: Cal-QL, the CQL push-down clamped at the Monte-Carlo return',
                          default=False),
    },
    'aux': {
        'next_rank_weight': Key('float', 'weight of the next-rank auxiliary cross entropy', check=_non_negative),
    },
    'freeze_bn': {
        'mortal': Key('bool', 'keep BatchNorm statistics frozen (true for online training)'),
    },
    'optim': {
        'eps': Key('float', 'AdamW eps', check=_positive),
        'betas': Key('float_list', 'AdamW betas', length=2, check=_betas),
        'weight_decay': Key('float', 'AdamW weight decay (not applied to norms and biases)', check=_non_negative),
        'max_grad_norm': Key('float', 'gradient clipping norm (0 = no clipping)', check=_non_negative),
    },
    'optim.scheduler': {
        'peak': Key('float', 'learning rate after warm-up (0 only for a control run)', check=_non_negative),
        'final': Key('float', 'learning rate after max_steps (cosine annealing in between)', check=_non_negative),
        'warm_up_steps': Key('int', 'linear warm-up steps', check=_non_negative),
        'max_steps': Key('int', 'end of cosine annealing (0 = constant after warm-up)', check=_non_negative),
        'init': Key('float', 'learning rate at step 0 of warm-up (Mortal default 1e-8)', default=_ABSENT,
                    check=_non_negative),
        'offset': Key('int', 'steps added before evaluating the schedule (Mortal default 0)', default=_ABSENT),
        'epoch_size': Key('int', 'restart the schedule every this many steps (0 = never)', default=_ABSENT,
                          check=_non_negative),
    },
    'baseline.train': {
        **_MODEL_SLOT,
        'from_server': Key('bool', "extra: a client fetches the trainer's baseline from the server when this file is "
                                   'missing or holds other weights (the old one kept as .bak)', default=True),
    },
    'baseline.test': dict(_MODEL_SLOT),
    'online': {
        'history_window': Key('int', 'client rounds in the moving average of trainee ranks', check=_positive),
        'enable_compile': Key('bool', 'torch.compile the trainee copy in the client'),
        'anchor_weight': Key('float', 'extra: weight of the MSE of untaken legal Q to the [baseline.train] '
                                      "model's Q (0 = off, as Mortal)", default=0.0, check=_non_negative),
        'probe_file': Key('str', 'extra: positions for diag/policy_drift (built once from [dataset] globs; '
                                 'default probe.pth beside [control] state_file)', default=_ABSENT),
        'probe_size': Key('int', 'extra: positions in the probe (0 = no probe)', default=2048,
                          check=_non_negative),
        'offline_batch_size': Key('int', 'extra: offline samples of [dataset] appended to each online batch, '
                                         'with the offline CQL term (0 = off, as Mortal)', default=0,
                                  check=lambda v: None if 0 <= v <= MAX_OFFLINE_BATCH else
                                  f'must be within [0, {MAX_OFFLINE_BATCH}]'),
        'ema_decay': Key('float', 'extra: publish, test-play and keep as best.pth an EMA of the weights with this '
                                  'decay per optimizer step (0 = off, as Mortal)', default=0.0,
                         check=lambda v: None if 0 <= v < 1 else 'must be within [0, 1)'),
    },
    'online.remote': {
        'host': Key('str', 'server address (bind address for the server)'),
        'port': Key('int', 'server TCP port (0 = any free port, server only)', check=_port),
        'token': Key('str', 'extra: shared secret every peer must send; required when host is not loopback',
                     default=None, check=_token),
    },
    'online.server': {
        'buffer_dir': Key('str', 'where submitted logs wait (wiped at server start)'),
        'drain_dir': Key('str', 'where drained logs are moved for the trainer (wiped at server start)'),
        'sample_reuse_rate': Key('float', 'accepted for compatibility; has no effect (as in Mortal)', default=0),
        'sample_reuse_threshold': Key('float', 'accepted for compatibility; has no effect (as in Mortal)',
                                      default=0),
        'capacity': Key('int', 'buffered log files at which clients are refused (back-pressure)',
                        check=_positive),
        'force_sequential': Key('bool', 'one client round per trainer parameter version; drain only when full'),
        'max_frame_bytes': Key('int', 'extra: largest accepted wire frame in bytes',
                               default=DEFAULT_MAX_FRAME_BYTES, check=_positive),
        'max_pending_connections': Key('int', 'extra: connections that may be sending their frame header at once '
                                       '(more are closed at once)', default=64, check=_positive),
        'max_inflight_bytes': Key('int', 'extra: payload bytes the server reads or handles at once over all '
                                  'connections (0 = max_frame_bytes)', default=0, check=_non_negative),
        'payload_min_bytes_per_s': Key('int', 'extra: average bytes/s a frame payload must arrive at, or its '
                                       'connection is closed (30 s + length / this)', default=131072,
                                       check=_positive),
    },
    '1v3': {
        'seed_key': Key('int', 'duplicate seed key (-1 = random per run)', default=-1, check=_seed_key),
        'games_per_iter': Key('int', 'games per iteration (multiple of 4)', check=_multiple_of_4),
        'iters': Key('int', 'iterations', check=_positive),
        'log_dir': Key('str', 'where 1v3 logs are written'),
    },
    '1v3.challenger': dict(_ENGINE_1V3),
    '1v3.champion': dict(_ENGINE_1V3),
    '1v3.akochan': {
        'enabled': Key('bool', 'use akochan as the champion (not supported here; must stay false)'),
        'dir': Key('str', 'akochan directory'),
        'tactics': Key('str', 'akochan tactics.json'),
    },
    'grp': {
        'state_file': Key('str', 'GRP checkpoint (reward model)'),
    },
    'grp.network': {
        'hidden_size': Key('int', 'GRU hidden size', check=_positive),
        'num_layers': Key('int', 'GRU layers', check=_positive),
    },
    'grp.control': {
        'device': Key('str', 'torch device for GRP training'),
        'enable_cudnn_benchmark': Key('bool', 'torch.backends.cudnn.benchmark'),
        'tensorboard_dir': Key('str', 'TensorBoard event directory for GRP training'),
        'batch_size': Key('int', 'GRP batch size', check=_positive),
        'save_every': Key('int', 'steps between GRP checkpoints and validations', check=_positive),
        'val_steps': Key('int', 'validation batches per validation', check=_positive),
    },
    'grp.dataset': {
        'train_globs': Key('str_list', 'glob patterns of training logs'),
        'val_globs': Key('str_list', 'glob patterns of validation logs'),
        'file_index': Key('str', 'cache of the expanded file lists'),
        'file_batch_size': Key('int', 'log files decoded per shuffle pool', check=_positive),
    },
    'grp.optim': {
        'lr': Key('float', 'AdamW learning rate', check=_positive),
    },
    # Extras of the long-run guards (docs/operations.md); every default is Mortal's behaviour (nothing fires).
    'guard': {
        'rollback_after': Key('int', 'extra: roll back to best.pth after this many test plays in a row '
                                     'significantly worse than it (0 = never)', default=0, check=_non_negative),
        'max_policy_drift': Key('float', 'extra: roll back at a test play when diag/policy_drift is above this '
                                         '(0 = no bound)', default=0.0, check=_unit_closed),
        'min_q_gap': Key('float', 'extra: roll back at a test play when diag/q_gap is below this (0 = no bound)',
                         default=0.0, check=_non_negative),
        'lr_factor': Key('float', 'extra: the learning rate is multiplied by this at each rollback',
                         default=1.0, check=_factor),
        'epsilon_factor': Key('float', "extra: the clients' boltzmann_epsilon is multiplied by this at each "
                                       'rollback', default=1.0, check=_factor),
        'keep': Key('int', 'extra: replaced state files kept as <state_file>.<time>.rollback (oldest removed)',
                    default=5, check=_positive),
    },
    'rotation': {
        'after': Key('int', 'extra: promote best.pth to the baseline after this many test plays in a row that beat '
                            'the baseline significantly (0 = never, as Mortal)', default=0, check=_non_negative),
        'max_rank': Key('float', 'extra: such a test play has avg rank at most this and its CI below 2.5',
                        default=2.45, check=lambda v: None if 1 <= v < 2.5 else 'must be within [1, 2.5)'),
        'pool_size': Key('int', 'extra: clients draw each round one of the newest this many baselines '
                                '(the current one and its .bak copies; 1 = the current one only)', default=1,
                         check=_positive),
    },
    'schedule.lr': _schedule_table('the learning rate of [optim.scheduler]'),
    'schedule.epsilon': _schedule_table("each profile's boltzmann_epsilon"),
    'schedule.temp': _schedule_table("each profile's boltzmann_temp"),
    # Ours: `python -m mortal.bootstrap` (rule-based games -> GRP -> offline Mortal -> online dir).
    'bootstrap': {
        'games': Key('int', 'training hanchan of rule-based bots to generate (a multiple of 4 when epsilon > 0)',
                     check=_non_negative),
        'val_games': Key('int', 'validation hanchan (GRP validation split)', check=_non_negative),
        'log_dir': Key('str', 'generated logs go to log_dir/train and log_dir/val'),
        'work_dir': Key('str', 'offline trainer state, TensorBoard and test-play logs'),
        'grp_steps': Key('int', 'GRP training steps (a multiple of [grp.control] save_every)',
                         check=_non_negative),
        'workers': Key('int', 'game-generation processes; 0 = one per CPU', default=0, check=_non_negative),
        'epsilon': Key('float', 'probability that a bot discards a random legal tile (never in riichi), so the '
                                'four seat rotations of a deal differ', default=0.01,
                       check=lambda v: None if 0 <= v < 1 else 'must be within [0, 1)'),
        'seed_key': Key('int', 'duplicate key of the train logs; validation uses seed_key + 1',
                        default=0x6f6f7473, check=_seed_key),
        'offline_test_every': Key('int', 'offline test play (vs 3 RulebaseBots) every n steps; 0 = never',
                                  default=0, check=_non_negative),
        'offline_test_games': Key('int', 'games per offline test play', default=8, check=_multiple_of_4),
        'offline_lr': Key('float', "constant learning rate of the offline run; 0 = the config's [optim.scheduler]",
                          default=0.0, check=_non_negative),
    },
}

# Tables that only hold sub-tables (no keys of their own).
_CONTAINERS = ('train_play', 'baseline', 'schedule')
# Sections of extras whose every key has a default: filled in when the file lacks them.
OPTIONAL_SECTIONS = ('guard', 'rotation', 'schedule.lr', 'schedule.epsilon', 'schedule.temp')


def _schema_for(section: str) -> dict[str, Key] | None:
    if section in SCHEMA:
        return SCHEMA[section]
    if section.startswith('train_play.') and section.count('.') == 1:
        return SCHEMA['train_play.*']
    return None


# ------------------------------------------------------------------------------------------------------------------
# Environment overrides

@dataclass(frozen=True)
class EnvOverrides:
    """The environment variables that steer a process, read once at start-up (``mortal.entry.start``).

    ``config_path``: ``MORTAL_CFG`` (else ``config.toml``); ``profile``: ``TRAIN_PLAY_PROFILE``, the
    ``[train_play.<profile>]`` table a client plays (else ``default``); ``sp_threads``: ``MORTAL_SP_THREADS``,
    threads of the version-4 single-player search (None: unset or not a positive integer, the default applies).
    """

    config_path: str = DEFAULT_PATH
    profile: str = DEFAULT_PROFILE
    sp_threads: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> 'EnvOverrides':
        """The overrides in ``env``; the one place these variables are read. A ``MORTAL_SP_THREADS`` that is
        not a positive integer is logged as a warning and ignored."""
        threads = env.get(ENV_SP_THREADS)
        if threads is not None and (not threads.strip().isdigit() or int(threads) < 1):
            logger.warning('%s=%r is not a positive integer; using the default thread count',
                           ENV_SP_THREADS, threads)
            threads = None
        return cls(config_path=env.get(ENV_PATH) or DEFAULT_PATH, profile=env.get(ENV_PROFILE) or DEFAULT_PROFILE,
                   sp_threads=None if threads is None else int(threads))

    @classmethod
    def of(cls, env: 'Env') -> 'EnvOverrides':
        """``env`` itself when it is already resolved, else :meth:`from_env` of the mapping."""
        return env if isinstance(env, cls) else cls.from_env(env)


#: What the functions below take as ``env``: the overrides resolved at start-up, or a mapping such as
#: ``os.environ`` (tests pass ``{}``) that is read on the spot.
Env = Mapping[str, str] | EnvOverrides


# ------------------------------------------------------------------------------------------------------------------
# Loading

def resolve_path(path: str | os.PathLike | None = None, env: Env = os.environ) -> str:
    """The config path to use: ``path`` if given, else env ``MORTAL_CFG``, else ``'config.toml'`` (as Mortal)."""
    if path is not None:
        return os.fspath(path)
    return EnvOverrides.of(env).config_path


def load_config(path: str | os.PathLike | None = None, *, required: Iterable[str] = CORE_SECTIONS,
                env: Env = os.environ) -> dict:
    """Read, validate and return the config as a plain nested dict with defaults filled in.

    Args:
        path: TOML file; ``None`` means env ``MORTAL_CFG`` or ``config.toml`` in the working directory.
        required: dotted section names this process needs (e.g. ``SERVER_SECTIONS``); ``'train_play'`` stands for
            the ``[train_play.<profile>]`` table of the ``TRAIN_PLAY_PROFILE`` in use. Sections that are present
            are validated whether required or not.
        env: where ``MORTAL_CFG`` and ``TRAIN_PLAY_PROFILE`` come from (:data:`Env`).

    Returns:
        ``config`` with ``config['control']['version']`` etc.; optional keys of present sections filled.

    Raises:
        ConfigError: file missing or unreadable, TOML syntax error (with line), or any validation error; the
            message names the file and every offending key.

    Warnings (logged on logger ``mortal.config``) are returned by :func:`validate` and cover unknown keys,
    ineffective keys and buffer settings that would stall a run.
    """
    path = resolve_path(path, env)
    try:
        # utf-8-sig: Windows editors (Notepad) prepend a BOM, which the TOML parser would reject at line 1.
        with open(path, encoding='utf-8-sig') as f:
            config = toml.load(f)
    except FileNotFoundError:
        raise ConfigError(path, [f'config file {path} not found (set {ENV_PATH} or pass the path)']) from None
    except toml.TomlDecodeError as e:
        raise ConfigError(path, [f'{path}: TOML syntax error at line {e.lineno}, column {e.colno}: {e.msg}']) \
            from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, [f'cannot read config file {path}: {e}']) from None
    except (IndexError, ValueError, TypeError) as e:
        # The toml package crashes with IndexError on some malformed input instead of a TomlDecodeError.
        raise ConfigError(path, [f'{path}: TOML syntax error (the parser failed with {type(e).__name__}: {e}; '
                                 f'look for unbalanced brackets, braces or quotes)']) from None
    validate(config, path, required=required, env=env)
    return config


def validate(config: dict, path: str = DEFAULT_PATH, *, required: Iterable[str] = CORE_SECTIONS,
             env: Env = os.environ) -> list[str]:
    """Validate ``config`` in place (filling defaults) and return the warnings, which are also logged.

    ``path`` is only used in messages. Raises :class:`ConfigError` listing every error found.
    """
    required = tuple(required)
    errors: list[str] = []
    warns: list[str] = []

    _check_tables(config, path, errors, warns)
    for name in required:
        if name == 'train_play':
            continue  # checked below with the profile in use
        if _get_table(config, name) is None:
            errors.append(f'missing section [{name}] in {path}')
    if 'train_play' in required:
        profile = profile_name(env)
        if _get_table(config, f'train_play.{profile}') is None:
            errors.append(f'missing section [train_play.{profile}] in {path} '
                          f'(selected by {ENV_PROFILE}={profile!r})')
    if not errors:
        _check_relations(config, path, errors, warns)
    if errors:
        raise ConfigError(path, errors)
    for w in warns:
        logger.warning('%s', w)
    return warns


def optional_section(config: dict, dotted: str) -> dict:
    """The table ``dotted`` of one of ``OPTIONAL_SECTIONS`` with its defaults under whatever ``config`` holds
    (a config dict built by hand may lack the table). Raises KeyError for another section."""
    if dotted not in OPTIONAL_SECTIONS:
        raise KeyError(f'{dotted} is not an optional section')
    table = lookup(config, dotted) or {}
    return {**{name: key.default for name, key in SCHEMA[dotted].items()}, **table}


def lookup(config: dict, dotted: str, default=None):
    """``config['a']['b']`` for ``'a.b'``; ``default`` when any level is missing or not a table."""
    node = config
    for part in dotted.split('.'):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _get_table(config: dict, dotted: str):
    table = lookup(config, dotted)
    return table if isinstance(table, dict) else None


def _check_tables(config: dict, path: str, errors: list[str], warns: list[str]) -> None:
    """Walk every table of the file: type-check known keys, fill defaults, collect unknown names."""

    def walk(table: dict, prefix: str):
        schema = _schema_for(prefix) if prefix else None
        if prefix and schema is None and prefix not in _CONTAINERS:
            warns.append(f'unknown section [{prefix}] in {path}')
            return
        for name, value in table.items():
            dotted = f'{prefix}.{name}' if prefix else name
            if schema is not None and name in schema:
                _check_key(table, prefix, name, schema[name], path, errors)
            elif isinstance(value, dict):
                walk(value, dotted)
            elif prefix:
                warns.append(f'unknown key [{prefix}] {name} in {path}')
            else:
                warns.append(f'unknown top-level key {name} in {path}')
        if schema is not None:
            for name, key in schema.items():
                if name in table:
                    continue
                if key.default is _REQUIRED:
                    if table.get('type') == 'rulebase' and name in _MODEL_ONLY_1V3:
                        continue  # a rule-based side loads no model
                    errors.append(f'missing key [{prefix}] {name} in {path} ({key.kind}: {key.doc})')
                elif key.default is not _ABSENT:
                    table[name] = key.default

    for dotted in OPTIONAL_SECTIONS:
        table, where = config, []
        for part in dotted.split('.'):
            where.append(part)
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                problem = f"[{'.'.join(where)}] in {path} must be a table, got {table!r}"
                if problem not in errors:
                    errors.append(problem)
                break
        else:
            if not table:
                table.update({name: key.default for name, key in SCHEMA[dotted].items()})
    walk(config, '')


_KIND_NAMES = {'int': 'an integer', 'float': 'a number', 'bool': 'true or false', 'str': 'a string',
               'str_list': 'a list of strings', 'float_list': 'a list of numbers'}


def _check_key(table: dict, section: str, name: str, key: Key, path: str, errors: list[str]) -> None:
    value = table[name]
    if value is None and key.default is None:
        return  # an optional key already filled with its 'unset' default (validating twice is harmless)
    where = f'[{section}] {name} in {path}'
    ok, value = _coerce(key.kind, value)
    if ok and key.length is not None and len(value) != key.length:
        errors.append(f'{where} must have exactly {key.length} elements, got {len(value)}')
        return
    if not ok:
        errors.append(f'{where} must be {_KIND_NAMES[key.kind]}, got {table[name]!r}')
        return
    if key.kind == 'int' and not -2 ** 63 <= value < 2 ** 64:
        # TOML integers are 64-bit (seed_key is a u64); the toml package accepts any size, which would only
        # fail much later inside torch or the Rust core.
        errors.append(f'{where} is out of the 64-bit integer range, got {value!r}')
        return
    table[name] = value
    if key.check is not None:
        reason = key.check(value)
        if reason:
            errors.append(f'{where} {reason}, got {value!r}')


def _coerce(kind: str, value):
    """(ok, value) with ints widened to float where a number is expected; bool is never a number."""

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    def is_num(v):
        return (is_int(v) or isinstance(v, float)) and math.isfinite(v)

    if kind == 'int':
        return is_int(value), value
    if kind == 'float':
        return (True, float(value)) if is_num(value) else (False, value)
    if kind == 'bool':
        return isinstance(value, bool), value
    if kind == 'str':
        return isinstance(value, str), value
    if kind == 'str_list':
        return isinstance(value, list) and all(isinstance(v, str) for v in value), value
    if kind == 'float_list':
        if isinstance(value, list) and all(is_num(v) for v in value):
            return True, [float(v) for v in value]
        return False, value
    raise AssertionError(kind)


def _check_relations(config: dict, path: str, errors: list[str], warns: list[str]) -> None:
    """Rules that involve several keys (run only once every key has the right type)."""
    control = config.get('control')
    online = _get_table(config, 'online')
    if control is not None and online is not None and online['offline_batch_size'] and not control['online']:
        warns.append(f'[online] offline_batch_size = {online["offline_batch_size"]} in {path} has no effect with '
                     f'[control] online = false (offline training reads [dataset] whole)')
    if control is not None:
        if control['save_every'] % control['opt_step_every'] != 0:
            errors.append(f'[control] save_every = {control["save_every"]} in {path} must be a multiple of '
                          f'[control] opt_step_every = {control["opt_step_every"]}')
        if control['test_every'] % control['save_every'] != 0:
            errors.append(f'[control] test_every = {control["test_every"]} in {path} must be a multiple of '
                          f'[control] save_every = {control["save_every"]}')

    test_play = _get_table(config, 'test_play')
    if test_play is not None and control is not None and control['online']:
        deals = test_play['games'] // 4
        if test_play['best_rule'] == 'sprt' and deals < 8:
            warns.append(f"[test_play] games = {test_play['games']} in {path} is fewer than the 32 games the SPRT "
                         f"needs before it decides (best_rule = 'sprt'): best.pth would never be replaced")
    rotation = _get_table(config, 'rotation')
    if rotation is not None and rotation['after'] and _get_table(config, 'baseline.train') is None:
        errors.append(f'[rotation] after = {rotation["after"]} in {path} needs a [baseline.train] section '
                      f'(the file it promotes best.pth to)')
    for name in ('lr', 'epsilon', 'temp'):
        table = _get_table(config, f'schedule.{name}')
        if table is not None and table['kind'] == 'cosine' and table['max_steps'] <= 0:
            errors.append(f"[schedule.{name}] max_steps in {path} must be > 0 with kind = 'cosine'")
        if table is not None and name == 'temp' and table['kind'] == 'cosine' and table['final'] < 1e-6:
            errors.append(f"[schedule.temp] final in {path} must be at least 1e-6 (a temperature near 0 cannot "
                          f"sample)")
    sched = _get_table(config, 'optim.scheduler')
    if sched is not None:
        # The very rules the scheduler enforces (one function), so a config that loads also trains.
        for key, rule in scheduler_problems(**sched):
            errors.append(f'[optim.scheduler] {key} in {path} {rule}')

    remote = _get_table(config, 'online.remote')
    if remote is not None and not remote['token']:
        from mortal.net.address import is_loopback
        # resolve=False: no name lookup while a config loads (the host may resolve otherwise where a peer runs)
        if not is_loopback(remote['host'], resolve=False):
            errors.append(f'[online.remote] token in {path} is required because [online.remote] host = '
                          f'{remote["host"]!r} is not a loopback address (anyone who can reach the port could '
                          f'otherwise submit replays and parameters)')

    akochan = _get_table(config, '1v3.akochan')
    if akochan is not None and akochan['enabled']:
        errors.append(f'[1v3.akochan] enabled in {path} must be false: akochan is not supported')

    server = _get_table(config, 'online.server')
    if server is None:
        return
    if server['max_inflight_bytes'] and server['max_inflight_bytes'] < server['max_frame_bytes']:
        errors.append(f'[online.server] max_inflight_bytes = {server["max_inflight_bytes"]} in {path} must be 0 or '
                      f'at least [online.server] max_frame_bytes = {server["max_frame_bytes"]} (a largest frame '
                      f'must fit)')
    for name in ('sample_reuse_rate', 'sample_reuse_threshold'):
        if server[name] != 0:
            warns.append(f'[online.server] {name} = {server[name]} in {path} is accepted but has no effect '
                         f'(as in Mortal)')
    capacity = server['capacity']
    for profile, table in sorted((config.get('train_play') or {}).items()):
        if not isinstance(table, dict):
            continue
        games = table['games']  # one client round submits one log file per game
        if capacity < games:
            warns.append(f'[online.server] capacity = {capacity} in {path} is smaller than one client round of '
                         f'[train_play.{profile}] games = {games}: every submission overflows the buffer, '
                         f'so clients would be refused ("samples overflow") forever')
        elif server['force_sequential'] and capacity > games:
            need = -(-capacity // games)
            warns.append(f'[online.server] force_sequential = true with capacity = {capacity} in {path} larger '
                         f'than one client round of [train_play.{profile}] games = {games}: the server drains '
                         f'only a full buffer and each client plays once per trainer parameter version, so the '
                         f'trainer would wait forever unless at least {need} clients run')


def scheduler_problems(*, peak, final, warm_up_steps, max_steps, init=SCHEDULER_DEFAULT_INIT, offset=0,
                       epoch_size=0, **_ignored) -> list[tuple[str, str]]:
    """What is wrong with an ``[optim.scheduler]`` shape, as ``(key = value, rule)`` pairs; ``[]`` if nothing.

    The single definition used by the config check and by ``mortal.learning.schedule.LinearWarmUpCosineAnnealingLR``:
    ``peak >= final >= init >= 0``; ``warm_up_steps``, ``max_steps``, ``epoch_size`` >= 0; ``max_steps`` 0
    (no annealing: ``final`` from the end of the warm-up on) or >= ``warm_up_steps``. Learning rates are the
    absolute values (the optimizer's base lr is 1); steps count backward passes. Other keys are ignored.
    """
    out = []
    if init < 0:
        out.append((f'init = {init}', 'must be >= 0'))
    if not peak >= final >= init:
        out.append((f'final = {final}', f'must be within [init = {init}, peak = {peak}] (peak >= final >= init)'))
    for name, value in (('warm_up_steps', warm_up_steps), ('max_steps', max_steps), ('epoch_size', epoch_size)):
        if value < 0:
            out.append((f'{name} = {value}', 'must be >= 0'))
    if max_steps and max_steps < warm_up_steps:
        out.append((f'max_steps = {max_steps}', f'must be 0 or >= warm_up_steps = {warm_up_steps}'))
    return out


# ------------------------------------------------------------------------------------------------------------------
# Accessors

def require(config: dict, *sections: str, path: str | None = None, env: Env = os.environ) -> None:
    """Raise :class:`ConfigError` unless every dotted section exists, e.g. ``require(cfg, 'online.remote')``.

    ``path`` is named in the message (default: the path :func:`resolve_path` gives for ``env``).
    """
    path = resolve_path(path, env)
    missing = [f'missing section [{s}] in {path}' for s in sections if _get_table(config, s) is None]
    if missing:
        raise ConfigError(path, missing)


def train_play_profile(config: dict, env: Env = os.environ, *, path: str | None = None) -> dict:
    """``config['train_play'][profile]`` for env ``TRAIN_PLAY_PROFILE`` (default ``'default'``), as Mortal.

    Raises :class:`ConfigError` naming ``[train_play.<profile>]`` and the file when that table is missing.
    """
    profile = profile_name(env)
    table = _get_table(config, f'train_play.{profile}')
    if table is None:
        path = resolve_path(path, env)
        raise ConfigError(path, [f'missing section [train_play.{profile}] in {path} '
                                 f'(selected by {ENV_PROFILE}={profile!r})'])
    return table


def profile_name(env: Env = os.environ) -> str:
    """The train-play profile in use: env ``TRAIN_PLAY_PROFILE`` or ``'default'``."""
    return EnvOverrides.of(env).profile


def for_checkpoint(config: dict) -> dict:
    """A deep copy of ``config`` without secrets (``[online.remote] token``), to store as ``state['config']``.

    Checkpoints get shared (best.pth, baseline.pth); the shared secret must not travel with them.
    """
    public = copy.deepcopy(config)
    remote = _get_table(public, 'online.remote')
    if remote is not None:
        remote.pop('token', None)
    return public


def key_table() -> list[tuple[str, str, str, str, str]]:
    """Every known key as ``(section, key, type, default, meaning)``; the README's table is checked against it."""
    rows = []
    for section, keys in SCHEMA.items():
        for name, key in keys.items():
            if key.default is _REQUIRED:
                default = 'required'
            elif key.default is _ABSENT:
                default = '(unset)'
            elif key.default is None:
                default = '(none)'
            else:
                default = repr(key.default)
            rows.append((section.replace('*', '<profile>'), name, key.kind, default, key.doc))
    return rows
