"""The learner (Mortal's ``mortal/train.py``): ``Trainer.run`` -> ``train_epoch`` -> ``train_batch`` -> ``on_save``.

Offline: one epoch per run, with the CQL term, optionally under ``torchrun``. Online: the ``trainee`` seat only; after
a test play the learner exits 0 for its supervisor to start a fresh one, as Mortal. See docs/architecture.md."""

if __package__ in (None, ''):  # run as a script: python mortal/train.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import contextlib
import gc
import logging
import sys
import time
from datetime import datetime
from os import path

import torch

from mortal.net import wire
from mortal.model.checkpoint import (INITIAL_BEST_PERF, CheckpointError, atomic_torch_save, load_checkpoint,
                                     load_entries, load_frozen_pair)
from mortal.config import for_checkpoint, lookup, typed
from mortal.config_schema import Online
from mortal.data.offline_data import offline_mix
from mortal.learning import distributed, intake
from mortal.learning.diagnostics import Instruments, batch_q_stats, learner_probe
from mortal.learning.guards import INITIAL_GUARD, Diverged, Guards, check_finite, sync_baseline
from mortal.learning.loss import LossWeights, learner_loss
from mortal.learning.optimizer import build_optimizer, load_optimizer_state, optimizer_step
from mortal.learning.server_traffic import ServerTraffic, play_settings
from mortal.learning.supervisor import end_with_supervisor, exit_for_restart, is_supervised, supervise, wait_for_go

logger = logging.getLogger('mortal.train' if __name__ == '__main__' else __name__)


class TestPlayDone(Exception):
    """Online learner finished a test play: the child exits 0 and the supervisor starts a fresh one."""


MODEL_ENTRIES = ('mortal', 'current_dqn', 'aux_net')  # the checkpoint's entries of self.models, in order


def write_scalars(writer, steps: int, stats: dict, batches: int, *, loss_weights, offline_mix: bool, lr: float,
                  settings, instruments, trained, device, test_play: bool = False) -> None:
    """Write one save's TensorBoard scalars at ``steps`` and flush: ``loss/<name>`` means over ``batches``
    (terms that are off are not written), ``hparam/lr``, online the exploration factor, then the instruments (the
    probe too when a test play follows)."""
    n = max(batches, 1)
    on = {'cql_loss': loss_weights.with_cql, 'anchor_loss': loss_weights.anchor > 0,
          'offline_cql_loss': offline_mix, 'counterfactual_loss': loss_weights.counterfactual > 0}
    for name in stats:  # in Trainer.reset_stats' order
        if on.get(name, True):
            writer.add_scalar(f'loss/{name}', stats[name] / n, steps)
    writer.add_scalar('hparam/lr', lr, steps)
    if settings is not None:
        writer.add_scalar('hparam/epsilon_factor', settings['epsilon_factor'], steps)
    instruments.write(writer, steps, trained=trained, device=device, test_play=test_play)
    writer.flush()


def steps_to_next_test(steps: int, test_every: int, test_player, *, tested: bool = True):
    """Steps until the next test play; None when ``test_player`` never plays. At a multiple of ``test_every``: 0
    while that step's test play is to come (``tested`` False), else ``test_every``."""
    if not getattr(test_player, 'enabled', True):
        return None
    left = (test_every - steps % test_every) % test_every
    return test_every if left == 0 and tested else left


