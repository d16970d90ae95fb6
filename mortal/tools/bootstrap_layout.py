"""The ``[bootstrap]`` table, the bootstrap's error, and where its steps keep their files."""

import glob
import os

from mortal.config import ConfigError, checked_section


class BootstrapError(RuntimeError):
    """A bootstrap step cannot run or failed; the message names the step and the reason."""


def bootstrap_config(config, *, path=None):
    """The typed ``[bootstrap]``; ``BootstrapError`` naming the missing table or bad keys and ``path``."""
    try:
        return checked_section(config, 'bootstrap', path=path)
    except ConfigError as e:
        raise BootstrapError(str(e)) from None


def train_glob(boot) -> str:
    """The glob of the bootstrap's training logs (``[bootstrap] log_dir``/train)."""
    return os.path.join(boot.log_dir, 'train', '*.json.gz')


def val_logs(boot):
    """The bootstrap's validation logs (``[bootstrap] log_dir``/val), sorted."""
    return sorted(glob.glob(os.path.join(boot.log_dir, 'val', '*.json.gz')))


def offline_paths(boot) -> dict:
    """The files of the offline run under ``[bootstrap] work_dir``/offline, by role."""
    root = os.path.join(boot.work_dir, 'offline')
    return {
        'root': root,
        'state_file': os.path.join(root, 'mortal.pth'),
        'best_state_file': os.path.join(root, 'best.pth'),
        'best_test_play': os.path.join(root, 'best_test_play.pth'),  # the test play's pick when early stopping
        'history': os.path.join(root, 'epochs.json'),
        'tensorboard_dir': os.path.join(root, 'tensorboard'),
        'test_log_dir': os.path.join(root, 'test_play'),
        'file_index': os.path.join(root, 'file_index.pth'),
        'done': os.path.join(root, 'DONE'),
    }
