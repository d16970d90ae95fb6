"""Imported first by the DataLoader fork server (``dataloader.safe_mp_context``'s preload list): importing
it makes the fork server die with the learner, so a SIGKILLed learner leaves no fork server and workers behind.
Import nowhere else. ``FORKSERVER_PID`` tells workers which parent to expect."""

import os

from mortal.util.lifetime import die_with_parent

FORKSERVER_PID = os.getpid()
# MORTAL_LOADER_PARENT_PID (mortal.data.dataloader.LOADER_PARENT_ENV): the learner's pid, exported by
# safe_mp_context before the fork server starts, so that a fork server whose learner was killed before this
# import ends at once too.
_parent = os.environ.get("MORTAL_LOADER_PARENT_PID", "")
die_with_parent(expected_parent=int(_parent) if _parent.isdigit() else None)