class Trainer:
    """One learner process. ``test_player``, ``remote``, ``writer`` default from the config; ``dist``:
    ``distributed.setup``'s rank, or None. Raises CheckpointError, UnsupportedVersionError, ValueError for version 1."""

    def __init__(self, config: dict, *, test_player=None, remote=None, writer=None, sleep=time.sleep, dist=None):
        from mortal.features.obs import check_version
        self.config = config
        self.cfg = cfg = typed(config)  # the typed sections, defaults from mortal/config_schema.py
        control = cfg.control
        self.version = check_version(control.version)
        if self.version == 1:
            raise ValueError('[control] version = 1 cannot be trained (as in Mortal): use version 2 or 3')
        self.online = control.online
        self.batch_size = control.batch_size
        self.opt_step_every = control.opt_step_every
        self.save_every = control.save_every
        self.test_every = control.test_every
        self.submit_every = control.submit_every
        self.state_file = control.state_file
        self.best_state_file = control.best_state_file
        self.enable_amp = control.enable_amp
        online_cfg = cfg.online if self.online and cfg.online is not None else Online.model_construct()
        # Extras (defaults = Mortal: no CQL online, no anchor); see mortal/learning/loss.py.
        self.loss_weights = LossWeights.resolve(
            online=self.online, min_q_weight=cfg.cql.min_q_weight, online_min_q_weight=cfg.cql.online_min_q_weight,
            anchor_weight=online_cfg.anchor_weight, next_rank_weight=cfg.aux.next_rank_weight,
            calibrated=cfg.cql.calibrated, counterfactual_weight=online_cfg.counterfactual_weight)
        self.gamma = cfg.env.gamma
        self.dist = dist = dist or distributed.SINGLE
        self.device = dist.device(control.device)
        torch.backends.cudnn.benchmark = control.enable_cudnn_benchmark
        self._build_models(cfg)

        self.grp = None  # the reward model, read by the first data_loader
        if test_player is None and dist.is_main:  # only rank 0 test-plays
            from mortal.play.player import TestPlayer
            test_player = TestPlayer(config)
        self.test_player = test_player
        self.writer = writer if writer is not None else dist.writer(control.tensorboard_dir)  # rank 0's is real
        if remote is None and self.online:
            remote = wire.Remote.from_config(cfg.online.remote, cfg.online.server)
        server = cfg.online.server if self.online else None  # this machine may run no server: no claim folder
        self.server = ServerTraffic(remote, state_file=self.state_file, sleep=sleep, writer=self.writer,
                                    dataset_cfg=cfg.dataset, version=self.version,
                                    drain_dir=server.drain_dir if server is not None else None)
        self.guards = Guards(self)  # test play, best.pth, rollback (mortal/learning/guards.py)
        self.reset_stats()
        self.anchor = None  # the frozen (brain, dqn) of [baseline.train] state_file
        if self.loss_weights.anchor > 0:
            baseline_file = cfg.baseline.train.state_file
            self.anchor = load_frozen_pair(baseline_file, self.version, self.device, 'the anchor')
            logger.info('anchor: %s, weight %g', baseline_file, self.loss_weights.anchor)
        self.instruments = Instruments(save_every=self.save_every, batch_size=self.batch_size, device=self.device,
                                       probe=self._load_probe() if self.online else None)
        self.offline_stream = None
        if online_cfg.offline_batch_size > 0:  # one worker beside the online loader's (0 keeps it in this process)
            def offline_loader(files, names, size):
                return self.data_loader(files, names, batch_size=size, num_workers=min(cfg.dataset.num_workers, 1))
            self.offline_stream = offline_mix(cfg.dataset, online_cfg.offline_batch_size, offline_loader)
        self.pb = None

    def _build_models(self, cfg) -> None:
        """Networks, optimizer, scheduler and GradScaler, resumed from ``[control] state_file`` when it exists."""
        from mortal.model.networks import AuxNet, Brain, DQN, parameter_count, takes_packed
        from mortal.features.obs import obs_shape

        resnet = cfg.resnet
        self.mortal = Brain(version=self.version, conv_channels=resnet.conv_channels,
                            num_blocks=resnet.num_blocks).to(self.device)
        self.dqn = DQN(version=self.version).to(self.device)
        self.aux_net = AuxNet((4,)).to(self.device)
        self.models = (self.mortal, self.dqn, self.aux_net)
        if cfg.control.enable_compile:
            for m in self.models:
                m.compile()
        logger.info('version: %d, obs shape: %s', self.version, obs_shape(self.version))
        logger.info('mortal params: %s, dqn params: %s, aux params: %s', f'{parameter_count(self.mortal):,}',
                    f'{parameter_count(self.dqn):,}', f'{parameter_count(self.aux_net):,}')
        self.mortal.freeze_bn(cfg.freeze_bn.mortal)
        # packed rows straight into the stem's kernel on the CPU: no 4-byte-an-element float copy (performance.md)
        self.keep_packed = takes_packed(self.device, amp=self.enable_amp, compiled=cfg.control.enable_compile)

        self.optimizer, self.scheduler = build_optimizer(self.models, cfg.optim)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.enable_amp)
        self.best_perf = dict(INITIAL_BEST_PERF)
        self.guard = dict(INITIAL_GUARD)
        self.steps = 0
        self.testing = False  # inside the test play of this step (a restart resumes after it, as Mortal)
        self.saved_steps = None  # the step of state_file as this learner last loaded or wrote it (None: none)
        if path.exists(self.state_file):
            self._resume(cfg)
        else:
            logger.info('no checkpoint at %s: starting from scratch', self.state_file)
        self.scheduler.multiplier = lambda: self.guard['lr_scale']  # the rollbacks' factor ([guard] lr_factor)
        self.scheduler.refresh()
        self.optimizer.zero_grad(set_to_none=True)
        self.nets = self.dist.wrap(self.models)  # what trains: the models, or their DDP wrappers under torchrun

    def _resume(self, cfg) -> None:
        """Load ``state_file`` (Mortal's keys, the guard); online from an offline one, a fresh optimizer (Mortal)."""
        state_file = self.state_file
        state = load_checkpoint(state_file, map_location=self.device)
        steps = load_entries(dict(zip(MODEL_ENTRIES, self.models)), state, state_file, cfg=cfg)
        ckpt_online = bool(lookup(state.get('config'), 'control.online'))  # the checkpoint's plain dict, of any writer
        if 'optimizer' not in state or 'scheduler' not in state:
            logger.info('%s has no optimizer/scheduler state (a bare model checkpoint): starting them fresh',
                        state_file)
        elif not self.online or ckpt_online:
            load_optimizer_state(self.optimizer, state['optimizer'])
            self.scheduler.load_state_dict(state['scheduler'])
        else:
            logger.info('offline checkpoint in online mode: optimizer and scheduler start fresh from the config')
        if self.scaler.is_enabled() and state.get('scaler'):
            self.scaler.load_state_dict(state['scaler'])
        self.steps = self.saved_steps = steps
        self.best_perf = dict(state.get('best_perf', INITIAL_BEST_PERF))
        self.guard = {**INITIAL_GUARD, **state.get('guard', {})}
        when = datetime.fromtimestamp(state.get('timestamp', 0)).strftime('%Y-%m-%d %H:%M:%S')
        logger.info('loaded %s (saved %s, steps %d)', state_file, when, self.steps)

    def run(self) -> None:
        """Online: idle parameters, then epochs until a test play ends the process (or a stop); offline: one epoch."""
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

    def train_epoch(self) -> int:
        """One pass over this epoch's files (online, recorded in the claim ledger); returns the batches trained."""
        from mortal.data.dataloader import iter_full_batches
        if self.online:  # the claimed logs of the trainee seat
            file_list, player_names = self.server.online_files(self.steps, self.resubmit)
            ledger = self.server.ledger
        else:
            file_list, player_names = intake.offline_files(self.cfg.dataset, self.dist)
            ledger = None
        logger.info('file list size: %s', f'{len(file_list):,}')
        if self.dist.size > 1:
            file_list = distributed.shard_files(file_list, self.dist.rank, self.dist.size)
            logger.info('%d processes: %s files and a batch of %d each', self.dist.size, f'{len(file_list):,}',
                        self.batch_size)
        self.log_total_steps()
        self.pb = self._progress_bar()
        batches = 0
        loader = self.data_loader(file_list, player_names, ledger=ledger)
        if ledger is not None:
            ledger.begin_epoch(loader.dataset.files)
        on_drop = None if ledger is None else lambda rest: ledger.note_dropped(rest[-1])  # the ids: last tensor
        loader_iter = iter(loader)
        try:
            for batch in self.dist.batches(iter_full_batches(loader_iter, self.batch_size, on_drop=on_drop)):
                if ledger is not None:  # recorded first: a checkpoint this step writes holds the batch
                    *batch, ids = batch
                    ledger.record(ids)
                self.train_batch(*batch)
                batches += 1
        finally:
            # No loader worker may still read this epoch's files when the next drain replaces them.
            shutdown = getattr(loader_iter, '_shutdown_workers', None)
            if shutdown is not None:
                shutdown()
            del loader_iter
            self._close_bar()
        self.dist.sync_buffers(self.models)  # every rank ends with rank 0's BatchNorm statistics
        if self.online:
            dropped = ledger.end_epoch()
            if dropped:
                logger.warning('%d samples of claimed logs were lost before they could be trained', dropped)
            if self.server.epoch_drained:
                self.writer.add_scalar('data/samples_per_drain', batches * self.batch_size, self.steps)
            self.writer.add_scalar('data/samples_dropped', dropped, self.steps)
            self.submit_param(is_idle=True)
        return batches

    def train_batch(self, obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions=None,
                    cf_deltas=None) -> None:
        """One backward pass; an optimizer step every ``opt_step_every`` steps; submit/save/test when due.

        obs (B, C, 34) float32 or packed (B, row_bytes) uint8, actions (B,) int64, masks (B, 46) bool, steps_to_done
        (B,) int64, kyoku_rewards (B,) float64, player_ranks (B,) int64; cf_actions (B,) int64 (-1: none) and
        cf_deltas (B,) float32 (pts), or None. Raises ValueError for a masked action; TestPlayDone after a test play."""
        n = obs.shape[0]  # online (or, offline, all) rows
        obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf = intake.batch_on_device(
            (obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions, cf_deltas), self.device,
            self.version, self.offline_stream, self.keep_packed)
        q_target = (self.gamma ** steps_to_done * kyoku_rewards).to(torch.float32)  # Mortal's Monte-Carlo G
        brain, dqn, aux_net = self.nets
        syncs = (self.steps + 1) % self.opt_step_every == 0  # ranks average gradients on the updating step only
        with self.dist.no_sync(self.nets, syncs):  # forward and backward: DDP decides at the forward
            with torch.autocast(self.device.type, enabled=self.enable_amp):
                phi = brain(obs)
                q_out = dqn(phi, masks)
                q_ref = None
                if self.anchor is not None:
                    with torch.no_grad():
                        q_ref = self.anchor[1](self.anchor[0](obs[:n]), masks[:n])
                next_rank_logits, = aux_net(phi)
                terms = learner_loss(q_out, next_rank_logits, actions, q_target, player_ranks, masks=masks,
                                     online_rows=n, weights=self.loss_weights, q_ref=q_ref,
                                     cf_actions=cf[0], cf_deltas=cf[1])
            self.scaler.scale(terms.total / self.opt_step_every).backward()
        self._account(terms, q_out, masks, actions, q_target, n)

        self.steps += 1
        if self.steps % self.opt_step_every == 0:
            optimizer_step(self.optimizer, self.scaler, self.cfg.optim.max_grad_norm)
        self.scheduler.step()
        if self.pb is not None:
            self.pb.update(1)
        if self.online and self.steps % self.submit_every == 0:
            self.submit_param(is_idle=False)
        if self.steps % self.save_every == 0:
            self.on_save()

    def _account(self, terms, q_out, masks, actions, q_target, n: int) -> None:
        """Add the batch's loss terms and instruments on the device (no host sync per step); read at the save."""
        with torch.no_grad():
            self.stat_batches += 1
            for k, total in self._stat_sums.items():  # float64 as Python's floats were; a term that is off stays 0
                term = getattr(terms, k)
                if term is not None:
                    total += term.detach().to(total.device)
            if self.dist.is_main:
                q_stats = batch_q_stats(q_out[:n], masks[:n], actions[:n], q_target[:n])
                self.instruments.add(q_stats, terms.q[:n], q_target[:n], q_out.shape[0])

    def on_save(self) -> None:
        """Every ``save_every`` steps: TensorBoard, checkpoint, a missed submit, test play when due (rank 0); online
        a test play ends with TestPlayDone, unless ``[online] restart_after_test_play`` is false."""
        stats = self.dist.average(self.stats)
        if not self.dist.is_main:
            self.reset_stats()
            return
        self._close_bar()
        self._check_finite()
        write_scalars(
            self.writer, self.steps, stats, self.stat_batches, loss_weights=self.loss_weights,
            offline_mix=self.offline_stream is not None, lr=self.scheduler.get_last_lr()[0],
            settings=self.play_settings() if self.online else None, instruments=self.instruments,
            trained=self.models, device=self.device, test_play=self.steps % self.test_every == 0)
        self.reset_stats()
        self.log_total_steps(tested=False)

        self.save()
        if self.online and self.steps % self.submit_every != 0:
            self.submit_param(is_idle=False)
        if self.steps % self.test_every == 0:
            self.testing = True  # stays True if a stop lands inside it: the stop's summary says so
            self.guards.test_play()
            self.testing = False
            if self.online and self.cfg.online.restart_after_test_play:
                raise TestPlayDone()
        self.pb = self._progress_bar()

    def reset_stats(self) -> None:
        """Zero the loss sums averaged into TensorBoard at each save, and their count of batches."""
        self.stat_batches = 0  # batches summed into stats: the divisor of the means (a resumed window is short)
        dev = self.device if self.device.type != 'mps' else torch.device('cpu')  # mps has no float64
        self._stat_sums = {k: torch.zeros((), dtype=torch.float64, device=dev) for k in (  # loss/<name>, in order
            'dqn_loss', 'cql_loss', 'anchor_loss', 'offline_cql_loss', 'next_rank_loss', 'counterfactual_loss')}

    @property
    def stats(self) -> dict:
        """The loss sums since the last save, ``{name: float}`` (read from the device)."""
        return dict(zip(self._stat_sums, torch.stack(tuple(self._stat_sums.values())).tolist()))

    def log_total_steps(self, tested: bool = True) -> None:
        """Mortal's ``total steps: N (~steps to the next test play)`` line (no countdown when none is to come)."""
        to_test = steps_to_next_test(self.steps, self.test_every, self.test_player, tested=tested)
        if to_test is None:
            logger.info('total steps: %s', f'{self.steps:,}')
        else:
            logger.info('total steps: %s (~%s)', f'{self.steps:,}', f'{to_test:,}')

    def _progress_bar(self):
        """Mortal's ``TRAIN`` bar of this save cycle (rank 0, else None); off when stderr is a file (redraws pile up)."""
        if not self.dist.is_main:
            return None
        from tqdm.auto import tqdm
        return tqdm(total=self.save_every, desc='TRAIN', initial=self.steps % self.save_every, unit='batch',
                    dynamic_ncols=True, ascii=True, disable=None)

    def _close_bar(self) -> None:
        if self.pb is not None:
            self.pb.close()
            self.pb = None

    def data_loader(self, file_list, player_names, ledger=None, *, batch_size=None, num_workers=None):
        """``learner_loader`` of this learner (defaults: ``[control] batch_size``, ``[dataset] num_workers``)."""
        from mortal.data.dataloader import learner_loader  # here: the supervisor process needs no loader
        from mortal.data.reward import load_grp
        if self.grp is None and self.cfg.env.reward == 'grp':  # read once per learner, at its first epoch
            self.grp = load_grp(self.cfg.grp.state_file, self.cfg.grp.network)
        return learner_loader(self.cfg, self.version, file_list, player_names, ledger,
                              batch_size=batch_size or self.batch_size, num_workers=num_workers,
                              pin_memory=self.device.type == 'cuda', grp=self.grp)

    def play_settings(self) -> dict:
        """The play settings sent with the parameters at this step (``server_traffic.play_settings``)."""
        return play_settings(self.steps, self.guard)

    def _check_finite(self) -> None:
        """``guards.check_finite`` of the trained models: before a save and before a submit."""
        check_finite(dict(zip(MODEL_ENTRIES, self.models)), self.steps, self.saved_steps, self.state_file)

    def submit_param(self, is_idle: bool = False) -> None:
        """Send the played weights (``played``) with the play settings to the server (``ServerTraffic.submit``)."""
        self._check_finite()
        mortal, dqn = self.played()
        self.server.submit(mortal, dqn, is_idle=is_idle, settings=self.play_settings())

    def sync_baseline(self) -> None:
        """Submit ``[baseline.train] state_file`` to the server for the clients (``guards.sync_baseline``)."""
        sync_baseline(self)

    def resubmit(self) -> None:
        """To a server found without parameters (it restarted): the baseline, then the parameters as idle."""
        self.sync_baseline()
        self.submit_param(is_idle=True)

    def played(self) -> tuple:
        """The (mortal, dqn) that self-play, test play and best.pth use."""
        return self.mortal, self.dqn

    def save(self) -> None:
        """Write the checkpoint atomically: Mortal's keys (no token in ``config``); online ``guard``, the ledger."""
        def write():
            state = {'mortal': self.mortal.state_dict(), 'current_dqn': self.dqn.state_dict(),
                     'aux_net': self.aux_net.state_dict(), 'optimizer': self.optimizer.state_dict(),
                     'scheduler': self.scheduler.state_dict(), 'scaler': self.scaler.state_dict(),
                     'steps': self.steps, 'timestamp': datetime.now().timestamp(),
                     'best_perf': dict(self.best_perf), 'config': for_checkpoint(self.config)}
            if self.online:  # the long-run guards' state (mortal/learning/guards.py), after Mortal's keys
                state['guard'] = dict(self.guard)
            atomic_torch_save(state, self.state_file)
        from mortal.entry import stops_deferred
        with stops_deferred():  # a stop lands after the write, not inside torch's zip writer
            if self.server.ledger is None:  # offline, or online before the first drain
                write()
            else:
                self.server.ledger.commit_with(self.steps, write)
            self.saved_steps = self.steps

    def stop_summary(self) -> str:
        """What this learner, stopped now, keeps and discards (its last line)."""
        if self.saved_steps is None:
            kept = f'the {self.steps:,} steps trained discarded (no checkpoint written yet)'
        elif self.saved_steps == self.steps:
            kept = f'nothing discarded ({self.state_file} holds step {self.steps:,})'
        else:
            kept = (f'the {self.steps - self.saved_steps:,} steps since the last save discarded '
                    f'({self.state_file} keeps step {self.saved_steps:,})')
        if self.online:
            kept += '; claimed logs not yet trained are kept for the next learner'
        if self.testing:  # a restart does not repeat it, as Mortal
            kept += f'; the test play of step {self.steps:,} cut short (next: step {self.steps + self.test_every:,})'
        return kept

    def _load_probe(self):
        """``diagnostics.learner_probe`` against the baseline; None when it cannot be built (logged)."""
        try:
            return learner_probe(self.cfg, self.version, self.state_file, self.device, baseline=self.anchor)
        except Exception as ex:  # an instrument must never stop training
            logger.warning('policy-drift probe disabled: %s: %s', type(ex).__name__, ex)
            return None


