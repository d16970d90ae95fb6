"""Stat counters and derived statistics against hand-counted logs (Mortal's stat.rs rules)."""

import dataclasses
import gzip
import json
import logging
import math
import os
import shutil
import subprocess
import sys

import pytest

from mortal.stat import Stat, main
from mortal.stat_game import LogFormatError

from conftest import DATA_DIR, ROOT, call_unless_stuck_on

STAT_DIR = DATA_DIR / 'stat'
LOG_A = STAT_DIR / 'log_a.json'
LOG_B = STAT_DIR / 'log_b.json'


def nonzero(stat):
    return {k: v for k, v in dataclasses.asdict(stat).items() if v}


# log_a.json, seat 0 ("me"), counted from the kyoku table in tests/data/stat/README.md:
#  E1 (dealer): discards N (jun 1), then reach -> riichi_jun 1, chasing (seat 1 declared first);
#     discards W (jun 2); ippatsu tsumo, deltas[0] = 9800 -> point 9800 - own stick 1000 = 8800.
#  E1-1 (dealer): pon P -> fuuro_num 1; third discard 8p ronned by seat 2 (not dealer): -2300.
#  E2: reach after 2 discards (riichi_jun 2), accepted; draw +1500 -> riichi_point += 1500 - 1000.
#  E2-1: seat 3 tsumo, seat 0 pays 800: not recorded except in the final score.
#  Final scores [31200, 18500, 25400, 24900]: seat 0 1st, point 31200 - 25000 = 6200.
LOG_A_SEAT0 = dict(
    game=1, round=4, oya=2, point=6200, rank_1=1,
    fuuro=1, fuuro_num=1, fuuro_point=-2300, fuuro_houjuu=1,
    agari=1, agari_as_oya=1, agari_jun=2, agari_point_oya=8800,
    houjuu=1, houjuu_jun=3, houjuu_point_to_ko=-2300,
    riichi=2, riichi_as_oya=1, riichi_jun=1 + 2, riichi_agari=1, riichi_agari_point=8800,
    riichi_agari_jun=2, riichi_ryukyoku=1, riichi_point=8800 + 500, chasing_riichi=1,
    ryukyoku=1, ryukyoku_point=1500,
)

# log_b.json, seat 2 ("me"):
#  E1: dama ron on seat 1's 8s after 2 own discards: +2000 (non-dealer).
#  E2: reach after 1 discard; the declaration tile C (2nd discard) is ronned by seat 3 (not
#      dealer): -1300, counted as deal-in after riichi although the stick was never accepted.
#  E3 (dealer): chi 5m, 2 discards, kuitan tsumo 500 all = +1500.
#  E3-1 (dealer): kyuushu kyuuhai, all-zero deltas: one ryukyoku worth 0.
#  Final [24500, 22500, 27200, 25800]: seat 2 1st, point 2200.
LOG_B_SEAT2 = dict(
    game=1, round=4, oya=2, point=2200, rank_1=1,
    fuuro=1, fuuro_num=1, fuuro_point=1500, fuuro_agari=1, fuuro_agari_jun=2,
    fuuro_agari_point=1500,
    agari=2, agari_as_oya=1, agari_jun=2 + 2, agari_point_oya=1500, agari_point_ko=2000,
    houjuu=1, houjuu_jun=2, houjuu_point_to_ko=-1300,
    riichi=1, riichi_jun=1, riichi_houjuu=1, riichi_point=-1300,
    dama_agari=1, dama_agari_jun=2, dama_agari_point=2000,
    ryukyoku=1,
)


def test_log_a_seat0_counters():
    assert nonzero(Stat.from_log(LOG_A.read_text(), 0)) == LOG_A_SEAT0


def test_log_a_seat1_chased_riichi_and_last_place():
    # seat 1: reach before its first discard (riichi_jun 0), chased by seat 0; tsumo'd in E1
    # (no houjuu, nothing in riichi_point); noten in the E2 draw (-1500);
    # final 18500 -> 4th, point -6500.
    st = Stat.from_log(LOG_A.read_text(), 1)
    assert nonzero(st) == dict(game=1, round=4, oya=2, point=-6500, rank_4=1, riichi=1,
                               riichi_got_chased=1, ryukyoku=1, ryukyoku_point=-1500)
    assert st.riichi_chased_rate == 1.0
    assert st.avg_riichi_point == 0.0


def test_log_b_seat2_counters():
    assert nonzero(Stat.from_log(LOG_B.read_text(), 2)) == LOG_B_SEAT2


