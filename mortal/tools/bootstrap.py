"""Bootstrap a model without Mortal's weights:
``python -m mortal.tools.bootstrap {gen-logs,train-grp,train-offline,prepare,all}`` (each step resumable)."""

if __package__ in (None, ''):  # run as a script: python mortal/tools/bootstrap.py
    import sys, pathlib
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[2])

import logging
import os
import re
import sys
import time
from pathlib import Path

from mortal.config import ConfigError, grp_steps_problem, lookup, put, typed
from mortal.tools.bootstrap_layout import BootstrapError, bootstrap_config, offline_paths, train_glob, val_logs
from mortal.tools.offline_epochs import train_offline
from mortal.tools.rulebase_games import gen_logs
from mortal.util.fsutil import atomic_copy, atomic_write_bytes

logger = logging.getLogger(__name__)

STEPS = ('gen-logs', 'train-grp', 'train-offline', 'prepare')


def _grp_config(config, boot):
    """The typed ``[grp]`` the bootstrap trains: the config's, on the bootstrap's train and val logs."""
    grp = typed(config).grp
    dataset = grp.dataset.model_copy(update={'train_globs': [train_glob(boot)],
                                             'val_globs': [os.path.join(boot.log_dir, 'val', '*.json.gz')]})
    return grp.model_copy(update={'dataset': dataset})


def _grp_steps_done(state_file):
    from mortal.model.checkpoint import load_checkpoint
    if not os.path.exists(state_file):
        return 0, False
    state = load_checkpoint(state_file)
    return int(state.get('steps', 0)), bool((state.get('early_stopping') or {}).get('stopped'))


def train_grp(config, *, progress=True):
    """Step 2: the GRP to ``[bootstrap] grp_steps`` (resumed, early stopping); returns the steps."""
    from mortal import train_grp as tg
    boot = bootstrap_config(config)
    grp = _grp_config(config, boot)
    target = boot.grp_steps
    problem = grp_steps_problem(target, grp.control.save_every)
    if problem:
        raise BootstrapError(f'[bootstrap] grp_steps = {target} {problem}')
    done, stopped = _grp_steps_done(grp.state_file)
    if done >= target or stopped:
        logger.info('train-grp: %s already at step %d%s, skipped', grp.state_file, done,
                    ' (stopped early)' if stopped else f' >= {target}')
        return done
    os.makedirs(os.path.dirname(os.path.abspath(grp.state_file)), exist_ok=True)
    start = time.monotonic()
    steps = tg.train(grp, max_steps=target, num_workers=0, progress=progress, patience=boot.grp_patience)
    logger.info('train-grp: %d steps in %.0f s -> %s', steps, time.monotonic() - start, grp.state_file)
    return steps


def check_grp(config, config_path=None):
    """The online reward, ``'grp'`` when the GRP's val cross entropy beats uniform's (ln 24), else ``'points'``;
    set in ``config`` and ``config_path``. Returns ``{'reward', 'ce', 'uniform', 'val_games'}``."""
    from mortal.data.reward import load_grp
    from mortal.train_grp import UNIFORM_CE, load_samples, mean_ce
    boot = bootstrap_config(config)
    cfg = typed(config)
    configured = cfg.env.reward
    files = val_logs(boot)
    grp_file = cfg.grp.state_file
    samples = load_samples(files) if files and os.path.exists(grp_file) else []
    ce = mean_ce(load_grp(grp_file, cfg.grp.network), samples) if samples else None
    if ce is None:
        reward = configured
        logger.warning('train-grp: no GRP or no validation logs to check it on (%s, %d val logs): the kyoku '
                       "reward stays [env] reward = '%s'", grp_file, len(files), reward)
    elif configured == 'points':
        reward = 'points'
        logger.info("train-grp: [env] reward = 'points' set in the config (GRP validation cross entropy %.4f, "
                    'uniform ln 24 = %.4f, %d val games)', ce, UNIFORM_CE, len(files))
    elif ce >= UNIFORM_CE:
        reward = 'points'
        logger.warning("train-grp: GRP not handed on: its validation cross entropy %.4f is not below uniform's "
                       "ln 24 = %.4f on %d val games; the kyoku reward falls back to [env] reward = 'points' "
                       '(score change, mortal.data.reward)', ce, UNIFORM_CE, len(files))
    else:
        reward = 'grp'
        logger.info("train-grp: kyoku reward [env] reward = 'grp': GRP validation cross entropy %.4f < uniform "
                    'ln 24 = %.4f on %d val games', ce, UNIFORM_CE, len(files))
    put(config, 'env.reward', reward)
    if config_path:
        write_reward(config_path, reward)
    return {'reward': reward, 'ce': ce, 'uniform': UNIFORM_CE, 'val_games': len(files)}


_TABLE_HEADER = re.compile(r'^\s*\[')
_ENV_HEADER = re.compile(r'^\s*\[\s*env\s*\]\s*(#.*)?$')
_REWARD_LINE = re.compile(r'^\s*reward\s*=')


