"""The learner's intake: an epoch's offline files, and a batch up to tensors on the trainer's device."""

import logging

import torch

from mortal.data.offline_data import build_file_list, load_player_names

logger = logging.getLogger('mortal.train')  # the trainer's lines (log format)


def offline_files(dataset_cfg, dist) -> tuple:
    """(file_list, player_names) of an offline epoch, built on rank 0 and sent to the others."""
    def offline():
        names = load_player_names(dataset_cfg.player_names_files)
        logger.info('loaded %s players', f'{len(names):,}')
        return build_file_list(dataset_cfg, names), sorted(names)
    return dist.from_main(offline)


def obs_on_device(obs, device, version: int, keep_packed: bool = False):
    """``obs`` as ``(B, C, 34)`` float32 on ``device``; packed uint8 rows are unpacked there, bit for bit, or with
    ``keep_packed`` (``networks.takes_packed``: the Brain's stem reads them) passed on as they are."""
    if obs.dtype == torch.uint8:
        if keep_packed:
            return obs.to(device)
        from mortal.features.packed_obs import unpack
        return unpack(obs.to(device, non_blocking=True), version)
    return obs.to(dtype=torch.float32, device=device)


def batch_on_device(batch: tuple, device, version: int, offline_stream=None, keep_packed: bool = False) -> tuple:
    """``(obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, (cf_actions, cf_deltas))`` on ``device``
    in the loss's dtypes, the offline-mix rows appended, absent counterfactuals -1/0; ValueError for a masked action.
    ``keep_packed``: packed observations stay packed (``obs_on_device``)."""
    obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions, cf_deltas = batch
    cf_actions, cf_deltas = _cf_columns(actions.shape[0], cf_actions, cf_deltas)
    if offline_stream is None:
        obs = obs_on_device(obs, device, version, keep_packed)
    else:
        extra_obs, *extra = next(offline_stream)
        # joined while packed: one unpack, no float copy; rows of another width (version) are unpacked apart
        # below, where unpack names the expected width
        if obs.dtype == extra_obs.dtype == torch.uint8 and obs.shape[1:] == extra_obs.shape[1:]:
            obs = obs_on_device(torch.cat((obs, extra_obs)), device, version, keep_packed)
        else:
            obs = torch.cat((obs_on_device(obs, device, version), obs_on_device(extra_obs, device, version)))
        extra = (*extra[:5], *_cf_columns(extra[0].shape[0], *(extra[5:7] if len(extra) >= 7 else ())))
        actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions, cf_deltas = (
            torch.cat((a, b.to(a.dtype))) for a, b in zip(
                (actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions, cf_deltas), extra))
    actions, masks = actions.to(torch.int64), masks.to(torch.bool)
    # checked where the loader left them (the host): on a GPU this check would wait for the device every step
    if not masks[torch.arange(actions.shape[0], device=masks.device), actions].all():
        raise ValueError('a training sample has an action outside its legal mask')
    actions, masks, steps_to_done, kyoku_rewards, player_ranks, cf_actions, cf_deltas = (
        t.to(device=device, dtype=dtype, non_blocking=True) for t, dtype in (
            (actions, torch.int64), (masks, torch.bool), (steps_to_done, torch.int64),
            (kyoku_rewards, torch.float64), (player_ranks, torch.int64), (cf_actions, torch.int64),
            (cf_deltas, torch.float32)))
    return obs, actions, masks, steps_to_done, kyoku_rewards, player_ranks, (cf_actions, cf_deltas)


def _cf_columns(n: int, cf_actions=None, cf_deltas=None) -> tuple:
    """``(cf_actions (n,) int64, cf_deltas (n,) float32)`` as tensors; -1 / 0 (no counterfactual) when None."""
    if cf_actions is None or cf_deltas is None:
        return torch.full((n,), -1, dtype=torch.int64), torch.zeros(n, dtype=torch.float32)
    return torch.as_tensor(cf_actions), torch.as_tensor(cf_deltas)
