"""A damaged claim ledger never stops the learner: a folder in place of the staged manifest (issue 35 item 3)."""

import logging
import os

import pytest

from mortal.data.claims import STAGED, ClaimLedger


@pytest.mark.parametrize('steps', [None, 5])
def test_a_folder_as_the_staged_ledger_is_dropped_with_a_line(tmp_path, caplog, steps):
    d = tmp_path / 'drain.trainer'
    (d / STAGED).mkdir(parents=True)
    (d / STAGED / 'x').write_text('{}')
    with caplog.at_level(logging.WARNING, logger='mortal.claims'):
        ledger = ClaimLedger.open(str(d), signature={'v': 1}, passes=1, steps=steps)
    assert ledger.files == {}
    assert not os.path.lexists(d / STAGED)
    assert f'dropping {d / STAGED}: it is no staged claim ledger (a folder or a link)' in caplog.text