STATE_FIX = ('give this run its own [control] state_file (and, online, its own server: [online.remote] port, '
             '[online.server] buffer_dir and drain_dir)')
RESUME_FIX = ': the learner cannot resume from it; restore it (a copy of [control] best_state_file is a sound start)'


def run_learner(config: dict, dist=None) -> int:
    """The learner under the lock of ``[control] state_file`` (rank 0); -> 0 after a test play, 128 + signal."""
    from mortal import entry
    from mortal.util import runlock
    dist = dist or distributed.SINGLE
    lock = (runlock.hold(typed(config).control.state_file, who='learner', key='[control] state_file', fix=STATE_FIX)
            if dist.is_main else contextlib.nullcontext())
    with lock:
        try:
            trainer = Trainer(config, dist=dist)
        except CheckpointError as exc:  # one line, not a traceback: the file is left as it is
            return entry.error(f'{exc}{RESUME_FIX if exc.source == typed(config).control.state_file else ""}')
        try:
            trainer.run()
        except TestPlayDone:
            logger.info('test play done: exiting so that the supervisor restarts the learner')
        except Diverged as exc:  # one line; a supervisor stops on the status instead of restarting into it
            return entry.error(exc, status=1)
        except KeyboardInterrupt as exc:  # also SIGTERM (entry.stop_on_sigterm)
            logger.info('stopped on %s at step %s; %s', entry.stop_cause(exc), f'{trainer.steps:,}',
                        trainer.stop_summary())
            return entry.stop_status(exc, 130)
        finally:
            trainer._close_bar()  # a stop between two saves leaves the bar open
            trainer.writer.close()
    return 0


