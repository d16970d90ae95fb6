"""Imported first by the DataLoader fork server (``dataloader.safe_mp_context``'s preload list): importing
it makes the fork server die with the learner, so a SIGKILLed learner leaves no fork server and workers behind.
Import nowhere else. ``FORKSERVER_PID`` tells workers which parent to expect."""

import os

from mortal.util.lifetime import die_with_parent

FORKSERVER_PID = os.getpid()
# the learner's pid (dataloader.LOADER_PARENT_ENV): a fork server whose learner already died ends at once
_parent = os.environ.get("MORTAL_LOADER_PARENT_PID", "")
die_with_parent(expected_parent=int(_parent) if _parent.isdigit() else None)
