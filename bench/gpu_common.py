"""What the parts of ``bench/gpu.py`` share: the paths, the config and models a part runs on, JSON records written
as they grow, CUDA memory peaks, and the row counter that measures and time-boxes a play."""

import json
import os
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
GPU_SCRIPT = ROOT / 'bench' / 'gpu.py'  # the driver, also the entry of the parts' worker processes
GIB = 2**30
FIXTURE_LOGS = 'tests/data/*.json*'  # real public mjai hanchan (tests/data/README.md)


class TimeBoxOver(Exception):
    """Raised inside a play when its hard time limit has passed."""


def write_json(path, data):
    """Write ``data`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False))
    os.replace(tmp, path)


def read_json(path):
    """The JSON record at ``path``, or None while it is missing or half written."""
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None


def cuda_peak(device):
    """``{'allocated': bytes, 'reserved': bytes}`` peaks since the last reset on a CUDA ``device``, else both None."""
    import torch
    if torch.device(device).type != 'cuda':
        return {'allocated': None, 'reserved': None}
    return {'allocated': int(torch.cuda.max_memory_allocated(device)),
            'reserved': int(torch.cuda.max_memory_reserved(device))}


def cuda_reset(device):
    import gc
    import torch
    gc.collect()
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def write_config(work, *, sizes, device, version, games, port=None, enable_amp=None, clients=1, trainer=False):
    """``config_online.toml`` with every path under ``work``, the given device/version/sizes; returns its path.

    ``trainer``: save/submit/test every 10**6 steps (the trainer part times bare ``train_batch`` calls)."""
    import toml
    from mortal.tools.quickstart_config import free_port

    work = pathlib.Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cfg = toml.load(ROOT / 'config_online.toml')
    w = lambda name: str(work / name)  # noqa: E731
    c = cfg['control']
    c.update(version=version, state_file=w('online/mortal.pth'), best_state_file=w('online/best.pth'),
             tensorboard_dir=w('tb'), device=device)
    if device == 'cpu':
        c.update(enable_cudnn_benchmark=False, enable_amp=False)
    if enable_amp is not None:
        c['enable_amp'] = enable_amp
    if trainer:
        c.update(save_every=10**6, submit_every=10**6, test_every=10**6)
    cfg['train_play']['default'].update(games=games, log_dir=w('train_play'))
    cfg['test_play'].update(games=sizes['test_games'], log_dir=w('test_play'))
    cfg['dataset'].update(globs=[str(ROOT / FIXTURE_LOGS)], file_index=w('file_index.pth'),
                          num_workers=sizes['num_workers'])
    cfg['resnet'].update(conv_channels=sizes['channels'], num_blocks=sizes['blocks'])
    for slot in ('train', 'test'):
        cfg['baseline'][slot].update(device=device, state_file=w('online/baseline.pth'))
    cfg['online']['remote']['port'] = port or free_port()
    cfg['online']['server'].update(buffer_dir=w('online/buffer'), drain_dir=w('online/drain'),
                                   capacity=max(cfg['online']['server']['capacity'], 2 * clients * games))
    cfg['grp']['state_file'] = w('grp.pth')
    path = work / 'config.toml'
    path.write_text(toml.dumps(cfg))
    return path


def write_models(config):
    """Freshly initialised (seed 0) trainee = baseline checkpoints with Mortal's keys, and a GRP (seed 0)."""
    import torch
    from mortal.model.networks import GRP, AuxNet, Brain, DQN

    torch.manual_seed(0)
    v, r = config['control']['version'], config['resnet']
    state = {'mortal': Brain(version=v, conv_channels=r['conv_channels'], num_blocks=r['num_blocks']).state_dict(),
             'current_dqn': DQN(version=v).state_dict(), 'aux_net': AuxNet((4,)).state_dict(),
             'config': config, 'steps': 0}
    for key in ('state_file',):
        pathlib.Path(config['control'][key]).parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, config['control'][key])
    torch.save(state, config['baseline']['train']['state_file'])
    torch.manual_seed(0)
    torch.save({'model': GRP(**config['grp']['network']).state_dict()}, config['grp']['state_file'])


def load(path):
    """The config at ``path``, checked as the processes load it, without environment overrides."""
    from mortal.config import load_config
    return load_config(path, env={})


class RowCounter:
    """Counts the rows of every ``MortalEngine.react_batch`` of this process and stops a play past ``hard``."""

    def __init__(self):
        from mortal.play.engine import MortalEngine
        self.rows = self.calls = 0
        self.hard = float('inf')
        self.min_calls = 0  # calls to let through before ``hard`` counts (a test play's first forwards hold the peak)
        # the engine's own method, also when an earlier counter of this process has wrapped it
        orig = MortalEngine.__dict__.get('_unwrapped_react_batch', MortalEngine.react_batch)
        MortalEngine._unwrapped_react_batch = orig
        counter = self

        def react_batch(engine, obs, masks, invisible_obs=None):
            if time.monotonic() > counter.hard and counter.calls >= counter.min_calls:
                raise TimeBoxOver()
            counter.rows += len(obs)
            counter.calls += 1
            return orig(engine, obs, masks, invisible_obs)

        MortalEngine.react_batch = react_batch

