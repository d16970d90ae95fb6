"""``MortalEngine``: batched Q-value inference plus Mortal's Boltzmann/top-p exploration (``mortal/engine.py``)."""

from __future__ import annotations

import numpy as np
import torch

from mortal.model import inference

ACTION_SPACE = 46


def _stacked(arrays):
    """``(N, ...)`` array of ``arrays``: an array as it is (no copy), else ``np.stack``."""
    return arrays if isinstance(arrays, np.ndarray) else np.stack(arrays)


def sample_top_p(logits: torch.Tensor, p: float,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """``(N,)`` int64: one draw per row of ``logits`` ``(N, A)`` from the softmax restricted to the top-``p``
    nucleus (``p >= 1``: all, ``p <= 0``: argmax); ``generator``: a torch RNG, None: the global one."""
    if p <= 0:
        return logits.argmax(-1)
    probs = logits.float().softmax(-1)
    if p >= 1:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    probs_sorted, order = probs.sort(-1, descending=True)
    mass_before = probs_sorted.cumsum(-1) - probs_sorted
    probs_sorted = probs_sorted.masked_fill(mass_before > p, 0.0)
    picked = torch.multinomial(probs_sorted, 1, generator=generator)
    return order.gather(-1, picked).squeeze(-1)


class MortalEngine:
    """Wraps a ``Brain`` and a ``DQN`` in eval mode on ``device`` for batched self-play inference.

    ``seed``: a private ``torch.Generator`` (None: the global RNG, as Mortal). ``frozen_cpu``: on CPU without AMP, use
    ``inference.FrozenQ`` (the same q-values up to float rounding). ``boltzmann_*`` and ``top_p`` as the config's
    ``[train_play.<profile>]`` (validated there)."""

    engine_type = "mortal"

    def __init__(self, brain, dqn, *, is_oracle=False, version, device=None,
                 stochastic_latent=False, enable_amp=False, enable_quick_eval=True,
                 enable_rule_based_agari_guard=False, name="NoName",
                 boltzmann_epsilon=0, boltzmann_temp=1, top_p=1, seed=None, frozen_cpu=True):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.brain = brain.to(self.device).eval()
        self.dqn = dqn.to(self.device).eval()
        self.is_oracle = is_oracle
        self.version = version
        self.stochastic_latent = stochastic_latent
        self.enable_amp = enable_amp
        self.enable_quick_eval = enable_quick_eval
        self.enable_rule_based_agari_guard = enable_rule_based_agari_guard
        self.name = name
        self.boltzmann_epsilon = boltzmann_epsilon
        self.boltzmann_temp = boltzmann_temp
        self.top_p = top_p
        # the frozen copy is CPU-only and float32: CUDA (and AMP) keep the modules' own forward
        self.frozen_cpu = bool(frozen_cpu and self.device.type == "cpu" and not enable_amp and not is_oracle
                               and inference.supports(self.brain, self.dqn))
        self._frozen = None
        self._frozen_key = None
        self._watched = inference.module_tensors(self.brain, self.dqn) if self.frozen_cpu else []
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(int(seed))

    def __repr__(self):
        return (f"MortalEngine(name={self.name!r}, version={self.version}, device={self.device}, "
                f"eps={self.boltzmann_epsilon}, temp={self.boltzmann_temp}, top_p={self.top_p})")

    def react_batch(self, obs, masks, invisible_obs=None):
        """One action per sample with one batched forward: ``obs`` N ``float32 (C, 34)``, ``masks`` N
        ``bool (46,)`` -> ``(actions, q_values, masks, is_greedy)``, lists of N. ValueError naming a bad sample."""
        return tuple(x.tolist() for x in self.react_arrays(obs, masks, invisible_obs))

    react_batch.lists_of_arrays = True  # the arena's agent calls react_arrays (mortal.play.agent._array_call)

    def react_arrays(self, obs, masks, invisible_obs=None):
        """``react_batch`` as numpy arrays: ``actions`` (N,) int64, ``q_values`` (N, 46) float32 (-inf where
        illegal), ``masks`` (N, 46) bool, ``is_greedy`` (N,) bool."""
        if len(obs) != len(masks):
            raise ValueError(f"react_batch: {len(obs)} observations but {len(masks)} masks")
        if len(obs) == 0:
            return (np.zeros(0, np.int64), np.zeros((0, ACTION_SPACE), np.float32),
                    np.zeros((0, ACTION_SPACE), bool), np.zeros(0, bool))
        masks_np = np.array(masks, dtype=bool)  # not np.stack: 3x slower on N small rows
        if masks_np.shape[1:] != (ACTION_SPACE,):
            raise ValueError(f"react_batch: masks must be (N, {ACTION_SPACE}), got {masks_np.shape}")
        empty = np.flatnonzero(~masks_np.any(axis=1))
        if empty.size:
            raise ValueError(f"react_batch: sample {int(empty[0])} has no legal action")
        # the copy holds eval-mode weights: modules switched back to train mode keep their own forward
        if self.frozen_cpu and invisible_obs is None and not (self.brain.training or self.dqn.training):
            frozen = self._frozen_model()
            with torch.inference_mode():
                mask_t = torch.from_numpy(masks_np)
                q = self._q_frozen(frozen, obs, mask_t)
                q = q.masked_fill(~mask_t, -torch.inf)
                actions, is_greedy = self._select(q, mask_t)
            return actions.numpy(), q.numpy(), masks_np, is_greedy.numpy()
        with torch.inference_mode(), torch.autocast(self.device.type, enabled=self.enable_amp):
            obs_t = torch.as_tensor(_stacked(obs), dtype=torch.float32, device=self.device)
            mask_t = torch.as_tensor(masks_np, device=self.device)
            inv_t = None
            if invisible_obs is not None:
                inv_t = torch.as_tensor(_stacked(invisible_obs), dtype=torch.float32,
                                        device=self.device)
            q = self._q_values(obs_t, mask_t, inv_t)
            # float32 for sampling and for the log; re-mask so the greedy argmax
            # and the reported values never depend on the DQN masking correctly.
            q = q.float().masked_fill(~mask_t, -torch.inf)
            actions, is_greedy = self._select(q, mask_t)
        return actions.cpu().numpy(), q.cpu().numpy(), masks_np, is_greedy.cpu().numpy()

    def _frozen_model(self):
        """The frozen copy, rebuilt when the weights were written since."""
        key = inference.weights_key(self._watched)
        if key != self._frozen_key:
            self._frozen = inference.FrozenQ(self.brain, self.dqn)
            self._frozen_key = key
        return self._frozen

    def _q_frozen(self, frozen, obs, masks):
        if self.version != 1:
            return frozen.q_values(obs, masks)
        mu, logsig = frozen.latent(obs)
        return self._latent_q(mu, logsig, frozen.q_from_features, masks)

    def _latent_q(self, mu, logsig, dqn, masks):
        """Version 1: ``dqn(latent, masks)`` with the latent ``mu``, or a draw around it (``stochastic_latent``)."""
        out = mu
        if self.stochastic_latent:
            # Normal.sample has no generator argument: draw the noise ourselves.
            std = logsig.exp() + 1e-6
            noise = torch.randn(mu.shape, generator=self.generator, device=mu.device, dtype=mu.dtype)
            out = mu + std * noise
        return dqn(out, masks)

    def _q_values(self, obs, masks, invisible_obs):
        out = self.brain(obs, invisible_obs) if invisible_obs is not None else self.brain(obs)
        if isinstance(out, tuple):  # version 1: (mu, logsig)
            return self._latent_q(*out, self.dqn, masks)
        return self.dqn(out, masks)

    def _select(self, q, masks):
        n = q.shape[0]
        greedy_actions = q.argmax(-1)
        if self.boltzmann_epsilon <= 0:
            return greedy_actions, torch.ones(n, dtype=torch.bool, device=q.device)
        keep_greedy = torch.full((n,), 1.0 - self.boltzmann_epsilon, device=q.device)
        is_greedy = torch.bernoulli(keep_greedy, generator=self.generator).bool()
        logits = (q / self.boltzmann_temp).masked_fill(~masks, -torch.inf)
        sampled = sample_top_p(logits, self.top_p, self.generator)
        return torch.where(is_greedy, greedy_actions, sampled), is_greedy

