"""The learner (Mortal's ``mortal/train.py``), online and offline.

``Trainer`` is the learner's loop; ``main()`` its entry point. Each other concern has a module of its own, named
below where it enters.

Online (``[control] online = true``): ``main()`` runs the supervisor (``mortal.learning.supervisor``), which starts the
learner as a child process and restarts it 3 s after each exit with status 0. The learner submits its parameters
to the server as idle, drains replays (polling every 5 s) and claims them into its own folder (``mortal.data.claims``),
learns from the ``trainee`` seat only, submits parameters every ``submit_every`` steps (and at a save that missed a
submit), saves every ``save_every`` steps, and every ``test_every`` steps runs a test play
(``mortal.learning.guards``) and exits 0 (Mortal restarts the learner there to dodge a hang). It submits idle
parameters at the end of every drained epoch; a restarted learner first finishes the claimed logs its predecessor
left, and an epoch's leftover samples are trained with the next drain.

Offline (``online = false``): the logs of ``[dataset]`` (``mortal.data.offline_data``), one epoch per run, with the CQL
term. ``torchrun --nproc_per_node K mortal/train.py`` trains offline on K processes, each on its share of the files,
gradients averaged, rank 0 saving and logging (``mortal.learning.distributed``); online refuses more than one.

Per batch: the loss of ``mortal.learning.loss.learner_loss`` (Mortal's ``0.5 * MSE(q[action], gamma ** steps_to_done *
kyoku_reward) + next_rank_weight * CE`` ``+ min_q_weight * CQL`` offline). AdamW with weight decay on
Linear/Conv1d weights only, gradient accumulation over ``opt_step_every`` batches (keyed on the global step),
clipping at ``max_grad_norm`` after unscaling, GradScaler + autocast with ``enable_amp``, Mortal's linear warm-up +
cosine learning rate (``mortal.learning.schedule``) stepped every batch, BatchNorm frozen per ``[freeze_bn] mortal``.

Checkpoints (``mortal.learning.learner_checkpoint``) carry Mortal's keys (``mortal.model.checkpoint.CHECKPOINT_KEYS``)
and are written to a temporary file then renamed, so a kill at any moment leaves the previous checkpoint intact. The
server traffic (parameters out, drained logs in) is ``mortal.learning.server_traffic``.

TensorBoard: Mortal's tags (``loss/dqn_loss``, ``loss/cql_loss`` offline, ``loss/next_rank_loss``, ``hparam/lr``,
histograms ``q_predicted``/``q_target``, the ``test_play/*`` groups) plus the instruments (``diag/*``,
``mortal.learning.diagnostics``) and data-health tags (online): ``data/logs_per_drain``, ``data/samples_per_drain``,
``data/staleness_mean``/``data/staleness_max`` (parameter versions between the one a log was played with and the
trainer's latest), ``data/wait_seconds`` (learner time spent waiting for a drain), ``data/samples_dropped``
(samples of claimed logs lost untrained; 0 expected).

Extras, all off by default (Mortal): ``[cql] online_min_q_weight``/``calibrated``, ``[online] anchor_weight``,
``ema_decay`` and ``offline_batch_size`` (offline rows of ``[dataset]`` mixed into each online batch, RLPD-style,
with ``loss/offline_cql_loss``); see ``docs/learning.md``.
"""

if __package__ in (None, ''):  # run as a script: python mortal/train.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parent.parent)

import gc
import logging
import sys
import time
from os import path

import torch
from torch import nn  # noqa: F401  (tests reach torch.nn through this module)

from mortal.net import wire
# INITIAL_BEST_PERF, atomic_torch_save: also this module's API (used through it)
from mortal.model.checkpoint import (INITIAL_BEST_PERF, CheckpointError, atomic_torch_save,  # noqa: F401
                                     load_frozen_pair, load_model_pair)
from mortal.config import typed
from mortal.config_schema import Online
from mortal.learning.diagnostics import Instruments, batch_q_stats, learner_probe
from mortal.learning import distributed
from mortal.learning.guards import INITIAL_GUARD, Guards
from mortal.learning.learner_checkpoint import LearnerCheckpoint
from mortal.learning.loss import LossWeights, learner_loss
from mortal.data.offline_data import build_file_list, load_player_names, offline_mix
from mortal.learning.optimizer import build_optimizer, ema_copies, ema_update, optimizer_step
from mortal.learning.schedule import schedule_factor
from mortal.learning.server_traffic import DRAIN_POLL_INTERVAL, ServerTraffic  # noqa: F401  (also this module's API)
from mortal.learning.supervisor import end_with_supervisor, is_supervised, supervise

