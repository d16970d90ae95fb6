#!/usr/bin/env python
"""Rotate the baseline: copy the best checkpoint over ``[baseline.train]``/``[baseline.test] state_file``.

    python scripts/rotate_baseline.py [-c config.toml] [--from PATH] [--reset-best]

* The source (default ``[control] best_state_file``) must load and hold ``mortal``, ``current_dqn`` and
  ``config``; otherwise nothing is touched.
* Each existing baseline is kept as ``<file>.<YYYYmmdd-HHMMSS>.bak`` before the new one is written (temp
  name + rename, so a process starting meanwhile never reads half a file).
* ``--reset-best`` also resets ``best_perf`` in ``[control] state_file`` so that ``best.pth`` follows test
  plays against the new, stronger baseline. Run it only while the trainer is stopped: a running learner
  would save its old ``best_perf`` over it.

Afterwards: restart the clients (they load ``[baseline.train]`` once at start). The trainer loads
``[baseline.test]`` at every learner start, i.e. after its next test play; restart it to switch now.
Exit status 1 with a message when the source is unusable.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from mortal import entry  # noqa: E402  (after the sys.path line)
from mortal.config import ConfigError, typed  # noqa: E402
from mortal.model.rotation import rotate  # noqa: E402


def main(argv=None):
    """``python scripts/rotate_baseline.py [-c PATH] [--from PATH] [--reset-best]``; returns 0, or 1 when the
    source is unusable."""
    parser = entry.parser(__doc__.split('\n\n')[0])
    parser.add_argument('--from', dest='source', default=None, help='checkpoint to promote (default: best)')
    parser.add_argument('--reset-best', action='store_true',
                        help="reset best_perf in [control] state_file (trainer must be stopped)")
    args = entry.start(parser, argv, log_level=None)
    try:
        config = entry.load_config(args, ('control', 'baseline.train', 'baseline.test'))
        done = rotate(config, args.source, reset_best=args.reset_best)
    except (ConfigError, ValueError, OSError) as e:
        print(f'rotate_baseline: error: {e}', file=sys.stderr)
        return 1
    control = typed(config).control
    for target, backup in done:
        print(f'{target} <- {args.source or control.best_state_file}'
              + (f' (previous kept as {backup})' if backup else ''))
    if args.reset_best:
        print(f'best_perf reset in {control.state_file}')
    print('now restart the clients; the trainer picks the new baseline up at its next learner start')
    return 0


if __name__ == '__main__':
    sys.exit(main())
