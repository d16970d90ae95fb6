"""Imported first by the DataLoader fork server (``mortal.dataloader.safe_mp_context``'s preload list).

The fork server is a child of the process that iterates the DataLoader (the learner), and every worker it
forks keeps it alive (they hold its 'alive' pipe), while the workers only watch their own parent, the fork
server: after a SIGKILL of the learner neither would ever exit. Dying with the learner breaks that cycle; the
workers then die with the fork server (``mortal.dataloader.worker_init_fn``). Not meant to be imported
anywhere else: the import itself makes the importing process die with its parent.
"""

from mortal.lifetime import die_with_parent

die_with_parent()