def test_derived_stats_log_a():
    st = Stat.from_log(LOG_A.read_text(), 0)
    assert st.avg_rank == 1.0
    assert st.total_pt([90, 45, 0, -135]) == 90
    assert st.avg_pt([90, 45, 0, -135]) == 90.0
    assert st.avg_point_per_round == 6200 / 4
    assert st.agari_rate == st.houjuu_rate == st.fuuro_rate == st.ryukyoku_rate == 0.25
    assert st.riichi_rate == 0.5
    assert st.avg_riichi_point == (8800 + 500) / 2
    assert st.avg_riichi_jun == 1.5
    assert st.chasing_riichi_rate == 0.5
    assert st.agari_rate_after_riichi == 0.5
    assert st.agari_rate_as_oya == 0.5          # 1 dealer win / 2 dealer kyoku
    assert st.houjuu_rate_after_fuuro == 1.0
    assert st.avg_fuuro_point == -2300.0
    assert st.avg_point_per_houjuu == -2300.0
    # 0/0 is NaN as in Mortal (f64 division): no non-dealer win, no deal-in to the dealer
    assert math.isnan(st.avg_point_per_ko_agari)
    assert math.isnan(st.avg_point_per_houjuu_to_oya)
    assert math.isnan(Stat().avg_rank)


def test_derived_stats_log_b():
    st = Stat.from_log(LOG_B.read_text(), 2)
    assert st.avg_point_per_agari == (2000 + 1500) / 2
    assert st.avg_point_per_oya_agari == 1500.0
    assert st.avg_point_per_ko_agari == 2000.0
    assert st.avg_point_per_dama_agari == 2000.0
    assert st.avg_point_per_fuuro_agari == 1500.0
    assert st.avg_agari_jun == 2.0
    assert st.houjuu_rate_after_riichi == 1.0
    assert st.avg_point_per_ryukyoku == 0.0
    assert st.agari_as_oya_rate == 0.5
    assert st.agari_rate_after_fuuro == 1.0
    assert st.avg_fuuro_num == 1.0


# tests/data/meta_annotated_hanchan.jsonl, seat 0, counted from the event lines (line numbers):
#  E1 (dealer, 98 reach after 12 discards, seat 1 declared at 90 -> chasing) ron at 107 after
#     13 discards: deltas 9700 - 1000 = 8700.
#  E2-1: pons 293/317/321 (3 calls, seat 3 tsumo).  E3: pon 409, tsumo 444 after 8 discards,
#     +8900 (non-dealer, open).  E4: pons 459/463, ron by seat 1 (non-dealer) 483 after 5
#     discards, -7700.  S2: pon 599, ron by dealer seat 1 at 651 after 8 discards, -12000.
#  S3: pons 833/847 (seat 2 tsumo).  S3-1: closed, ron by seat 1 (non-dealer) 957 after 12
#     discards, -1300.  Dealer in E1, E1-1, S1.  Final [8200, 55600, 24500, 11700] -> 4th.
META_SEAT0 = dict(
    game=1, round=12, oya=3, point=8200 - 25000, rank_4=1,
    fuuro=5, fuuro_num=3 + 1 + 2 + 1 + 2, fuuro_point=8900 - 7700 - 12000,
    fuuro_agari=1, fuuro_agari_jun=8, fuuro_agari_point=8900, fuuro_houjuu=2,
    agari=2, agari_as_oya=1, agari_jun=13 + 8, agari_point_oya=8700, agari_point_ko=8900,
    houjuu=3, houjuu_jun=5 + 8 + 12, houjuu_to_oya=1, houjuu_point_to_oya=-12000,
    houjuu_point_to_ko=-7700 - 1300,
    riichi=1, riichi_as_oya=1, riichi_jun=12, riichi_agari=1, riichi_agari_point=8700,
    riichi_agari_jun=13, riichi_point=8700, chasing_riichi=1,
)