logger = logging.getLogger('mortal.train' if __name__ == '__main__' else __name__)


class TestPlayDone(Exception):
    """Online learner finished a test play: the child exits 0 and the supervisor starts a fresh one."""


class Trainer(LearnerCheckpoint, ServerTraffic):
    """One learner process: models, optimizer, checkpoint, TensorBoard, server traffic. The checkpoint methods
    (``load_state``, ``checkpoint``, ``save``, ``played``) come from ``mortal.learning.learner_checkpoint``, the
    server's (``submit_param``, ``play_settings``, ``sync_baseline``, ``claims``, ``drain``) from
    ``mortal.learning.server_traffic``; the path batch -> loss -> gradient step is here.

    Args:
        config: the full config dict (``load_config``).
        test_player: object with ``test_play(seed_count, mortal, dqn, device) -> Stat``; built from
            ``[baseline.test]`` when None.
        remote: ``wire.Remote`` of the server (online), from ``[online.remote]`` when None.
        writer: a SummaryWriter-like object; ``SummaryWriter([control] tensorboard_dir)`` when None.
        sleep: the sleep function (tests replace it).
        dist: ``mortal.learning.distributed.setup``'s rank (offline under torchrun); one process when None.
    Raises mortal.model.checkpoint.CheckpointError (a checkpoint that cannot be loaded or does not fit the config),
    UnsupportedVersionError, ValueError for version 1 (Mortal's trainer neither supports it: its phi is a latent
    pair).
    """

    def __init__(self, config: dict, *, test_player=None, remote=None, writer=None, sleep=time.sleep, dist=None):
        from mortal.model.networks import AuxNet, Brain, DQN, parameter_count
        from mortal.features.obs import check_version, obs_shape

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
        self.schedules = {name: getattr(cfg.schedule, name).model_dump() for name in ('lr', 'epsilon', 'temp')}
        online_cfg = cfg.online if self.online and cfg.online is not None else Online.model_construct()
        cql = cfg.cql
        # Extras (defaults = Mortal: no CQL online, no anchor); see mortal/learning/loss.py.
        self.online_min_q_weight = cql.online_min_q_weight
        self.anchor_weight = online_cfg.anchor_weight
        self.loss_weights = LossWeights.resolve(
            online=self.online, min_q_weight=cql.min_q_weight, online_min_q_weight=self.online_min_q_weight,
            anchor_weight=self.anchor_weight, next_rank_weight=cfg.aux.next_rank_weight, calibrated=cql.calibrated)
        # RLPD-style mix: offline samples of [dataset] appended to each online batch (0 = off, Mortal)
        self.offline_batch_size = online_cfg.offline_batch_size
        self.gamma = cfg.env.gamma
        self.max_grad_norm = cfg.optim.max_grad_norm
        self.sleep = sleep
        self.dist = dist = dist or distributed.SINGLE
        self.device = dist.device(control.device)
        torch.backends.cudnn.benchmark = control.enable_cudnn_benchmark

        resnet = cfg.resnet
        self.mortal = Brain(version=self.version, conv_channels=resnet.conv_channels,
                            num_blocks=resnet.num_blocks, dropout=resnet.dropout).to(self.device)
        self.dqn = DQN(version=self.version).to(self.device)
        self.aux_net = AuxNet((4,)).to(self.device)
        self.models = (self.mortal, self.dqn, self.aux_net)
        if control.enable_compile:
            for m in self.models:
                m.compile()
        logger.info('version: %d, obs shape: %s', self.version, obs_shape(self.version))
        logger.info('mortal params: %s, dqn params: %s, aux params: %s', f'{parameter_count(self.mortal):,}',
                    f'{parameter_count(self.dqn):,}', f'{parameter_count(self.aux_net):,}')
        self.mortal.freeze_bn(cfg.freeze_bn.mortal)

        self.optimizer, self.scheduler = build_optimizer(self.models, config['optim'])
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.enable_amp)
        self.best_perf = dict(INITIAL_BEST_PERF)
        self.guard = dict(INITIAL_GUARD)
        self.steps = 0
        self._loaded_ema = None
        self.load_state()
        self.scheduler.multiplier = lambda: (schedule_factor(self.schedules['lr'], self.steps)
                                             * self.guard['lr_scale'])
        self.scheduler.refresh()
        # Extra: an EMA of the weights is what gets published, test-played and kept as best.pth (0 = off, Mortal).
        self.ema_decay = online_cfg.ema_decay
        self.ema = None
        if self.ema_decay > 0:  # from the checkpoint's ema_mortal/ema_dqn when it has them
            self.ema = ema_copies((self.mortal, self.dqn), self._loaded_ema)
            logger.info('EMA of the weights, decay %g (%s)', self.ema_decay,
                        'resumed' if self._loaded_ema is not None else 'from the loaded weights')
        self.optimizer.zero_grad(set_to_none=True)
        self.nets = dist.wrap(self.models)  # what trains: the models, or their DDP wrappers under torchrun

        if test_player is None and dist.is_main:  # only rank 0 test-plays
            from mortal.play.player import TestPlayer
            test_player = TestPlayer(config)
        self.test_player = test_player
        self.guards = Guards(self)  # test play, best.pth, rollback, rotation, baseline sync (mortal/learning/guards.py)
        self.remote = remote if remote is not None or not self.online else wire.Remote.from_config(config)
        self.writer = writer if writer is not None else dist.writer(control.tensorboard_dir)  # rank 0's is real
        self.reset_stats()
        self.anchor = self._load_anchor() if self.anchor_weight > 0 else None
        self.instruments = Instruments(save_every=self.save_every, batch_size=self.batch_size, device=self.device,
                                       probe=self._load_probe() if self.online else None)
        self.offline_stream = None
        if self.offline_batch_size > 0:  # loaded in this process, beside the online loader's workers
            def offline_loader(files, names, size):
                return self.data_loader(files, names, batch_size=size, num_workers=0)
            self.offline_stream = offline_mix(config['dataset'], self.offline_batch_size, offline_loader)
        self.pb = None
        self.lost_logs = 0  # drained logs that vanished before the learner claimed them
        self.resubmitted_to = set()  # server_ids of instances found without parameters (each resubmitted to once)
        self.ledger = None  # online: mortal.data.claims.ClaimLedger of the claim folder (opened by claims())
        self.resumed = False  # online: the claimed logs a previous learner left have been looked at

    # -- reference models and instruments ------------------------------------------------------------------

    def _baseline_file(self) -> str:
        return self.config['baseline']['train']['state_file']

    def _load_anchor(self):
        """The frozen (brain, dqn) of ``[baseline.train] state_file`` that ``anchor_term`` pulls towards.
        Raises FileNotFoundError, CheckpointError (also for a baseline of another feature version)."""
        pair = load_frozen_pair(self._baseline_file(), self.version, self.device, 'the anchor')
        logger.info('anchor: %s, weight %g', self._baseline_file(), self.anchor_weight)
        return pair

    def _load_probe(self):
        """``mortal.learning.diagnostics.learner_probe`` against the anchor's baseline (loaded when there is no anchor);
        None when it cannot be built (logged, never fatal)."""
        try:
            return learner_probe(self.config, self.version, self.state_file, self.device, baseline=self.anchor)
        except Exception as ex:  # an instrument must never stop training
            logger.warning('policy-drift probe disabled: %s: %s', type(ex).__name__, ex)
            return None

    # -- learning --------------------------------------------------------------------------------------------

    def reset_stats(self) -> None:
        """Zero the loss sums averaged into TensorBoard at each save."""
        self.stats = {'dqn_loss': 0.0, 'cql_loss': 0.0, 'anchor_loss': 0.0, 'offline_cql_loss': 0.0,
                      'next_rank_loss': 0.0}

    def train_batch(self, obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks) -> None:
        """One backward pass on a batch; optimizer step every ``opt_step_every`` global steps; submit/save/test.

        obs (B, C, 34) float32, or the loader's packed rows (B, row_bytes) uint8 (``mortal.data.packed_obs``,
        unpacked on the device), actions (B,) int64, masks (B, 46) bool, steps_to_done (B,) int64,
        kyoku_rewards (B,) float64, player_ranks (B,) int64 in 0..3, B = batch_size.
        With ``[online] offline_batch_size`` = O > 0, O offline rows from ``offline_stream`` are appended; the
        loss (``mortal.learning.loss.learner_loss``) treats them as offline-mix rows, and the instruments see the B
        online rows only.
        Raises ValueError when an action is masked out; TestPlayDone (online) after a test play.
        """
        dev = self.device
        n = obs.shape[0]  # online (or, offline, all) rows
        obs = self._obs_on_device(obs)
        if self.offline_stream is not None:
            extra_obs, *extra = next(self.offline_stream)
            obs = torch.cat((obs, self._obs_on_device(extra_obs)))
            actions, masks, steps_to_done, kyoku_rewards, player_ranks = (
                torch.cat((a, b.to(a.dtype))) for a, b in zip(
                    (actions, masks, steps_to_done, kyoku_rewards, player_ranks), extra))
        actions = actions.to(dtype=torch.int64, device=dev)
        masks = masks.to(dtype=torch.bool, device=dev)
        steps_to_done = steps_to_done.to(dtype=torch.int64, device=dev)
        kyoku_rewards = kyoku_rewards.to(dtype=torch.float64, device=dev)
        player_ranks = player_ranks.to(dtype=torch.int64, device=dev)
        rows = torch.arange(obs.shape[0], device=dev)
        if not masks[rows, actions].all():
            raise ValueError('a training sample has an action outside its legal mask')

        q_target = (self.gamma ** steps_to_done * kyoku_rewards).to(torch.float32)  # Mortal's Monte-Carlo G
        brain, dqn, aux_net = self.nets
        syncs = (self.steps + 1) % self.opt_step_every == 0  # ranks average gradients on the updating step only
        with self.dist.no_sync(self.nets, syncs):  # forward and backward: DDP decides at the forward
            with torch.autocast(dev.type, enabled=self.enable_amp):
                phi = brain(obs)
                q_out = dqn(phi, masks)
                q_ref = None
                if self.anchor is not None:
                    with torch.no_grad():
                        q_ref = self.anchor[1](self.anchor[0](obs[:n]), masks[:n])
                next_rank_logits, = aux_net(phi)
                terms = learner_loss(q_out, next_rank_logits, actions, q_target, player_ranks, masks=masks,
                                     online_rows=n, weights=self.loss_weights, q_ref=q_ref)
            self.scaler.scale(terms.total / self.opt_step_every).backward()

        with torch.no_grad():
            for name in self.stats:
                term = getattr(terms, name)
                if term is not None:  # a term that is off stays 0
                    self.stats[name] += term.item()
            if self.dist.is_main:
                self.instruments.add(batch_q_stats(q_out[:n], masks[:n], actions[:n], q_target[:n]),
                                     terms.q[:n], q_target[:n])

        self.steps += 1
        if self.steps % self.opt_step_every == 0:
            optimizer_step(self.optimizer, self.scaler, self.max_grad_norm)
            if self.ema is not None:
                ema_update(self.ema, (self.mortal, self.dqn), self.ema_decay)
        self.scheduler.step()
        if self.pb is not None:
            self.pb.update(1)

        if self.online and self.steps % self.submit_every == 0:
            self.submit_param(is_idle=False)
        if self.steps % self.save_every == 0:
            self.on_save()

    def _obs_on_device(self, obs):
        """``obs`` as ``(B, C, 34)`` float32 on the trainer's device: packed rows (uint8, the loader's batches) are
        moved packed and unpacked there (``mortal.data.packed_obs.unpack``, bit for bit); float ones are moved."""
        if obs.dtype == torch.uint8:
            from mortal.data.packed_obs import unpack
            return unpack(obs.to(self.device, non_blocking=True), self.version)
        return obs.to(dtype=torch.float32, device=self.device)

    def on_save(self) -> None:
        """Every ``save_every`` steps: TensorBoard, checkpoint, a missed submit, and test play when due (rank 0;
        the loss means are those of all ranks)."""
        self.stats = self.dist.average(self.stats)
        if not self.dist.is_main:
            self.reset_stats()
            return
        if self.pb is not None:
            self.pb.close()
            self.pb = None
        n = self.save_every
        w = self.writer
        on = {'cql_loss': self.loss_weights.with_cql, 'anchor_loss': self.anchor is not None,
              'offline_cql_loss': self.offline_stream is not None}
        for name in self.stats:  # in reset_stats' order; a term that is off is not written
            if on.get(name, True):
                w.add_scalar(f'loss/{name}', self.stats[name] / n, self.steps)
        w.add_scalar('hparam/lr', self.scheduler.get_last_lr()[0], self.steps)
        if self.online:
            settings = self.play_settings()
            w.add_scalar('hparam/epsilon_factor', settings['epsilon_factor'], self.steps)
            w.add_scalar('hparam/temp_factor', settings['temp_factor'], self.steps)
        self.instruments.write(w, self.steps, trained=self.models, ema=self.ema, device=self.device)
        w.flush()
        self.reset_stats()
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
        """Test play, best.pth and (online) the long-run guards (``mortal.learning.guards.Guards.test_play``);
        online, then TestPlayDone: the learner exits and its supervisor starts a fresh one."""
        self.guards.test_play()
        if self.online:
            raise TestPlayDone()

    def _progress_bar(self):
        if not self.dist.is_main:
            return None
        from tqdm.auto import tqdm
        return tqdm(total=self.save_every, desc='TRAIN', initial=self.steps % self.save_every, unit='batch',
                    dynamic_ncols=True, ascii=True)

    def file_list(self):
        """(file_list, player_names) of this epoch: claimed logs + ['trainee'] online, the dataset offline.

        Online, the first epoch of a learner finishes the claimed logs a previous one left (``mortal.data.claims``;
        the claim folder is found from ``[online.server] drain_dir``) without draining; later epochs drain and
        train the new logs together with what earlier epochs left over.
        """
        if self.online:
            return self.online_files()  # mortal.learning.server_traffic

        def offline():  # rank 0's, sent to the others under torchrun: one process writes the file index
            names = load_player_names(self.config['dataset']['player_names_files'])
            logger.info('loaded %s players', f'{len(names):,}')
            return build_file_list(self.config['dataset'], names), sorted(names)
        return self.dist.from_main(offline)

    def data_loader(self, file_list, player_names, ledger=None, *, batch_size=None, num_workers=None):
        """``mortal.data.dataloader.learner_loader`` of this learner; ``batch_size`` defaults to ``[control]
        batch_size``, ``num_workers`` to ``[dataset] num_workers``."""
        from mortal.data.dataloader import learner_loader  # here: the supervisor process needs no loader
        return learner_loader(self.config, self.version, file_list, player_names, ledger,
                              batch_size=batch_size or self.batch_size, num_workers=num_workers,
                              pin_memory=self.device.type == 'cuda')

    def train_epoch(self) -> int:
        """One pass over this epoch's files; returns the number of batches trained.

        Online, the ledger (``mortal.data.claims``) records every trained batch and is committed at each checkpoint
        and at the test play that ends the learner; samples the epoch leaves over stay claimed for the next.
        ``data/samples_dropped`` counts the claimed samples lost nonetheless (0 in a healthy run)."""
        from mortal.data.dataloader import iter_full_batches
        file_list, player_names = self.file_list()
        ledger = self.ledger if self.online else None
        logger.info('file list size: %s', f'{len(file_list):,}')
        if self.dist.size > 1:
            file_list = self.dist.shard(file_list)
            logger.info('%d processes: %s files and a batch of %d each', self.dist.size, f'{len(file_list):,}',
                        self.batch_size)
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
            for batch in self.dist.batches(iter_full_batches(loader_iter, self.batch_size, on_drop=on_drop)):
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
        self.dist.sync_buffers(self.models)  # every rank ends with rank 0's BatchNorm statistics
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


