"""Self-play and evaluation drivers around the 1v3 arena (Mortal's ``mortal/player.py``).

- ``TrainPlayer`` (client): the trainee (Boltzmann exploration, engine name ``trainee``) against three copies of the
  greedy ``[baseline.train]`` model (engine name ``baseline``, rule-based agari guard on), on duplicate seeds
  ``(train_seed, train_key)``: ``train_seed`` starts at 10000, ``train_key`` is a random 64-bit number per process,
  and ``train_seed`` advances by ``games / 4`` every ``repeats`` rounds.
- ``TestPlayer`` (trainer): the challenger (greedy, engine name ``mortal``) against ``[baseline.test]`` on the fixed
  seeds ``(10000, 0x2000)``; the result is ``Stat.from_dir(log_dir, 'mortal')``.

Both wipe their ``log_dir`` before playing and switch cuDNN benchmarking off while playing (batch shapes vary), then
restore ``[control] enable_cudnn_benchmark``, as Mortal does.
"""

import contextlib
import logging
import os
import secrets
from os import path

import numpy as np
import torch

from mortal.config import typed
from mortal.model.checkpoint import load_model_pair
from mortal.util.fsutil import empty_dir

logger = logging.getLogger('mortal.player')  # the name before the package split (log format)

TEST_SEED = (10000, 0x2000)  # Mortal's test-play seed (nonce start, key)
TRAIN_SEED_START = 10000


def _engine(brain, dqn, version: int, device, **kw):
    """A ``MortalEngine`` on ``device`` with autocast as Mortal plays: on (fp16) on CUDA only; CPU autocast would
    mean bfloat16, slower and less exact there."""
    from mortal.play.engine import MortalEngine
    device = torch.device(device)
    return MortalEngine(brain, dqn, version=version, device=device, enable_amp=device.type == 'cuda', **kw)


def load_baseline_engine(slot, *, name: str = 'baseline'):
    """A greedy ``MortalEngine`` with the agari guard from a typed ``[baseline.train]``/``[baseline.test]`` table
    (``mortal.config.section``: device, enable_compile, state_file).

    Raises FileNotFoundError, mortal.model.checkpoint.CheckpointError (``load_model_pair``)."""
    device = torch.device(slot.device)
    brain, dqn, version = load_model_pair(slot.state_file)
    if slot.enable_compile:
        brain.compile()
        dqn.compile()
    logger.info('%s engine: %s (version %d) on %s', name, slot.state_file, version, device)
    return _engine(brain, dqn, version, device, enable_rule_based_agari_guard=True, name=name)


@contextlib.contextmanager
def _cudnn_benchmark_off(restore_to: bool):
    """cuDNN benchmarking off inside (batch sizes vary during play), ``restore_to`` (the config's) after."""
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = restore_to


def _mtime(filename: str):
    try:
        return os.path.getmtime(filename)
    except OSError:
        return None


class TestPlayer:
    """Evaluates the trainee against ``[baseline.test]``: ``begin()``, one or more ``play_units`` (the SPRT plays
    in chunks), then ``stat()``; ``test_play`` does all three (Mortal's interface)."""

    def __init__(self, config: dict, *, baseline_engine=None):
        cfg = typed(config)
        self.baseline_engine = baseline_engine or load_baseline_engine(cfg.baseline.test)
        self.chal_version = cfg.control.version
        self.log_dir = path.abspath(cfg.test_play.log_dir)
        self.cudnn_benchmark = cfg.control.enable_cudnn_benchmark
        self.speculate_passes = cfg.test_play.speculate_passes

    def begin(self) -> None:
        """Start a test play: empty ``log_dir``."""
        empty_dir(self.log_dir)

    def play_units(self, first_nonce: int, count: int, mortal, dqn, device, *, log_dir=None,
                   name: str = 'mortal') -> dict:
        """Play the ``count`` duplicate deals from nonce ``first_nonce`` (key ``TEST_SEED[1]``), logs into
        ``log_dir`` (default: this test play's), the challenger named ``name``. Returns ``{nonce: [the challenger's
        4 ranks, 1-4]}`` of the deals without a failed game."""
        from mortal.play.arena import OneVsThree
        from mortal.play.duplicate import complete_challenger_units

        with _cudnn_benchmark_off(self.cudnn_benchmark):
            engine = _engine(mortal, dqn, self.chal_version, device, name=name)
            env = OneVsThree(disable_progress_bar=False, log_dir=log_dir or self.log_dir,
                             speculate_passes=self.speculate_passes)
            env.py_vs_py(challenger=engine, champion=self.baseline_engine, seed_start=(first_nonce, TEST_SEED[1]),
                         seed_count=count)
            return complete_challenger_units(env.last_games)  # deals with a failed game: dropped

    def stat(self):
        """``mortal.stat.Stat`` of the challenger over every log of this test play."""
        from mortal.stat import Stat
        return Stat.from_dir(self.log_dir, 'mortal')

    def test_play(self, seed_count: int, mortal, dqn, device):
        """Play ``seed_count`` duplicate sets (4 games each) and return the challenger's ``mortal.stat.Stat``."""
        self.begin()
        self.play_units(TEST_SEED[0], seed_count, mortal, dqn, device)
        return self.stat()