# tests/data/riichienv_selfplay_hanchan.jsonl, seat 0:
#  riichi at 435 (E3-1, after seat 2's 413 -> chasing, 8 discards), 660 (E4-1, 7 discards),
#  1268 (S3, 14), 1379 (S4-1, 10): none as dealer (dealers 2, 3, 2, 3).
#  Draws: 746 (+1000, riichi), 1019 (-1500, closed), 1291 (+1000, riichi) -> riichi_point +0 +0.
#  Calls: pon 294 (E3), pon 478 (E3-2), pon 755 + chi 795 (S1-2), pon 1048 + chi 1128 (S2-1).
#  Win: ron 1144 on seat 3 after 15 discards, +2300 (open, non-dealer).
#  Deal-in: 1381, the riichi declaration tile (11th discard) to seat 2 (non-dealer), -8300.
#  Dealer in E1 and S1. Final [2400, 14900, 38800, 43900] -> 4th, point -22600.
RIICHIENV_SEAT0 = dict(
    game=1, round=12, oya=2, point=2400 - 25000, rank_4=1,
    fuuro=4, fuuro_num=1 + 1 + 2 + 2, fuuro_point=2300,
    fuuro_agari=1, fuuro_agari_jun=15, fuuro_agari_point=2300,
    agari=1, agari_jun=15, agari_point_ko=2300,
    houjuu=1, houjuu_jun=11, houjuu_point_to_ko=-8300,
    riichi=4, riichi_jun=8 + 7 + 14 + 10, riichi_houjuu=1, riichi_ryukyoku=2,
    riichi_point=-8300, chasing_riichi=1,
    ryukyoku=3, ryukyoku_point=1000 - 1500 + 1000,
)


@pytest.mark.parametrize('name,seat,expected', [
    ('meta_annotated_hanchan.jsonl', 0, META_SEAT0),
    ('riichienv_selfplay_hanchan.jsonl', 0, RIICHIENV_SEAT0),
])
def test_real_fixture_counters(name, seat, expected):
    assert nonzero(Stat.from_log((DATA_DIR / name).read_text(), seat)) == expected


def test_from_log_accepts_event_lists_and_bytes():
    raw = LOG_A.read_text()
    events = [json.loads(line) for line in raw.splitlines()]
    a = Stat.from_log(raw, 0)
    assert Stat.from_log(events, 0) == a
    assert Stat.from_log(raw.encode(), 0) == a
    assert Stat.from_log(raw.splitlines(), 0) == a


def _game(*kyoku_events, scores=(25000,) * 4, oya=0):
    ev = [{'type': 'start_game', 'names': ['a', 'b', 'c', 'd']},
          {'type': 'start_kyoku', 'bakaze': 'E', 'kyoku': oya + 1, 'honba': 0, 'kyotaku': 0,
           'oya': oya, 'scores': list(scores), 'dora_marker': '1m', 'tehais': []}]
    return ev + list(kyoku_events) + [{'type': 'end_kyoku'}, {'type': 'end_game'}]


def test_yakuman_threshold_depends_on_dealer():
    # a 32000 ron counts as yakuman for a non-dealer, not for the dealer (needs 48000)
    hora = {'type': 'hora', 'actor': 1, 'target': 2, 'deltas': [0, 32000, -32000, 0]}
    assert Stat.from_log(_game(hora, oya=0), 1).yakuman == 1
    assert Stat.from_log(_game(hora, oya=1), 1).yakuman == 0
    hora48 = {'type': 'hora', 'actor': 1, 'target': 2, 'deltas': [0, 48000, -48000, 0]}
    st = Stat.from_log(_game(hora48, oya=1), 1)
    assert st.yakuman == 1 and st.yakuman_rate == 1.0
    # the loser (seat 2): deal-in to the dealer; final 25000 - 48000 = -23000 < 0 -> tobi,
    # point = final - 25000
    lost = Stat.from_log(_game(hora48, oya=1), 2)
    assert (lost.houjuu_to_oya, lost.houjuu_point_to_oya, lost.tobi) == (1, -48000, 1)
    assert lost.point == -48000 and lost.rank_4 == 1


def test_nagashi_mangan_and_leftover_sticks_to_top_with_seat_order_ties():
    ev = _game({'type': 'reach', 'actor': 1}, {'type': 'dahai', 'actor': 1, 'pai': 'E'},
               {'type': 'reach_accepted', 'actor': 1},
               {'type': 'ryukyoku', 'deltas': [0, 0, 0, 0]})
    # scores end [25000, 24000, 25000, 25000], 1000 on the table: seats 0, 2, 3 tie and
    # seat order puts seat 0 first, which takes the stick.
    ranks = [Stat.from_log(ev, s) for s in range(4)]
    assert [s.point for s in ranks] == [1000, -1000, 0, 0]
    assert [(s.rank_1, s.rank_2, s.rank_3, s.rank_4) for s in ranks] == [
        (1, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0), (0, 0, 1, 0)]
    assert ranks[1].riichi_ryukyoku == 1 and ranks[1].riichi_point == -1000
    nagashi = _game({'type': 'ryukyoku', 'deltas': [12000, -4000, -4000, -4000]})
    st = Stat.from_log(nagashi, 0)
    assert (st.nagashi_mangan, st.ryukyoku_point) == (1, 12000)
    assert Stat.from_log(nagashi, 1).nagashi_mangan == 0