def write_reward(path, reward):
    """Set ``[env] reward`` in the TOML file ``path``; whether it changed. BootstrapError if it would not read back."""
    from mortal.config import tomllib
    text = Path(path).read_text(encoding='utf-8')
    if lookup(tomllib.loads(text), 'env.reward') == reward:
        return False
    lines = text.splitlines(keepends=True)
    line = f"reward = '{reward}'  # written by mortal.tools.bootstrap (check_grp)\n"
    header = next((i for i, x in enumerate(lines) if _ENV_HEADER.match(x)), None)
    if header is None:
        lines.append(('\n' if text and not text.endswith('\n\n') else '') + '[env]\n' + line)
    else:
        end = next((j for j in range(header + 1, len(lines)) if _TABLE_HEADER.match(lines[j])), len(lines))
        at = next((j for j in range(header + 1, end) if _REWARD_LINE.match(lines[j])), None)
        if at is None:
            lines.insert(header + 1, line)
        else:
            lines[at] = line
    new = ''.join(lines)
    try:
        ok = lookup(tomllib.loads(new), 'env.reward') == reward
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        raise BootstrapError(f"cannot write [env] reward = '{reward}' into {path}: set it there by hand")
    atomic_write_bytes(new.encode('utf-8'), path)
    logger.info("wrote [env] reward = '%s' into %s", reward, path)
    return True


def prepare(config, *, force=False):
    """Step 4: ``best.pth`` to the trainer state and the baselines (existing ones only with ``force``)."""
    from mortal.model.checkpoint import INITIAL_BEST_PERF, atomic_torch_save, load_checkpoint
    boot = bootstrap_config(config)
    best = offline_paths(boot)['best_state_file']
    if not os.path.exists(best):
        raise BootstrapError(f'prepare needs {best}: run train-offline first')
    written = []
    cfg = typed(config)
    state_file = cfg.control.state_file
    if force or not os.path.exists(state_file):
        state = load_checkpoint(best)
        # the offline best was measured against RulebaseBots; online test play is against the baseline
        state['best_perf'] = dict(INITIAL_BEST_PERF)
        atomic_torch_save(state, state_file)
        written.append(state_file)
    slots = (cfg.baseline.train, cfg.baseline.test) if cfg.baseline is not None else ()
    for target in [slot.state_file for slot in slots if slot is not None]:
        if target and target not in written and (force or not os.path.exists(target)):
            atomic_copy(best, target)
            written.append(target)
    logger.info('prepare: wrote %s', written or 'nothing (all targets exist; --force to overwrite)')
    return written


def run_steps(config, steps, *, force=False, progress=True, config_path=None):
    """Run the named steps in order (``check_grp`` after ``train-grp``); returns ``{step: seconds}``."""
    from contextlib import nullcontext

    from tqdm.contrib.logging import logging_redirect_tqdm
    timings = {}
    run = {'gen-logs': lambda: gen_logs(config, progress=progress),
           'train-grp': lambda: (train_grp(config, progress=progress), check_grp(config, config_path)),
           'train-offline': lambda: train_offline(config, progress=progress),
           'prepare': lambda: prepare(config, force=force)}
    # a log line while a bar is drawn goes above the bar (tqdm.write), not into it
    with logging_redirect_tqdm() if progress else nullcontext():
        for step in steps:
            start = time.monotonic()
            logger.info('=== bootstrap %s', step)
            if step not in run:
                raise BootstrapError(f'unknown step {step!r}; one of {STEPS} or all')
            run[step]()
            timings[step] = time.monotonic() - start
    return timings


def main(argv=None):
    """``python -m mortal.tools.bootstrap STEP [-c PATH] [--force] [--no-progress]``; 2: bad config, 1: failed step."""
    from mortal import entry
    from mortal.config import TRAIN_SECTIONS, resolve_path
    parser = entry.parser('Bootstrap a model from rule-based play ([bootstrap] table).',
                          prog='python -m mortal.tools.bootstrap')
    parser.add_argument('step', choices=STEPS + ('all',))
    parser.add_argument('--force', action='store_true', help='prepare: overwrite existing online checkpoints')
    parser.add_argument('--no-progress', action='store_true', help='hide progress bars')
    args = entry.start(parser, argv)
    config_path = resolve_path(args.config, args.overrides)
    try:
        config = entry.load_config(args, TRAIN_SECTIONS + ('grp.control', 'grp.dataset', 'grp.optim'))
        bootstrap_config(config, path=config_path)
    except (ConfigError, BootstrapError) as e:
        return entry.error(e)
    entry.check_devices(config, entry.TRAIN_DEVICES + entry.GRP_DEVICES)
    steps = STEPS if args.step == 'all' else (args.step,)
    try:
        timings = run_steps(config, steps, force=args.force, progress=not args.no_progress, config_path=config_path)
    except BootstrapError as e:
        return entry.error(e, 1)
    for step, secs in timings.items():
        print(f'{step}: {secs:.0f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