def run_learner(config: dict, dist=None) -> int:
    """The learner process body (``dist``: as ``Trainer``'s); returns its exit status (0 after an online test
    play)."""
    trainer = Trainer(config, dist=dist)
    try:
        trainer.run()
    except TestPlayDone:
        logger.info('test play done: exiting so that the supervisor restarts the learner')
    finally:
        trainer.writer.close()
    return 0


def main(argv=None):
    """Entry point: ``python mortal/train.py`` (config from MORTAL_CFG or ``--config``)."""
    from mortal import entry
    from mortal.config import ONLINE_TRAIN_SECTIONS, TRAIN_SECTIONS, ConfigError, require
    argv = list(sys.argv[1:] if argv is None else argv)
    args = entry.start(entry.parser(__doc__.splitlines()[0]), argv)
    config = entry.load_config_or_exit(args, TRAIN_SECTIONS)
    online = config['control']['online']
    dist = distributed.SINGLE
    try:
        if online:
            if distributed.requested():
                sys.exit(entry.error('online training runs as one learner: start it without torchrun (more '
                                     'than one process, WORLD_SIZE > 1, is for offline training only)'))
            require(config, *ONLINE_TRAIN_SECTIONS, path=args.config, env=args.overrides)
        else:  # torchrun: join the other ranks (mortal.learning.distributed); alone: nothing changes
            dist = distributed.setup(config['control']['device'])
    except (ConfigError, ValueError) as exc:
        sys.exit(entry.error(exc))
    try:
        if not online or is_supervised():
            if online:
                end_with_supervisor()  # out of the terminal's session: end with the supervisor
            code = run_learner(config, dist)
        else:
            code = supervise(argv, script=path.abspath(__file__))
    except KeyboardInterrupt:
        code = 130
    finally:
        dist.close()
    sys.exit(code)


if __name__ == '__main__':
    main()
