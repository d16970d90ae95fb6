"""Does a restructuring keep the learning path bit for bit? Two source trees, the same seeded work, digests compared.

For each tree (``--old DIR`` and ``--new DIR``, default this checkout), a fresh process with that tree first on
``sys.path`` runs, on CPU with one thread and fixed seeds:

* **loader**: ``GameplayLoader(3)`` on the real mjai logs of ``tests/data`` (obs, actions, masks, kyoku indices,
  dones, gamma flags of every seat);
* **offline epoch**: a tiny offline ``Trainer`` (16 channels, 1 block, batch 8, CQL on) trains one epoch on those
  logs through the whole data path (file index, ``FileDatasetsIter``, GRP rewards, batches, loss, AdamW);
* **online steps**: a tiny online ``Trainer`` (no CQL) takes ``--steps`` seeded random batches through
  ``train_batch``;
* **arena logs**: ``OneVsThree`` plays 8 hanchan between two seeded exploring engines (``HashEngine``: Q from a hash
  of the observation) with the agari guard and writes its logs; the
  digest covers the rankings and every log's decompressed text (``eval_time_ns``, a clock reading, set to 0). The
  logs' total gzip size is printed beside it (information: another compression level changes it, not the text).

Each part prints a SHA-256 of its tensors (model weights, optimizer state, loss sums); the two trees must agree on
every part. A part that one tree cannot run is reported as such. Run each tree twice (``--old . --new .``) to see
that the digests are reproducible at all on this machine.

Usage: ``python bench/refactor_equivalence.py --old /path/to/old/checkout [--new .] [--steps 20] [--dense-stem]``;
exit status 1 when a digest differs. Since the learner's first convolution runs from the observations' nonzeros on
the CPU (``StemConv``), its Mish from one exp (``networks.Mish``) and its AdamW fused, offline and online digests
differ from a tree without them in the float rounding only: ``--dense-stem`` runs both trees as on a GPU, where they
must agree.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

CHILD = r'''
import hashlib, json, os, random, shutil, sys
import numpy as np
import toml
import torch
if os.environ.get('DENSE_STEM'):  # --dense-stem: the first convolution as F.conv1d and Mish as F.mish, where the
    import mortal.model.networks   # tree has the CPU's sparse stem and one-exp Mish
    if hasattr(mortal.model.networks, '_stem'):
        mortal.model.networks._stem = None
    if hasattr(mortal.model.networks, 'Mish'):
        mortal.model.networks.Mish.forward = torch.nn.Mish.forward
    import mortal.learning.optimizer  # and torch's default AdamW, not the CPU's fused one
    if hasattr(mortal.learning.optimizer, '_fused'):
        mortal.learning.optimizer._fused = lambda groups: None

torch.set_num_threads(1)
data_dir, work, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])


def seed(n=0):
    random.seed(n)
    np.random.seed(n)
    torch.manual_seed(n)


def digest(*objs):
    h = hashlib.sha256()

    def feed(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f'{t.dtype}{list(t.shape)}'.encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, np.ndarray):
            feed(torch.from_numpy(np.ascontiguousarray(x)))
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                feed(v)
        else:
            h.update(repr(x).encode())
    for o in objs:
        feed(o)
    return h.hexdigest()


def mod(*names):
    """The first of ``names`` whose folder layout this tree has, newest layout first: ``mod('mortal.model.networks',
    'mortal.learning.model', 'mortal.model')`` answers the model package (``mortal/model/``), else the learning
    package of the first split (``mortal/learning/``), else the flat module of a tree from before any split. A name
    is taken when its parent package is a folder of the tree (the last name needs none). Decided by the tree's
    folders, not by trying: an editable install of another checkout would answer any name."""
    import importlib
    for name in names[:-1]:
        parent = name.rsplit('.', 1)[0]
        if os.path.isfile(os.path.join(TREE, *parent.split('.'), '__init__.py')):
            return importlib.import_module(name)
    return importlib.import_module(names[-1])


def tiny_config(root, online):
    from mortal.config import load_config
    cfg = toml.load(os.path.join(TREE, 'config.example.toml'))
    cfg['control'].update(version=3, online=online, state_file=f'{root}/mortal.pth', best_state_file=f'{root}/best.pth',
                          tensorboard_dir=f'{root}/tb', device='cpu', enable_cudnn_benchmark=False, enable_amp=False,
                          enable_compile=False, batch_size=8, opt_step_every=1, save_every=1000, test_every=1000,
                          submit_every=1000)
    cfg['train_play']['default'].update(games=4, log_dir=f'{root}/train_play')
    cfg['test_play'].update(games=4, log_dir=f'{root}/test_play')
    cfg['dataset'].update(globs=[f'{root}/dataset/*.json*'], file_index=f'{root}/file_index.pth', file_batch_size=2,
                          num_workers=0)
    cfg['env'].update(gamma=1, pts=[6.0, 4.0, 2.0, 0.0])
    cfg['resnet'].update(conv_channels=16, num_blocks=1)
    cfg['freeze_bn']['mortal'] = online
    cfg['optim'].update(max_grad_norm=1.0)
    cfg['optim']['scheduler'].update(peak=1e-3, final=1e-3)
    for slot in ('train', 'test'):
        cfg['baseline'][slot].update(device='cpu', state_file=f'{root}/baseline.pth')
    cfg['online']['remote'].update(host='127.0.0.1', port=1)
    cfg['online']['server'].update(buffer_dir=f'{root}/buffer', drain_dir=f'{root}/drain', capacity=4)
    cfg['grp']['state_file'] = f'{root}/grp.pth'
    cfg['grp']['network'].update(hidden_size=8, num_layers=1)
    os.makedirs(root, exist_ok=True)
    path = f'{root}/config.toml'
    with open(path, 'w') as f:
        toml.dump(cfg, f)
    return load_config(path)


class Writer:
    def __getattr__(self, name):
        return lambda *a, **k: None


class TestPlayer:
    log_dir = '/nonexistent'


def trainer_state(trainer):
    state = {'mortal': trainer.mortal.state_dict(), 'dqn': trainer.dqn.state_dict(),
             'aux': trainer.aux_net.state_dict(), 'steps': trainer.steps,
             'stats': {k: float(v) for k, v in trainer.stats.items()}}
    opt = trainer.optimizer.state_dict()['state']
    state['optimizer'] = {str(k): v for k, v in opt.items()}
    return state


TREE = os.environ['TREE']
out = {}
logs = sorted(os.path.join(data_dir, n) for n in os.listdir(data_dir) if n.endswith(('.jsonl', '.json.gz')))
try:
    GameplayLoader = mod('mortal.data.gameplay', 'mortal.gameplay').GameplayLoader
    games = GameplayLoader(3).load_gz_log_files(logs)
    out['loader'] = digest([[(g.player_id, g.obs, g.actions, g.masks, g.at_kyoku, g.dones, g.apply_gamma)
                             for g in game] for game in games])
except Exception as e:
    out['loader'] = f'cannot run: {type(e).__name__}: {e}'

try:
    from mortal import train as tr
    GRP = mod('mortal.model.networks', 'mortal.learning.model', 'mortal.model').GRP
    root = os.path.join(work, 'offline')
    config = tiny_config(root, online=False)
    os.makedirs(f'{root}/dataset')
    for p in logs:
        name = os.path.basename(p)
        shutil.copy(p, f'{root}/dataset/' + (name[:-1] if name.endswith('.jsonl') else name))
    seed(1)
    torch.save({'model': GRP(**config['grp']['network']).state_dict()}, config['grp']['state_file'])
    seed(2)
    trainer = tr.Trainer(config, test_player=TestPlayer(), writer=Writer())
    seed(3)
    batches = trainer.train_epoch()
    out['offline_epoch'] = digest(trainer_state(trainer)) + f' ({batches} batches)'
except Exception as e:
    out['offline_epoch'] = f'cannot run: {type(e).__name__}: {e}'

try:
    from mortal import train as tr
    wire = mod('mortal.net.wire', 'mortal.wire')
    config = tiny_config(os.path.join(work, 'online'), online=True)
    seed(4)
    trainer = tr.Trainer(config, test_player=TestPlayer(), writer=Writer(), remote=wire.Remote('127.0.0.1', 1),
                         sleep=lambda s: None)
    g = torch.Generator().manual_seed(5)
    obs_shape = mod('mortal.features.obs', 'mortal.obs').obs_shape
    channels = obs_shape(3)[0]
    for i in range(steps):
        n = 8
        obs = torch.rand((n, channels, 34), generator=g)
        masks = torch.rand((n, 46), generator=g) < 0.3
        actions = torch.randint(0, 46, (n,), generator=g)
        masks[torch.arange(n), actions] = True
        rewards = torch.randn((n,), generator=g, dtype=torch.float64)
        trainer.train_batch(obs, actions, masks, torch.arange(n), rewards, torch.arange(n) % 4)
    out['online_steps'] = digest(trainer_state(trainer)) + f' ({steps} steps)'
except Exception as e:
    out['online_steps'] = f'cannot run: {type(e).__name__}: {e}'


class HashEngine:
    """A deterministic engine for the arena digest: each row's decision is a function of the CRC-32 of its
    observation's bytes (so the digest pins the encoding): its legal actions' Q values in thousandths (exact in
    any float), and one row in five explores (is_greedy False) to a legal action the hash picks. Nothing depends
    on the order of the rows: the table's dict of asked seats comes in varying order, and a torch model's float
    results move with the batch's memory alignment (an untrained model's near ties then make other games)."""

    engine_type = 'mortal'
    is_oracle = False
    enable_quick_eval = True
    enable_rule_based_agari_guard = True

    def __init__(self, name, salt):
        import zlib
        self.name, self.version, self.crc, self.salt = name, 3, zlib.crc32, salt

    def react_batch(self, obs, masks, invisible_obs=None):
        acts, qs, ms, greedy = [], [], [], []
        for o, m in zip(obs, masks):
            m = np.asarray(m, dtype=bool)
            h = self.crc(np.ascontiguousarray(o, dtype=np.float32).tobytes(), self.salt)
            q = np.where(m, ((h * (np.arange(46) + 1)) % 1000) / 1000.0, -np.inf)
            explore = (h >> 8) % 5 == 0
            legal = np.flatnonzero(m)
            acts.append(int(legal[(h >> 16) % len(legal)]) if explore else int(np.argmax(q)))
            qs.append(q.tolist())
            ms.append(m.tolist())
            greedy.append(not explore)
        return acts, qs, ms, greedy


try:
    import gzip, re
    OneVsThree = mod('mortal.play.arena', 'mortal.arena').OneVsThree
    engines = [HashEngine('trainee', 7), HashEngine('baseline', 8)]
    log_dir = os.path.join(work, 'arena_logs')
    rankings = OneVsThree(disable_progress_bar=True, log_dir=log_dir).py_vs_py(
        engines[0], engines[1], seed_start=(11, 2024), seed_count=2)
    texts, raw = [], []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name), 'rb') as f:
            data = f.read()
        # eval_time_ns is a wall-clock reading: the one field two runs of the same games differ in
        texts.append((name, re.sub(rb'"eval_time_ns":\d+', b'"eval_time_ns":0', gzip.decompress(data))))
        raw.append(len(data))
    out['arena_logs'] = digest(rankings, texts) + f' ({len(texts)} logs, {sum(len(t) for _, t in texts)} bytes)'
    out['arena_gzip_bytes'] = f'{sum(raw)} bytes of gzip'
except Exception as e:
    out['arena_logs'] = f'cannot run: {type(e).__name__}: {e}'
print(json.dumps(out))
'''


def run_tree(tree: pathlib.Path, steps: int, dense_stem: bool = False) -> dict:
    """The digests of one tree's run (a fresh process; ``tree`` first on sys.path)."""
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, 'PYTHONPATH': str(tree), 'TREE': str(tree), 'OMP_NUM_THREADS': '1',
               **({'DENSE_STEM': '1'} if dense_stem else {})}
        env.pop('RUST_BACKTRACE', None)
        proc = subprocess.run([sys.executable, '-c', CHILD, str(ROOT / 'tests' / 'data'), work, str(steps)],
                              cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f'{tree}: the run failed (status {proc.returncode}):\n{proc.stderr[-3000:]}')
    return json.loads(lines[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--old', required=True, type=pathlib.Path, help='the source tree before the change')
    parser.add_argument('--new', default=ROOT, type=pathlib.Path, help='the source tree after the change')
    parser.add_argument('--steps', type=int, default=20, help='online train_batch steps')
    parser.add_argument('--dense-stem', action='store_true',
                        help="both trees' first convolution dense (F.conv1d): the sparse stem (mortal.model._stem) "
                             'changes only the order of float additions, so the digests differ with it on')
    args = parser.parse_args(argv)
    old, new = (run_tree(t.resolve(), args.steps, args.dense_stem) for t in (args.old, args.new))
    same = True
    for part in ('loader', 'offline_epoch', 'online_steps', 'arena_logs'):
        a, b = old.get(part), new.get(part)
        verdict = 'identical' if a == b and not str(a).startswith('cannot') else 'DIFFERENT'
        same &= verdict == 'identical'
        print(f'{part:14s} {verdict:9s} old {a}\n{"":24s} new {b}')
    print(f'arena gzip     old {old.get("arena_gzip_bytes")}, new {new.get("arena_gzip_bytes")}')
    return 0 if same else 1


if __name__ == '__main__':
    sys.exit(main())