def missing_inputs(config: dict, config_path: str) -> list[str]:
    """One error per input file the learner of the loaded ``config`` needs but lacks (``learner_input_errors``)."""
    from mortal.config_paths import learner_input_errors
    return learner_input_errors(typed(config), config_path)


def warm_up() -> None:
    """Load what a learner loads before its first step, and start its loaders' fork server: in a learner that the
    supervisor started early, this runs during the restart delay instead of after it (docs/performance.md)."""
    import torch._dynamo  # noqa: F401  torch.optim imports it at the optimizer's first param group (about 1 s)
    from torch.utils import tensorboard  # noqa: F401
    from mortal.data import dataloader, reward  # noqa: F401
    from mortal.model import networks  # noqa: F401
    from mortal.play import player  # noqa: F401
    dataloader.start_fork_server()


def main(argv=None):
    """Entry point: ``python mortal/train.py`` (config from MORTAL_CFG or ``--config``)."""
    if not wait_for_go(warm_up):  # the supervisor stopped during its restart delay: this learner never started
        sys.exit(0)
    from mortal import entry
    from mortal.config import ConfigError, resolve_path, train_sections
    argv = list(sys.argv[1:] if argv is None else argv)
    args = entry.start(entry.parser(__doc__.splitlines()[0]), argv)
    config = entry.load_config_or_exit(args, train_sections)  # online: [online] and [online.remote] too
    entry.check_devices(config, entry.TRAIN_DEVICES)
    control = typed(config).control
    online = control.online
    dist = distributed.SINGLE
    try:
        if not online:  # torchrun: join the other ranks (mortal.learning.distributed); alone: nothing changes
            dist = distributed.setup(control.device)
        elif distributed.world_size() > 1:
            sys.exit(entry.error('online training runs as one learner: start it without torchrun (more '
                                 'than one process, WORLD_SIZE > 1, is for offline training only)'))
    except (ConfigError, ValueError) as exc:
        sys.exit(entry.error(exc))
    config_path = resolve_path(args.config, args.overrides)
    missing = missing_inputs(config, config_path)
    if missing:  # not a traceback at the first test play (a supervised restart waits for the fix instead)
        dist.close()
        sys.exit(entry.error(ConfigError(config_path, missing)))
    from mortal.util import runlock
    try:
        if not online or is_supervised():
            entry.stop_on_sigterm()
            if online:
                end_with_supervisor()  # out of the terminal's session: end with the supervisor
            entry.log_settings(logger, config, 'learner', args.config, args.overrides)
            code = run_learner(config, dist)
        else:
            holder = runlock.holder_if_held(control.state_file)  # refused at once, not at the child's start
            if holder is not None:
                raise runlock.LockHeld(f'another learner runs on [control] state_file = {control.state_file}: '
                                       f'{holder} holds its lock; stop it, or {STATE_FIX}')
            code = supervise(argv, script=path.abspath(__file__), required=train_sections, env=args.overrides,
                             config_path=config_path, inputs=missing_inputs, early_start=True)
    except runlock.LockHeld as exc:
        code = entry.error(exc)
    except KeyboardInterrupt as exc:  # before the learner ran (run_learner says its own)
        logger.info('stopped on %s while starting', entry.stop_cause(exc))
        code = entry.stop_status(exc, 130)
    finally:
        dist.close()
    if code == 0 and online and is_supervised():  # a test play ended it: the supervisor starts the next one
        exit_for_restart()
    sys.exit(code)


if __name__ == '__main__':
    main()