def test_add_is_fieldwise():
    a = Stat.from_log(LOG_A.read_text(), 0)
    b = Stat.from_log(LOG_B.read_text(), 2)
    total = a + b
    assert total.game == 2 and total.round == 8 and total.agari == 3
    assert total.riichi_point == 9300 - 1300
    assert total.avg_rank == 1.0


def test_from_dir_globs_gz_sums_seats_and_skips_bad_files(tmp_path, caplog):
    shutil.copy(LOG_A, tmp_path / 'a.json')
    sub = tmp_path / 'sub' / 'deeper'
    sub.mkdir(parents=True)
    with gzip.open(sub / 'b.json.gz', 'wt') as f:
        f.write(LOG_B.read_text())
    # same game as log_a with two seats named "me": seats 0 and 2 both count
    two = LOG_A.read_text().replace('["me","a","b","c"]', '["me","a","me","c"]', 1)
    (tmp_path / 'two.json').write_text(two)
    (tmp_path / 'ignored.jsonl').write_text(LOG_A.read_text())  # not a globbed extension
    lines = LOG_A.read_text().splitlines()
    (tmp_path / 'broken.json').write_text(lines[0] + '\n' + lines[1][:40])  # line 2 cut
    (tmp_path / 'nostart.json').write_text('{"type":"end_game"}\n')
    (tmp_path / 'notgzip.json.gz').write_text('plain text')
    skipped = []
    with caplog.at_level(logging.WARNING, logger='mortal.stat'):
        st = Stat.from_dir(tmp_path, 'me', skipped=skipped)
    a0 = Stat.from_log(LOG_A.read_text(), 0)
    a2 = Stat.from_log(LOG_A.read_text(), 2)
    b2 = Stat.from_log(LOG_B.read_text(), 2)
    assert st == a0 + b2 + a0 + a2
    assert st.game == 4
    assert sorted(p.rsplit('/', 1)[1] for p in skipped) == [
        'broken.json', 'nostart.json', 'notgzip.json.gz']
    text = caplog.text
    assert 'broken.json:2' in text and 'not a JSON event' in text
    assert 'nostart.json' in text and 'first event is not start_game' in text
    assert 'skipped 3 of 6' in text
    with pytest.raises(FileNotFoundError, match=f'^log directory not found: {tmp_path / "missing"}$'):
        Stat.from_dir(tmp_path / 'missing', 'me')
    with pytest.raises(FileNotFoundError, match=' is a file, not a log directory$'):  # a log given as the folder
        Stat.from_dir(LOG_A, 'me')


def test_a_log_reached_through_several_links_counts_once(tmp_path):
    # glob's '**' follows a link to a parent folder down to the OS's limit: each log counted about 20 times
    shutil.copy(LOG_A, tmp_path / 'a.json')
    (tmp_path / 'sub').mkdir()
    os.symlink('..', tmp_path / 'sub' / 'up')
    os.symlink(tmp_path / 'a.json', tmp_path / 'sub' / 'same.json')
    assert Stat.from_dir(tmp_path, 'me') == Stat.from_log(LOG_A.read_text(), 0)


@pytest.mark.skipif(not hasattr(os, 'mkfifo'), reason='needs FIFOs')
def test_a_fifo_among_the_logs_is_skipped_not_waited_on(tmp_path, caplog):
    # open() of a FIFO blocks until a writer comes: the whole run (this one, or a learner's loader) would hang
    shutil.copy(LOG_A, tmp_path / 'a.json')
    os.mkfifo(tmp_path / 'pipe.json')
    skipped = []
    with caplog.at_level(logging.WARNING, logger='mortal.stat'):
        result = call_unless_stuck_on(tmp_path / 'pipe.json', lambda: Stat.from_dir(tmp_path, 'me', skipped=skipped),
                                      'Stat.from_dir')
    assert result == Stat.from_log(LOG_A.read_text(), 0)
    assert skipped == [str(tmp_path / 'pipe.json')]
    assert f'{tmp_path / "pipe.json"}: not a regular file' in caplog.text


def test_bad_input_errors_name_line_and_field():
    ev = _game({'type': 'hora', 'actor': 1, 'target': 2})
    with pytest.raises(LogFormatError, match=r"x\.json:3: hora field 'deltas'"):
        Stat.from_log(ev, 0, source='x.json')
    with pytest.raises(LogFormatError, match="unknown event type 'foo'"):
        Stat.from_log([{'type': 'foo'}], 0)
    with pytest.raises(LogFormatError, match="'actor' must be a seat"):
        Stat.from_log(_game({'type': 'dahai', 'actor': 4, 'pai': 'E'}), 0)
    with pytest.raises(ValueError, match='seat'):
        Stat.from_log([], 4)


