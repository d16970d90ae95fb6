"""Version-4 observations from the compiled core (``_core.sp_rows`` for rows 889-1011, ``_core.repack_v3`` for rows
0-888) equal, bit for bit, those of the old path (Python around the core's search: ``tests/sp_oracle/v4_rows.py``)
at every decision of every seat of the real logs in tests/data."""

import gzip
import json

import numpy as np
import pytest
from mjai.mlibriichi.state import PlayerState

from mortal.features.obs_v4 import SP_START, V4Encoder, encode_batch
from mortal.features.sp.calc import HAVE_CORE

from conftest import DATA_DIR
from sp_oracle.v4_rows import old_repack_v3, old_sp_rows

pytestmark = pytest.mark.skipif(not HAVE_CORE, reason="compiled single-player core not built")

LOGS = ("meta_annotated_hanchan.jsonl", "riichienv_selfplay_hanchan.jsonl", "arena_double_ron_hanchan.json.gz")


def _events(name):
    path = DATA_DIR / name
    text = gzip.open(path, "rt").read() if name.endswith(".gz") else path.read_text()
    for line in text.splitlines():
        if line.strip():
            ev = json.loads(line)
            ev.pop("meta", None)
            yield ev


def _same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", LOGS)
def test_core_rows_equal_the_old_path_at_every_decision(name):
    states = [(PlayerState(s), V4Encoder(s)) for s in range(4)]
    checked = searched = discards = riichi = fallback = 0
    for ev in _events(name):
        for ps, enc in states:
            cans = ps.update(json.dumps(ev))
            enc.update(ev)
            if ev["type"] in ("hora", "ryukyoku", "end_kyoku", "end_game") or not cans.can_act:
                continue
            kans = (False, True) if cans.can_ankan or cans.can_kakan else (False,)
            for at_kan_select in kans:
                (obs, mask), = encode_batch([(enc, ps, at_kan_select)], threads=1)
                v3, _ = ps.encode_obs(3, at_kan_select)
                assert _same_bits(obs[:SP_START], old_repack_v3(v3, ps.scores, ps.honba, ps.kyotaku)), (name, ev)
                want = old_sp_rows(enc, ps)
                assert _same_bits(obs[SP_START:], want), (name, ps.player_id, ev, np.argwhere(obs[SP_START:] != want)[:5])
                checked += 1
            searched += bool(want[72].any())
            discards += bool(cans.can_discard and want[70].any())
            riichi += bool(cans.can_discard and ps.self_riichi_accepted)
            fallback += bool(want[0].any() and not want[2:].any())
    # the logs reach every kind of row: searches with tables, discard layouts, riichi discards, fallback values
    assert checked > 100 and searched > 50 and discards > 50, (checked, searched, discards)
    assert riichi > 0 and fallback > 0, (riichi, fallback)
