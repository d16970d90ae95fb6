"""The learner's intake: what each epoch of a ``Trainer`` trains on, up to tensors on the trainer's device.

``Intake`` is a part of ``mortal.train.Trainer`` (a mixin, as ``mortal.learning.server_traffic``, which drains and
claims the online logs). An epoch's files are the offline ``[dataset]`` (``mortal.data.offline_data``; rank 0's
list under torchrun) or, online, the claimed logs (``ServerTraffic.online_files``); the loader over them is
``mortal.data.dataloader.learner_loader``; each batch is moved to the device (packed observations unpacked there,
``mortal.data.packed_obs``), with the rows of the offline mix appended (``[online] offline_batch_size``); online, the
claim ledger (``mortal.data.claims``) records every trained batch and is committed in one step with each checkpoint.
"""

import logging

import torch

from mortal.data.offline_data import build_file_list, load_player_names

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)


class Intake:
    """The trainer's intake methods. The host (``mortal.train.Trainer``) provides ``config`` (and ``cfg``, its typed
    sections), ``version``, ``online``, ``device``, ``dist``, ``batch_size``, ``save_every``, ``steps``,
    ``offline_stream``, ``server`` (``ServerTraffic``), ``resubmit()`` and ``train_batch()``."""

    def file_list(self):
        """(file_list, player_names) of this epoch: claimed logs + ['trainee'] online, the dataset offline.

        Online, the first epoch of a learner finishes the claimed logs a previous one left (``mortal.data.claims``;
        the claim folder is found from ``[online.server] drain_dir``) without draining; later epochs drain and
        train the new logs together with what earlier epochs left over.
        """
        if self.online:
            return self.server.online_files(self.steps, self.resubmit)  # mortal.learning.server_traffic

        def offline():  # rank 0's, sent to the others under torchrun: one process writes the file index
            names = load_player_names(self.cfg.dataset.player_names_files)
            logger.info('loaded %s players', f'{len(names):,}')
            return build_file_list(self.cfg.dataset, names), sorted(names)
        return self.dist.from_main(offline)

    def data_loader(self, file_list, player_names, ledger=None, *, batch_size=None, num_workers=None):
        """``mortal.data.dataloader.learner_loader`` of this learner; ``batch_size`` defaults to ``[control]
        batch_size``, ``num_workers`` to ``[dataset] num_workers``."""
        from mortal.data.dataloader import learner_loader  # here: the supervisor process needs no loader
        return learner_loader(self.config, self.version, file_list, player_names, ledger,
                              batch_size=batch_size or self.batch_size, num_workers=num_workers,
                              pin_memory=self.device.type == 'cuda')

    def _obs_on_device(self, obs):
        """``obs`` as ``(B, C, 34)`` float32 on the trainer's device: packed rows (uint8, the loader's batches) are
        moved packed and unpacked there (``mortal.data.packed_obs.unpack``, bit for bit); float ones are moved."""
        if obs.dtype == torch.uint8:
            from mortal.data.packed_obs import unpack
            return unpack(obs.to(self.device, non_blocking=True), self.version)
        return obs.to(dtype=torch.float32, device=self.device)

    def _batch_on_device(self, obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions=None,
                         cf_deltas=None) -> tuple:
        """The tensors of ``train_batch`` on the device in the dtypes of the loss, with the rows of the offline mix
        appended (``offline_stream``, when there is one): ``(obs, actions, masks, steps_to_done, kyoku_rewards,
        player_ranks, (cf_actions, cf_deltas))``, the counterfactual columns ``(B,)`` int64 / float32 filled with
        -1 / 0 where a batch has none (offline batches and callers without them). Raises ValueError when an action
        is masked out."""
        dev = self.device
        obs = self._obs_on_device(obs)
        cf_actions, cf_deltas = _cf_columns(actions.shape[0], cf_actions, cf_deltas)
        if self.offline_stream is not None:
            extra_obs, *extra = next(self.offline_stream)
            obs = torch.cat((obs, self._obs_on_device(extra_obs)))
            extra = (*extra[:5], *_cf_columns(extra[0].shape[0], *(extra[5:7] if len(extra) >= 7 else ())))
            actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions, cf_deltas = (
                torch.cat((a, b.to(a.dtype))) for a, b in zip(
                    (actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions, cf_deltas), extra))
        actions = actions.to(dtype=torch.int64, device=dev)
        masks = masks.to(dtype=torch.bool, device=dev)
        steps_to_done = steps_to_done.to(dtype=torch.int64, device=dev)
        kyoku_rewards = kyoku_rewards.to(dtype=torch.float64, device=dev)
        player_ranks = player_ranks.to(dtype=torch.int64, device=dev)
        cf_actions = cf_actions.to(dtype=torch.int64, device=dev)
        cf_deltas = cf_deltas.to(dtype=torch.float32, device=dev)
        rows = torch.arange(obs.shape[0], device=dev)
        if not masks[rows, actions].all():
            raise ValueError('a training sample has an action outside its legal mask')
        return obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, (cf_actions, cf_deltas)

    def _train_tracked(self, batch, ledger) -> None:
        """``train_batch`` on a batch whose last tensor holds the sample ids, recorded in ``ledger``
        (``_train_committed``)."""
        *data, ids = batch
        self._train_committed(data, ledger, ids)

    def _train_committed(self, data, ledger, ids=None) -> None:
        """``train_batch(*data)``, its sample ``ids`` (if any) recorded in ``ledger`` first: a checkpoint that
        ``train_batch`` writes (a save, the test play's) holds this batch, and commits the ledger in the same step
        (``Trainer.save``)."""
        if ledger is not None and ids is not None:
            ledger.record(ids)
        self.train_batch(*data)


def _cf_columns(n: int, cf_actions=None, cf_deltas=None) -> tuple:
    """``(cf_actions (n,) int64, cf_deltas (n,) float32)`` as tensors; -1 / 0 (no counterfactual) when None."""
    if cf_actions is None or cf_deltas is None:
        return torch.full((n,), -1, dtype=torch.int64), torch.zeros(n, dtype=torch.float32)
    return torch.as_tensor(cf_actions), torch.as_tensor(cf_deltas)
