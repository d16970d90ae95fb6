"""Where a running online system's CPU goes, by process role, per learner step (Linux ``/proc``).

Every 0.5 s for ``--seconds`` it reads the CPU time (user + system) of every Python process and keeps each pid's
largest value, so a process that ends in the window (a learner restarted after its test play, its loader workers)
counts up to its last sample (at most 0.5 s of its CPU is missed). Roles by command line: the learner
(``train.py``, the supervisor too), its loader (the DataLoader fork server and its workers), the client, the
server, and everything else Python by name. The box's idle CPU seconds come from ``/proc/stat``.

With ``--train-log`` (the learner's log of the same run) it also reads the learner's steps from its ``total
steps`` lines inside the window and prints each role's CPU milliseconds per step: the figure to compare between
two trees, since the share of the 2 cores each role gets moves with the others (a client that waits less plays on
the CPU the learner freed).

Usage: ``python bench/cpu_roles.py --seconds 540 [--train-log OUT/arms/NAME/logs/train.log]``, started beside a
running ``bench/learning.py run`` (docs/performance.md, session 24).
"""

import argparse
import collections
import datetime
import os
import re
import time

TICK = os.sysconf('SC_CLK_TCK')
ROLES = (('forkserver', 'loader (fork server + workers)'), ('mortal.client', 'client'), ('client.py', 'client'),
         ('mortal.server', 'server'), ('server.py', 'server'), ('train.py', 'learner'), ('mortal.train', 'learner'))


def role(cmdline: str) -> str:
    """The role of a process by its command line (``ROLES``), else ``other: <its start>``."""
    for key, name in ROLES:
        if key in cmdline:
            return name
    return 'other: ' + cmdline[:40]


def python_cpu() -> dict:
    """``{pid: (role, CPU seconds)}`` of every Python process now, this one left out."""
    out = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                cmdline = f.read().replace(b'\0', b' ').decode(errors='replace')
            with open(f'/proc/{pid}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if 'python' in cmdline and int(pid) != os.getpid():
            out[pid] = (role(cmdline), (int(fields[11]) + int(fields[12])) / TICK)
    return out


def idle_and_total() -> tuple:
    """The box's idle and total CPU seconds since boot (``/proc/stat``)."""
    with open('/proc/stat') as f:
        ticks = list(map(int, f.readline().split()[1:8]))
    return ticks[3] / TICK, sum(ticks) / TICK


def steps_between(train_log: str, start: float, end: float) -> int:
    """Learner steps between two epoch times, from the ``total steps: N`` lines of ``train_log``."""
    steps = []
    with open(train_log, errors='replace') as f:
        for line in f:
            found = re.search(r'total steps: ([\d,]+)', line)
            if found:
                at = datetime.datetime.strptime(line[:23], '%Y-%m-%d %H:%M:%S,%f').timestamp()
                steps.append((at, int(found.group(1).replace(',', ''))))
    before = [n for at, n in steps if at <= start]
    inside = [n for at, n in steps if at <= end]
    if not before or not inside:
        raise SystemExit(f'{train_log}: no "total steps" line before the window; start this later')
    return inside[-1] - before[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, default=540.0)
    parser.add_argument('--train-log', help="the learner's log: CPU ms a step per role")
    args = parser.parse_args()
    seen = {}
    idle0, total0 = idle_and_total()
    start = time.time()
    while time.time() - start < args.seconds:
        for pid, (name, cpu) in python_cpu().items():
            seen[pid] = (name, max(cpu, seen.get(pid, (name, 0.0))[1]))
        time.sleep(0.5)
    end = time.time()
    idle1, total1 = idle_and_total()
    by_role = collections.Counter()
    for name, cpu in seen.values():
        by_role[name] += cpu
    steps = steps_between(args.train_log, start, end) if args.train_log else None
    print(f'{end - start:.0f} s, idle {idle1 - idle0:.1f} of {total1 - total0:.1f} CPU s'
          + (f', {steps:,} learner steps' if steps else ''))
    for name, cpu in by_role.most_common() + [('all Python', sum(by_role.values()))]:
        print(f'  {name:32s} {cpu:8.1f} CPU s' + (f'  {1000 * cpu / steps:7.2f} ms a step' if steps else ''))


if __name__ == '__main__':
    main()
