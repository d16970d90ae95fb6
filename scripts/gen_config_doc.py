#!/usr/bin/env python
"""Write docs/config.md, the key reference, from the schema (``mortal/config_schema.py``): every key with its type,
default and meaning, and for each key beyond Mortal's (its description starts with ``extra:``) the measurement behind
it, where one exists (``MEASURED`` below).

    python scripts/gen_config_doc.py > docs/config.md      # or: python scripts/gen_config_doc.py docs/config.md

``tests/test_config.py`` checks that docs/config.md is what this script writes, so a new key in the schema is a
regenerated file, not a hand-written row.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mortal.config import key_table  # noqa: E402
from mortal.config_keys import REMOVED_KEYS  # noqa: E402

EXTRA_TARGET = 60  # the most extras the project means to keep (issue 34)

_CF = ('docs/learning.md parts 2-3: on the `no-riichi` flaw 30 minutes beat the offline-only control by −0.405 ± '
       '0.096 avg rank; on the standard default 60 minutes end +0.233 ± 0.065 worse than it (the GRP prices the '
       'branches at zero); off by default')
_GUARD = ('docs/operations.md, "A guarded run" and "A 2-hour guarded run": 60 and 120 minutes of the embedded '
          'default with `rollback_after = 2`; no rollback fired in either (nothing collapsed), so the guard is '
          'measured as quiet, not as a gain')
_FLEET = 'none measured on this machine (2 cores): the scaling of self-play over Ray is for real clusters'
_WIRE = ('a safety bound, not a lever: bad input must not take the server down (`tests/test_hardening.py`; memory '
         'under a flood: `bench/server_auth_memory.py`; hostile connections: `bench/server_exhaustion.py`)')
_BOOT = ('the quickstart\'s bootstrap (docs/operations.md, "Without Mortal weights"); docs/learning.md, "The targets", '
         'part 1: a start at 2.65-2.83 avg rank against 3 RulebaseBots')

# (table as key_table spells it, key) -> the measurement behind the key, or why none is needed.
MEASURED = {
    ('train_play.<profile>', 'speculate_passes'): 'docs/operations.md, "Performance on CPU": 6-8% slower on a CPU '
                                                  '(0.226 against 0.245 of the zero-cost floor); its GPU case is '
                                                  '`bench/gpu.sh --arena`',
    ('train_play.<profile>', 'counterfactual_rate'): _CF,
    ('train_play.<profile>', 'counterfactual_alternative'): 'docs/learning.md part 2: `other_kind` is the arm that '
                                                            'taught riichi on `no-riichi` (above); `contested`: '
                                                            'docs/learning.md, "Branches where the decision is '
                                                            'contested" (the gaps by kind and reward, the CPU share)',
    ('test_play', 'best_rule'): 'docs/operations.md, "Paired test play": `bench/sprt_cost.py` (both rules call an '
                                'equal model better about 3% of the time; the SPRT plays 11-63% of a fixed test '
                                'play on a model that is not better); the 2-hour run\'s SPRT pick is −0.160 ± 0.051 '
                                'against the start, the fixed-deal paired pick −0.006 ± 0.051',
    ('test_play', 'confidence'): 'as `best_rule`',
    ('test_play', 'sprt_delta'): 'as `best_rule`: a gain of 0.05 is found in 76% of simulated test plays at 0.05, '
                                 '48% at 0.1',
    ('test_play', 'sprt_alpha'): 'as `best_rule`',
    ('test_play', 'sprt_beta'): 'as `best_rule`',
    ('test_play', 'sprt_chunk'): 'as `best_rule`',
    ('test_play', 'fresh_deals'): 'docs/operations.md, "A guarded run": on fixed deals best.pth kept a lucky record '
                                  '(−0.006 ± 0.051 against the start, the final model −0.119 ± 0.069 better); on '
                                  'fresh deals the pick was a real gain (−0.160 ± 0.051)',
    ('test_play', 'min_deals'): 'a safety bound, not a lever: a 4-deal test play (16 games) read −0.500 ± 0.447 '
                                  'and replaced best.pth from noise (issue 36; `tests/test_guards.py`)',
    ('test_play', 'speculate_passes'): 'as `[train_play.<profile>] speculate_passes`',
    ('dataset', 'max_log_bytes'): _WIRE,
    ('env', 'reward'): 'docs/learning.md, "The reward-model arm" and "The targets", part 1: the points reward '
                       'correlates −0.265 with the final rank, an early-stopped GRP −0.30 to −0.32; the fallback '
                       'when the GRP is no better than uniform',
    ('cql', 'online_min_q_weight'): 'docs/learning.md, "The ablation": with `calibrated`, final 2.517 ± 0.048 '
                                    'against 3x the start where Mortal\'s loss ends at 3.147 ± 0.047',
    ('cql', 'calibrated'): 'as `online_min_q_weight`',
    ('optim.scheduler', 'init'): 'none needed: Mortal\'s scheduler argument, unset unless given',
    ('optim.scheduler', 'offset'): 'none needed: Mortal\'s scheduler argument',
    ('optim.scheduler', 'epoch_size'): 'none needed: Mortal\'s scheduler argument',
    ('baseline.train', 'from_server'): 'none: keeps every client on the trainer\'s baseline (docs/operations.md, '
                                       '"Baseline sync")',
    ('online', 'no_param_warn_minutes'): 'an operator\'s alarm, not a lever: a client waiting on a stopped '
                                         'learner said nothing (issue 36; `tests/test_client.py`)',
    ('online', 'anchor_weight'): 'docs/learning.md, "The ablation": final 2.504 ± 0.046 against 3x the start '
                                 'where Mortal\'s loss collapses to 3.147 ± 0.047 in 1,200 steps; on in the '
                                 'quickstart',
    ('online', 'counterfactual_weight'): _CF,
    ('online', 'offline_batch_size'): 'docs/learning.md, "The offline mix": final 2.399 ± 0.046 against 3x the '
                                      'start after 1,807 steps, as good as the offline-only control (2.36-2.43); on '
                                      'in the quickstart',
    ('online', 'restart_after_test_play'): 'docs/performance.md, session 26: the standard arm (20 minutes, 2 cores) '
                                           'played 6,165 hanchan with false (mean of 3) against 5,520 with true '
                                           '(mean of 4), +12%, and learned the same (+0.013 ± 0.061 avg rank, '
                                           '1,600 games); false in the quickstart',
    ('online.remote', 'token'): _WIRE,
    ('online.server', 'max_frame_bytes'): _WIRE,
    ('online.server', 'max_pending_connections'): _WIRE,
    ('online.server', 'max_inflight_bytes'): _WIRE,
    ('online.server', 'payload_min_bytes_per_s'): _WIRE,
    ('1v3.challenger', 'type'): 'none needed: plays the quickstart\'s "start vs 3 RulebaseBots" line',
    ('1v3.champion', 'type'): 'as `[1v3.challenger] type`',
    ('guard', 'rollback_after'): _GUARD,
    ('guard', 'max_policy_drift'): _GUARD,
    ('guard', 'min_q_gap'): _GUARD,
    ('guard', 'lr_factor'): _GUARD,
    ('guard', 'epsilon_factor'): _GUARD,
    **{('fleet', k): _FLEET for k in ('actors', 'profiles', 'num_cpus', 'num_gpus', 'max_restarts', 'address',
                                      'tensorboard_dir')},
    **{('bootstrap', k): _BOOT for k in ('games', 'val_games', 'log_dir', 'work_dir', 'grp_steps', 'workers',
                                         'epsilon', 'seed_key', 'offline_test_every', 'offline_test_games',
                                         'offline_lr')},
    ('bootstrap', 'flaw'): 'docs/learning.md part 2: the planted-flaw benchmark (`bench/learning.py flaw`)',
    ('bootstrap', 'offline_max_epochs'): 'docs/learning.md, "The targets", part 1: epoch 2 of 3 kept by the '
                                         'validation loss (7.26 → 6.22 → 6.34); one or two more offline epochs make '
                                         'the start 0.08-0.26 avg rank stronger',
    ('bootstrap', 'offline_patience'): 'as `offline_max_epochs`',
    ('bootstrap', 'grp_patience'): 'docs/learning.md, "The targets", part 1: early-stopped GRPs reach val CE '
                                   '2.39-2.59 (uniform 3.18) against 2.86 for a fixed 100 steps',
}

# The measurement behind each removed key (REMOVED_KEYS), or its absence. Part 4's arms ran 20 minutes from part 3's
# start: the final model minus the matched offline-only control, paired on 800 games.
_ROTATION = 'no run promoted a baseline here (promote by hand: `scripts/rotate_baseline.py`)'
_SCHEDULE = 'a knob for long runs, not measured here'
_ARM = 'docs/learning.md part 4, arm '
REMOVED_WHY = {
    **{('online', k): _ARM + '`rr4` (`replay_ratio = 4`): +0.056 ± 0.090' for k in ('replay_ratio', 'replay_window')},
    **{('online', k): _ARM + '`nstep3` (`n_step = 3`): +0.061 ± 0.084' for k in ('n_step', 'target_update_every')},
    **{('online', k): _ARM + '`pgkl` (`pg_weight = 1`, `kl_weight = 1`, `pg_temp = 1`): +0.066 ± 0.096'
       for k in ('pg_weight', 'pg_temp', 'kl_weight')},
    ('online', 'ema_decay'): 'docs/learning.md, "The ablation": with the anchor, final 2.496 ± 0.046 against the '
                             'anchor alone\'s 2.504 ± 0.046',
    ('train_play.<profile>', 'counterfactual_persist'): 'docs/learning.md, "overcall with persistent counterfactual '
                                                        'branches": persist − control +0.018 ± 0.099',
    ('resnet', 'dropout'): 'never measured',
    ('online', 'probe_file'): 'a path nobody needed to move: the probe is `probe.pth` beside `[control] state_file`',
    ('online', 'probe_size'): 'an instrument\'s size, not a lever (`diag/policy_drift`): fixed at 2048 positions',
    ('guard', 'keep'): 'a disk bound of the rollbacks, not a lever: the newest 5 replaced state files are kept',
    **{('rotation', k): _ROTATION for k in ('after', 'max_rank', 'pool_size')},
    **{(f'schedule.{s}', k): _SCHEDULE for s in ('lr', 'epsilon', 'temp')
       for k in ('kind', 'rate', 'final', 'max_steps')},
}

INTRO = """\
The config file is TOML in Mortal's layout and is validated when a process starts, against a schema declared once
as pydantic models (`mortal/config_schema.py`). Types are strict, as TOML's: an integer key refuses `8.0` and
`true`, a number key takes an integer and widens it. Errors name the key and the file (for example
`[control] save_every = 10 in config.toml must be a multiple of [control] opt_step_every = 4`); every problem found
is listed at once; a missing key names an unknown key of its table that resembles it (`missing key [control]
batch_size ...; the table has 'batch_sise': a typo of it?`). Warnings are logged for unknown keys and sections (for
example `unknown key [control] verison in config.toml (did you mean 'version'?)`; `mortal-doctor` fails such a near
miss), for `sample_reuse_rate` / `sample_reuse_threshold` set to non-zero (accepted, no effect, as in Mortal), for a
`capacity` smaller than one client round of `games` (clients would be refused forever) and for `force_sequential`
with a `capacity` larger than one client round (the trainer would wait forever unless enough clients run). A key
that was removed is an error that names it (below).

