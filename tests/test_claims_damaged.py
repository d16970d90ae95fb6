"""A damaged claim ledger never stops the learner: a folder in place of the staged manifest (issue 35 item 3)."""

import json
import logging
import os

import pytest

from mortal.data.claims import MANIFEST, STAGED, ClaimLedger


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



@pytest.mark.parametrize('passes', ['x', None])
def test_a_manifest_with_a_passes_that_is_no_number_is_resumed_whole_with_a_line(tmp_path, caplog, passes):
    # '%d passes' of a string made the warning a "--- Logging error ---" traceback instead of its line
    d = tmp_path / 'drain.trainer'
    d.mkdir()
    (d / 'a.gz').write_bytes(b'x')
    (d / MANIFEST).write_text(json.dumps({'format': 1, 'signature': {'v': 1}, 'passes': passes, 'steps': 5,
                                          'files': {'a.gz': {'0': 'done'}}}))
    with caplog.at_level(logging.WARNING, logger='mortal.claims'):
        ledger = ClaimLedger.open(str(d), signature={'v': 1}, passes=2)
    assert ledger.files == {'a.gz': {}}  # not trained yet as far as the ledger knows
    assert caplog.messages == [f"{d / MANIFEST} was written under other settings ({{'v': 1}}, {passes!r} passes; now "
                               "{'v': 1}, 2 passes): its 1 logs are resumed whole"]
