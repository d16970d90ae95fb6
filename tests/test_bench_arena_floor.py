"""bench/arena_floor.py: the floor's table-action mapping on actions worked out by hand, and a tiny run that prints
the figures of both loops."""

import re

from riichienv import Action, ActionType

from conftest import load_script


def _module():
    return load_script('bench/arena_floor.py', 'arena_floor_bench')


def test_mortal_index_of_table_actions():
    idx = _module().mortal_index
    # riichienv tiles: id // 4 is the kind; 16, 52, 88 are the red fives (Mortal 34, 35, 36)
    assert idx(Action(ActionType.Discard, 9, [], 0)) == 2  # 3m
    assert idx(Action(ActionType.Discard, 17, [], 0)) == 4  # a plain 5m
    assert idx(Action(ActionType.Discard, 16, [], 0)) == 34  # the red 5m
    assert idx(Action(ActionType.Discard, 88, [], 0)) == 36  # the red 5s
    # chi of 4m (kind 3): with 5m 6m it is the low tile (38), with 3m 5m the middle (39), with 2m 3m the high (40)
    assert idx(Action(ActionType.Chi, 12, [17, 20], 0)) == 38
    assert idx(Action(ActionType.Chi, 12, [8, 16], 0)) == 39
    assert idx(Action(ActionType.Chi, 12, [4, 8], 0)) == 40
    assert idx(Action(ActionType.Riichi, None, [], 0)) == 37
    assert idx(Action(ActionType.Pon, 12, [13, 14], 0)) == 41
    assert idx(Action(ActionType.Kakan, 12, [13, 14, 15], 0)) == 42
    assert idx(Action(ActionType.Ron, 12, [], 0)) == 43
    assert idx(Action(ActionType.Tsumo, 12, [], 0)) == 43
    assert idx(Action(ActionType.KyushuKyuhai, None, [], 0)) == 44
    assert idx(Action(ActionType.Pass, None, [], 0)) == 45


def test_a_tiny_run_prints_floor_arena_and_ratio(tmp_path, capsys):
    out = _module().main(['--versions', '3', '--games', '4', '--rounds', '1', '--json', str(tmp_path / 'f.json')])
    text = capsys.readouterr().out
    m = re.search(r'v3: floor ([\d.]+) µs/decision, arena ([\d.]+) µs/decision, floor/arena ([\d.]+)', text)
    assert m, text
    floor, arena, ratio = map(float, m.groups())
    assert floor > 0 and arena > 0 and abs(ratio - floor / arena) < 0.002
    assert out[0]['version'] == 3 and out[0]['games'] == 4 and len(out[0]['arena_us']) == 1
    # a hanchan takes hundreds of decisions: 4 of them well over 1,000 in each loop
    assert re.search(r'floor +[\d.]+ µs/decision \((\d{4,}) decisions', text)
    assert re.search(r'arena +[\d.]+ µs/decision \((\d{4,}) decisions', text)
    assert re.search(r'CPU time: floor/arena [\d.]+', text) and out[0]['cpu_ratio'][0] > 0
    assert (tmp_path / 'f.json').read_text().startswith('[')


def test_profile_grouping_by_function_and_source_line(tmp_path):
    prof = load_script('bench/arena_profile.py', 'arena_profile_bench')
    tree = tmp_path / 'tree'
    (tree / 'mortal' / 'play').mkdir(parents=True)
    (tree / 'mortal' / 'play' / 'arena.py').write_text('x = 1\n        obs = self.env.step(actions)\n')
    top = 'main (x.py:1);OneVsThree.py_vs_py (mortal/play/arena.py:1)'
    raw = [f'{top};_Game.commit (mortal/play/arena.py:2) 3\n',  # the line's text: the table step
           f'{top};_feed (mortal/play/arena.py:1) 2\n',  # the function's name: PlayerState.update
           f'{top};_LockStep.run (mortal/play/arena.py:1) 5\n',  # neither: bookkeeping
           'Thread._bootstrap (threading.py:1);OneVsThree.py_vs_py (mortal/play/arena.py:1) 7\n',  # another thread
           'main (x.py:1) 9\n']  # outside the arena loop
    cats, total = prof.categorize(raw, str(tree))
    assert total == 10
    assert cats == {'table step (riichienv)': 3, 'PlayerState.update': 2, 'lock-step bookkeeping (the rest)': 5}


def test_loading_the_zero_cost_engine_keeps_the_other_tree_first(monkeypatch):
    """``--tree OTHER`` puts OTHER first on sys.path before ``mortal`` is imported; loading ``bench/arena.py``'s
    ``FirstLegal`` used to replace that entry with this checkout, so ``--against`` compared a tree with itself."""
    import sys
    mod = _module()
    monkeypatch.setattr(sys, "path", ["/other/checkout"] + sys.path)
    cls = mod._first_legal_cls()
    assert sys.path[0] == "/other/checkout"
    assert cls.__name__ == "FirstLegal"


def test_the_bare_loop_plays_the_floors_decisions_and_logs_their_meta(tmp_path, capsys):
    """``bare_run`` plays the floor's tables: the same decisions; its log has Mortal's meta on the reactions the
    engine chose (Q values of exactly the legal actions) and none on quick-eval discards."""
    import gzip
    import json

    from mortal.features.action import event_to_label

    mod = _module()
    _, n_floor, _ = mod.floor_run(3, 1)
    _, n_bare, _ = mod.bare_run(3, 1, str(tmp_path))
    assert n_bare == n_floor > 300
    for rows in ('dropped', 'packed'):  # the same games whatever it does with the rows
        assert mod.bare_run(3, 1, str(tmp_path / rows), rows=rows)[1] == n_floor
    with gzip.open(tmp_path / '0.json.gz', 'rt') as f:
        events = [json.loads(line) for line in f]
    kinds = [e['type'] for e in events]
    assert kinds.count('start_kyoku') == kinds.count('end_kyoku') >= 1
    logged = [e for e in events if 'meta' in e]
    assert logged and all(list(e['meta']) == ['q_values', 'mask_bits', 'is_greedy', 'shanten', 'at_furiten',
                                              'batch_size', 'eval_time_ns'] for e in logged)
    # the action taken is legal under the logged mask, and the lowest legal one (the floor's policy)
    labels = [event_to_label(e) for e in logged]
    assert all(m['mask_bits'] >> a & 1 and m['mask_bits'] & ((1 << a) - 1) == 0
               for a, m in zip(labels, (e['meta'] for e in logged)))
    dahai = [e for e in events if e['type'] == 'dahai']
    assert 0 < sum('meta' not in e for e in dahai) < len(dahai)  # quick eval: one legal discard, no meta
    out = mod.main(['--versions', '3', '--games', '4', '--rounds', '1', '--bare'])
    text = capsys.readouterr().out
    for rows in ('held', 'dropped', 'packed'):
        assert re.search(rf'v3: CPU time: floor/bare \(rows {rows}\) [\d.]+ \(rounds .*\), bare/arena [\d.]+', text)
        assert out[0][f'bare_{rows}']['floor_bare_cpu'][0] > 0