Rules checked besides types: `save_every` is a multiple of `opt_step_every`; `test_every` is a multiple of
`save_every`; every `games` / `games_per_iter` is a positive multiple of 4; `top_p` lies in (0, 1];
`boltzmann_epsilon` in [0, 1]; `boltzmann_temp` > 0; `[optim.scheduler]` keeps peak ≥ final ≥ init ≥ 0 and
max_steps ≥ warm_up_steps or 0 (no annealing: final from the end of the warm-up on; the scheduler applies the very
same rules); `[cql] online_min_q_weight`, `[online] anchor_weight` ≥ 0, `offline_batch_size` in [0, 65536] (a warning when set with `online = false`); a
`[online.remote] host` that is not a loopback address requires a `token`.

Each process needs only its own sections: the server `[online]`, `[online.remote]` and `[online.server]`; the client
`[control]`, `[resnet]`, `[env]`, `[online]`, `[online.remote]`, `[baseline.train]` and its `[train_play.<profile>]`;
the trainer additionally
`[test_play]`, `[dataset]`, `[cql]`, `[aux]`, `[freeze_bn]`, `[optim]`, `[optim.scheduler]`, `[baseline.test]`,
`[grp]` and `[grp.network]`. Any section present is checked fully.

Keys marked *extra* are not in Mortal; their last column is the measurement behind each (or why none is needed).
"required" means the key must be present whenever its section is. `[optim.scheduler]` also accepts Mortal's optional
scheduler arguments `init`, `offset` and `epoch_size`, which stay unset unless given."""


def _cell(text: str) -> str:
    return text.replace('|', '\\|')


def render() -> str:
    """The text of docs/config.md."""
    rows = key_table()
    extras = [(s, k) for s, k, _, _, doc in rows if doc.startswith('extra:')]
    tables = {s for s, *_ in rows}
    out = ['# Configuration keys', '',
           '<!-- Generated by `python scripts/gen_config_doc.py > docs/config.md` from mortal/config_schema.py: '
           'edit the schema, not this file. -->', '', INTRO, '',
           f'{len(rows)} keys in {len(tables)} tables: Mortal\'s {len(rows) - len(extras)} and {len(extras)} extras '
           f'(the project\'s target: at most {EXTRA_TARGET} extras).', '',
           '| Section | Key | Type | Default | Meaning | Measured (extras) |', '|---|---|---|---|---|---|']
    for section, key, kind, default, doc in rows:
        extra = doc.startswith('extra:')
        meaning = ('*extra*: ' + doc[len('extra:'):].strip()) if extra else doc
        shown = default if default in ('required', '(unset)', '(none)') else f'`{default}`'
        measured = MEASURED.get((section, key), '') if extra else ''
        out.append(f'| `[{section}]` | `{key}` | {kind} | {_cell(shown)} | {_cell(meaning)} | {_cell(measured)} |')
    out += ['', '## Removed keys', '',
            'Extras measured as no gain, or never measured to gain, were removed with their code. A file that still '
            'sets one is refused, the message naming the table, the key and the file. A figure is the arm\'s final '
            'model minus the offline-only control matched to its offline samples, in avg rank (docs/learning.md '
            'part 4, 800 games; the plain embedded default: +0.107 ± 0.078), or the measurement named:', '']
    groups: dict = {}  # (table, reason) -> keys, in REMOVED_KEYS' order
    for table, key in REMOVED_KEYS:
        groups.setdefault((table, REMOVED_WHY[table, key]), []).append(key)
    out += [f'* `[{table}]` {", ".join(f"`{k}`" for k in keys)}: {why}' for (table, why), keys in groups.items()]
    return '\n'.join(out) + '\n'


if __name__ == '__main__':
    # UTF-8 whatever PYTHONIOENCODING or the locale say (the doc has non-ASCII signs): to the file argument if given
    if len(sys.argv) > 1:
        pathlib.Path(sys.argv[1]).write_text(render(), encoding='utf-8')
    else:
        sys.stdout.reconfigure(encoding='utf-8')
        sys.stdout.write(render())