def test_tensorboard_scalars_match_mortal_tags():
    st = Stat.from_log(LOG_A.read_text(), 0)
    tb = st.tensorboard_scalars()
    assert set(tb) == {
        'test_play/avg_ranking', 'test_play/avg_pt', 'test_play/ranking', 'test_play/behavior',
        'test_play/agari_point', 'test_play/houjuu_point', 'test_play/point_per_round',
        'test_play/key_step', 'test_play/riichi', 'test_play/riichi_point', 'test_play/fuuro',
        'test_play/fuuro_num', 'test_play/fuuro_point'}
    assert tb['test_play/avg_pt'] == 90.0
    assert tb['test_play/ranking'] == {'1st': 1.0, '2nd': 0.0, '3rd': 0.0, '4th': 0.0}
    assert tb['test_play/behavior'] == {'agari': 0.25, 'houjuu': 0.25, 'fuuro': 0.25,
                                        'riichi': 0.5}
    assert tb['test_play/key_step'] == {'agari_jun': 2.0, 'houjuu_jun': 3.0, 'riichi_jun': 1.5}
    assert tb['test_play/riichi_point'] == 4650.0

    calls = []

    class Writer:
        def add_scalar(self, tag, value, step):
            calls.append(('scalar', tag, value, step))

        def add_scalars(self, tag, values, step):
            calls.append(('scalars', tag, values, step))

    st.write_tensorboard(Writer(), 7)
    kinds = {tag: kind for kind, tag, _, _ in calls}
    assert kinds['test_play/avg_ranking'] == 'scalar'
    assert kinds['test_play/fuuro'] == 'scalars'
    assert len(calls) == 13 and all(c[3] == 7 for c in calls)


def test_display_table():
    text = str(Stat.from_log(LOG_A.read_text(), 0))
    lines = text.splitlines()
    assert lines[0] == 'Games            1'
    assert '1st (rate)       1 (1.000000)' in lines
    assert 'Total rank pt    90' in lines
    assert 'Avg round Δscore 1550.000000' in lines
    assert 'Avg winning Δscore as non-dealer NaN' in lines
    assert 'Avg riichi Δscore         4650.000000' in lines
    assert lines[-1] == 'Nagashi mangan (rate) 0 (0.000000000)'


@pytest.mark.slow
def test_cli_main_and_script_entry(tmp_path, capsys):
    shutil.copy(LOG_B, tmp_path / 'b.json')
    assert main([str(tmp_path), 'me', '--no-progress']) == 0
    out = capsys.readouterr().out
    assert 'Games            1' in out and 'Avg dama winning Δscore          2000.000000' in out
    # run as a script: must not shadow the stdlib `stat` module
    proc = subprocess.run([sys.executable, str(ROOT / 'mortal' / 'stat.py'), str(tmp_path), 'me',
                           '--no-progress'], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert 'Rounds as dealer 2' in proc.stdout


DOUBLE_RON = DATA_DIR / 'arena_double_ron_hanchan.json.gz'


def test_double_ron_counts_both_winners_and_two_houjuu():
    # arena log (see tests/test_gameplay.py): E2-1 (oya seat 1), seat 0's 4p is ronned by seat 1
    # (deltas -8000/+9000, riichi) and seat 2 (-1000/+1000, after pon F).
    raw = gzip.decompress(DOUBLE_RON.read_bytes()).decode()
    st2 = Stat.from_file(DOUBLE_RON, 'rule_a')  # seat 2
    assert (st2.agari, st2.agari_point_ko, st2.fuuro_agari, st2.fuuro_agari_point) == (1, 1000, 1, 1000)
    assert (st2.point, st2.rank_4, st2.tobi) == (-2900 - 25000, 1, 1)
    st1 = Stat.from_log(raw, 1)  # hora at lines 271, 360, 565, 726, 817, 922
    assert st1.agari == 6 and st1.rank_1 == 1
    st0 = Stat.from_log(raw, 0)
    # houjuu: line 271 to oya seat 1 (-5800), then both rons of the double ron
    assert (st0.houjuu, st0.houjuu_to_oya, st0.houjuu_point_to_oya, st0.houjuu_point_to_ko) == (3, 2, -13800, -1000)
    assert st0.point == 8600 - 25000