class TrainPlayer:
    """Plays the client's self-play rounds; ``env``: where TRAIN_PLAY_PROFILE comes from (``mortal.config.Env``
    or a mapping such as ``os.environ``). ``counterfactual``: the last round's branch counts."""

    def __init__(self, config: dict, env=os.environ, *, baseline_engine=None, train_key=None):
        from mortal.config import EnvOverrides, train_play_profile

        cfg = typed(config)
        self.baseline_slot = cfg.baseline.train
        self.baseline_mtime = _mtime(self.baseline_slot.state_file)
        self.baseline_engine = baseline_engine or load_baseline_engine(self.baseline_slot)
        self.epsilon_factor = 1.0  # from the trainer, with its parameters ([guard] epsilon_factor)
        self.temp_factor = 1.0
        env = EnvOverrides.of(env)  # a mapping is read once, here
        self.profile = profile = train_play_profile(config, env)  # boltzmann_*, top_p, repeats, counterfactual_*
        logger.info('using train-play profile %s', env.profile)
        self.chal_version = cfg.control.version
        self.cudnn_benchmark = cfg.control.enable_cudnn_benchmark
        self.speculate_passes = profile.speculate_passes
        self.counterfactual_rate = profile.counterfactual_rate
        self.counterfactual: dict = {}
        self.log_dir = path.abspath(profile.log_dir)
        self.train_key = secrets.randbits(64) if train_key is None else train_key
        self.train_seed = TRAIN_SEED_START
        self.seed_count = profile.games // 4
        self.repeat_counter = 0

    def set_factors(self, epsilon_factor: float, temp_factor: float) -> None:
        """The trainer's factors on this profile's ``boltzmann_epsilon`` (the product capped at 1) and
        ``boltzmann_temp``, used from the next round on."""
        self.epsilon_factor, self.temp_factor = float(epsilon_factor), float(temp_factor)

    def effective_exploration(self) -> tuple:
        """``(epsilon, temp)`` of the next round: the profile's values times the trainer's factors."""
        p = self.profile
        return min(1.0, p.boltzmann_epsilon * self.epsilon_factor), p.boltzmann_temp * self.temp_factor

    def reload_baseline(self) -> None:
        """Load ``[baseline.train] state_file`` again (after a rotation)."""
        mtime = _mtime(self.baseline_slot.state_file)
        self.baseline_engine = load_baseline_engine(self.baseline_slot)
        self.baseline_mtime = mtime

    def baseline_stale(self) -> bool:
        """Whether ``[baseline.train] state_file`` changed on disk since it was loaded."""
        return _mtime(self.baseline_slot.state_file) != self.baseline_mtime

    def next_seed(self) -> tuple:
        """The ``(nonce, key)`` of the next round, then advance the schedule (every ``repeats`` rounds)."""
        seed = (self.train_seed, self.train_key)
        self.repeat_counter += 1
        if self.repeat_counter == self.profile.repeats:
            self.train_seed += self.seed_count
            self.repeat_counter = 0
        return seed

    def train_play(self, mortal, dqn, device):
        """One round: ``games`` games. Returns (rankings (4,) int64 numpy: trainee's count of 1st..4th places,
        file_list: sorted paths of the gz logs written to ``log_dir``)."""
        from mortal.play.arena import OneVsThree

        epsilon, temp = self.effective_exploration()
        with _cudnn_benchmark_off(self.cudnn_benchmark):
            engine = _engine(mortal, dqn, self.chal_version, device, name='trainee', boltzmann_epsilon=epsilon,
                             boltzmann_temp=temp, top_p=self.profile.top_p)
            empty_dir(self.log_dir)
            seed = self.next_seed()
            # counterfactual draws: per round (the repeats of a seed draw anew), reproducible from the seed
            # the learner reads these logs once and deletes them: gzip level 1 (docs/performance.md, session 25)
            env = OneVsThree(disable_progress_bar=False, log_dir=self.log_dir, speculate_passes=self.speculate_passes,
                             log_compresslevel=1, counterfactual_rate=self.counterfactual_rate,
                             counterfactual_alternative=self.profile.counterfactual_alternative,
                             counterfactual_seed=hash((seed, self.repeat_counter)) & ((1 << 64) - 1))
            rankings = env.py_vs_py(challenger=engine, champion=self.baseline_engine, seed_start=seed,
                                    seed_count=self.seed_count)
            self.counterfactual = env.counterfactual
            if self.counterfactual_rate > 0:
                logger.info('counterfactual branches: %d forked, %d recorded, %d dropped, %d extra decisions',
                            *(env.counterfactual[k] for k in ('forked', 'recorded', 'dropped', 'scenes')))
            logs = sorted(path.join(self.log_dir, name) for name in os.listdir(self.log_dir))
            return np.asarray(rankings, dtype=np.int64), logs
