#!/usr/bin/env python
"""Render TensorBoard scalar curves (losses, test_play results) to PNG files.

For operators who would rather look at a picture than start TensorBoard. Reads every
event file under a log dir with tensorboard's ``EventAccumulator`` (including the
per-series sub-runs that ``SummaryWriter.add_scalars`` creates, e.g.
``test_play_ranking_1st/`` for the tag ``test_play/ranking``) and writes one PNG per
tag group (the part of the tag before the first ``/``): ``loss.png``,
``test_play.png``, ``hparam.png``, ... Each PNG holds one subplot per tag, one line
per series, x = training step.

Usage::

    python scripts/plot_tb.py WORK/tensorboard --out WORK/plots
    python scripts/plot_tb.py WORK/tensorboard --groups loss,test_play

Exit status 2 with a message naming the directory when there is nothing to plot
(no event files, or event files without scalars).
"""

import argparse
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

EVENT_FILE_MARK = 'tfevents'


class NoScalarsError(RuntimeError):
    """Raised when a log dir holds no TensorBoard event files or no scalar values."""


def find_run_dirs(logdir):
    """Directories under ``logdir`` (itself included) that hold event files.

    Returns a sorted list of ``Path``. Raises ``NoScalarsError`` naming ``logdir``
    when it does not exist or holds no ``events.out.tfevents.*`` file.
    """
    root = Path(logdir)
    if not root.is_dir():
        raise NoScalarsError(f'{root}: not a directory')
    runs = sorted({p.parent for p in root.rglob(f'*{EVENT_FILE_MARK}*') if p.is_file()})
    if not runs:
        raise NoScalarsError(
            f'{root}: no TensorBoard event files (events.out.tfevents.*) found; '
            'is this the [control] tensorboard_dir of a run that has saved at least once?')
    return runs


def _series_label(run_rel, tag):
    """Name of one line in a subplot.

    ``add_scalars('test_play/ranking', {'1st': ...})`` writes tag ``test_play/ranking``
    into the sub-run ``test_play_ranking_1st``; the label is then ``1st``. A plain
    ``add_scalar`` lives in the top run and gets the tag's last component.
    """
    prefix = tag.replace('/', '_') + '_'
    name = run_rel.name if run_rel.parts else ''
    if name.startswith(prefix):
        return name[len(prefix):]
    if name:
        return f'{name}:{tag.rsplit("/", 1)[-1]}'
    return tag.rsplit('/', 1)[-1]


def load_scalars(logdir):
    """Read all scalars under ``logdir``.

    Returns ``{tag: {label: (steps list[int], values list[float])}}`` with points
    sorted by step. When a trainer restarts and rewrites steps, the accumulator's
    default orphan purging keeps the latest values. Raises ``NoScalarsError``.
    """
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator, SCALARS)

    root = Path(logdir)
    out = defaultdict(dict)
    for run in find_run_dirs(root):
        acc = EventAccumulator(str(run), size_guidance={SCALARS: 0})  # 0 = keep all
        acc.Reload()
        for tag in acc.Tags().get('scalars', []):
            points = sorted((e.step, e.value) for e in acc.Scalars(tag))
            label = _series_label(run.relative_to(root), tag)
            out[tag][label] = ([s for s, _ in points], [v for _, v in points])
    if not out:
        raise NoScalarsError(f'{root}: event files found but they hold no scalar values yet')
    return dict(out)


def group_of(tag):
    """Group (output file stem) of a tag: the part before the first ``/``."""
    return tag.split('/', 1)[0] if '/' in tag else 'misc'


def plot_group(group, tags, scalars, out_path):
    """Draw one PNG with a subplot per tag of ``group``; returns ``out_path``."""
    import matplotlib.pyplot as plt

    ncols = min(3, len(tags))
    nrows = math.ceil(len(tags) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.4 * nrows), squeeze=False)
    for ax, tag in zip(axes.flat, tags):
        for label, (steps, values) in sorted(scalars[tag].items()):
            ax.plot(steps, values, marker='o' if len(steps) < 30 else None,
                    markersize=3, label=label)
        ax.set_title(tag, fontsize=10)
        ax.set_xlabel('step')
        ax.grid(alpha=0.3)
        if len(scalars[tag]) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(tags):]:
        ax.set_visible(False)
    fig.suptitle(group)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # leave room for the suptitle
    tmp = out_path.with_name(out_path.name + '.tmp.png')
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out_path)  # readers never see a half-written PNG
    return out_path


def render(logdir, out_dir, groups=None):
    """Render every tag group found under ``logdir`` into ``out_dir``.

    ``groups``: optional iterable of group names to keep (e.g. ``{'loss', 'test_play'}``).
    Returns the list of written PNG paths. Raises ``NoScalarsError``.
    """
    import matplotlib
    matplotlib.use('Agg')  # headless: no display on training machines

    scalars = load_scalars(logdir)
    by_group = defaultdict(list)
    for tag in sorted(scalars):
        by_group[group_of(tag)].append(tag)
    if groups is not None:
        wanted = set(groups)
        by_group = {g: t for g, t in by_group.items() if g in wanted}
        if not by_group:
            raise NoScalarsError(
                f'{logdir}: none of the groups {sorted(wanted)} present; '
                f'found {sorted({group_of(t) for t in scalars})}')
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [plot_group(g, tags, scalars, out_dir / f'{g}.png')
            for g, tags in sorted(by_group.items())]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('logdir', help='TensorBoard log dir ([control] tensorboard_dir)')
    parser.add_argument('--out', default=None, help='output dir for PNGs (default: LOGDIR/plots)')
    parser.add_argument('--groups', default=None,
                        help='comma-separated tag groups to draw, e.g. loss,test_play (default: all)')
    args = parser.parse_args(argv)
    out = args.out or os.path.join(args.logdir, 'plots')
    groups = [g for g in args.groups.split(',') if g] if args.groups else None
    try:
        paths = render(args.logdir, out, groups)
    except NoScalarsError as e:
        print(f'plot_tb: error: {e}', file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == '__main__':
    sys.exit(main())
