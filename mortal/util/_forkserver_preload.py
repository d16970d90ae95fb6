"""Imported first by the DataLoader fork server (``mortal.data.dataloader.safe_mp_context``'s preload list).

The fork server is a child of the process that iterates the DataLoader (the learner), and every worker it
forks keeps it alive (they hold its 'alive' pipe), while the workers only watch their own parent, the fork
server: after a SIGKILL of the learner neither would ever exit. Dying with the learner breaks that cycle; the
workers then die with the fork server (``mortal.data.dataloader.worker_init_fn``). Not meant to be imported
anywhere else: the import itself makes the importing process die with its parent.

``FORKSERVER_PID`` is this fork server's pid. Workers forked from it inherit this module, so they know which
parent to expect: one whose fork server died before it asked to die with it (it was re-parented, so
``os.getppid()`` no longer names the fork server) ends at once instead of living on.
"""

import os

from mortal.util.lifetime import die_with_parent

FORKSERVER_PID = os.getpid()
# MORTAL_LOADER_PARENT_PID (mortal.data.dataloader.LOADER_PARENT_ENV): the learner's pid, exported by
# safe_mp_context before the fork server starts, so that a fork server whose learner was killed before this
# import ends at once too.
_parent = os.environ.get("MORTAL_LOADER_PARENT_PID", "")
die_with_parent(expected_parent=int(_parent) if _parent.isdigit() else None)
