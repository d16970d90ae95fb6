"""Test oracle: rows 889-1011 of a version-4 observation computed the old way, in Python around the core's
``sp_calc`` (the path ``mortal.features.obs_v4`` took before ``_core.sp_rows`` did it all in C++): the decision's
context and search job as Mortal's ``agent_helper.rs`` sets them up, the candidates sorted in Python, the rows
written with numpy, the fallback value (``min_tsumo_agari``) where no search runs.

``old_sp_rows(enc, state)`` reads the kyoku facts of a ``mortal.features.obs_v4.V4Encoder`` (which keeps tracking
them) and its seat's ``PlayerState``.
"""

from __future__ import annotations

import numpy as np

from mortal.features.tile import tile_id
from sp_oracle.core_py import (MAX_TSUMOS_LEFT, SHANTEN_THRES, Hand, SPCalculator, _candidates, agari,
                               best_by_required, calc_all, deaka, next_tile, sort_candidates)
from sp_oracle.point import yaku_point, yakuman_point

SP_ROWS = 123
SP_EV = 0
SP_REQUIRED = 2
SP_BEST = 70
SP_TABLE = 72


def context(enc, state):
    """Facts shared by the search job and the fallback value."""
    tehai = list(state.tehai)
    akas = list(state.akas_in_hand)
    chis, pons = list(state.chis), list(state.pons)
    minkans, ankans = list(state.minkans), list(state.ankans)
    is_menzen = not (chis or pons or minkans)
    factor = [0] * 34
    for ind in enc.dora_indicators:
        factor[next_tile(ind)] += 1
    doras_owned = (sum(tehai[t] * factor[t] for t in range(34)) + sum(akas)
                   + sum(factor[deaka(t)] + (t >= 34) for t in enc.own_fuuro_tiles))
    return tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned


def sp_job(enc, state, ctx):
    """``(SPCalculator, calc args, last tsumo or None)`` for this decision, or None (no search)."""
    tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned = ctx
    tehai, akas = list(tehai), list(akas)
    cans = state.last_cans
    tiles_left = enc.tiles_left
    if tiles_left < 4:
        return None
    len_div3 = 4 - len(chis) - len(pons) - len(minkans) - len(ankans)
    can_discard = cans.can_discard
    cur_shanten = calc_all(tehai, len_div3) if can_discard else max(calc_all(tehai, len_div3), 0)
    if cur_shanten < 0:
        return None
    if can_discard:
        tsumos_left, haitei = tiles_left // 4, tiles_left % 4 == 0
    else:
        target = (cans.target_actor - enc.player_id) % 4
        nxt = max(tiles_left - (4 - target), 0)
        tsumos_left, haitei = nxt // 4, nxt % 4 == 0
    if tsumos_left < 1:
        return None
    if is_menzen and not ankans:
        in_fuuro = 0
    else:
        in_tehai = sum(tehai[next_tile(i)] for i in enc.dora_indicators)
        in_fuuro = doras_owned - in_tehai - sum(akas)
    last_tsumo = None
    if can_discard and state.self_riichi_accepted:
        last_tsumo = tile_id(state.last_self_tsumo())
        tehai[deaka(last_tsumo)] -= 1
        if last_tsumo >= 34:
            akas[last_tsumo - 34] = False
        can_discard = False
    calc = SPCalculator(
        tehai_len_div3=len_div3, chis=chis, pons=pons, minkans=minkans, ankans=ankans,
        bakaze=state.bakaze, jikaze=state.jikaze, is_menzen=is_menzen,
        num_doras_in_fuuro=in_fuuro, dora_indicators=enc.dora_indicators,
        calc_double_riichi=cans.can_discard and state.can_w_riichi,
        calc_haitei=haitei, prefer_riichi=state.scores[0] >= 1000,
    )
    args = (tehai, akas, list(state.tiles_seen), enc.akas_seen, can_discard,
            min(tsumos_left, MAX_TSUMOS_LEFT), cur_shanten)
    return calc, args, last_tsumo


def min_tsumo_agari(enc, state, ctx) -> float:
    """Tsumo total of winning now without uradora (Mortal ``agari_points(can_ron, [])``), else 0."""
    tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned = ctx
    tehai = list(tehai)
    cans = state.last_cans
    is_ron = cans.can_ron_agari
    if not (is_ron or cans.can_tsumo_agari):
        return 0.0
    is_oya = state.is_oya
    if not is_ron and state.can_w_riichi:
        return float(yakuman_point(is_oya, 1).tsumo_total(is_oya))
    name = state.last_kawa_tile() if is_ron else state.last_self_tsumo()
    if name is None:
        return 0.0
    win = tile_id(name)
    riichi = state.self_riichi_accepted
    chankan = enc.pending_kakan and is_ron
    ippatsu = enc.at_ippatsu and not (enc.pending_kakan and not is_ron)
    last = enc.tiles_left == 0
    if is_ron:
        extra = riichi + enc.is_w_riichi + ippatsu + last + chankan
        tehai[deaka(win)] += 1
        doras_owned += factor[deaka(win)] + (win >= 34)
    else:
        extra = (riichi + enc.is_w_riichi + ippatsu + is_menzen
                 + (last and not enc.at_rinshan) + enc.at_rinshan)
    hand = Hand(tuple(tehai), is_menzen, tuple(chis), tuple(pons), tuple(minkans),
                tuple(ankans), state.bakaze, state.jikaze, deaka(win), is_ron)
    y = agari(hand, int(extra), doras_owned)
    if y is None:
        return 0.0
    return float(yaku_point(is_oya, y).tsumo_total(is_oya))


def encode_ev(rows, value: float) -> None:
    rows[SP_EV] = min(max(value, 0.0), 100000.0) / 100000.0
    rows[SP_EV + 1] = min(max(value, 0.0), 30000.0) / 30000.0


def fill_sp_tables(tables, can_discard: bool, rows) -> None:
    """The rows (zero) from the sorted, non-empty candidate ``tables``."""
    max_ev = tables[0].exp_values[0] if tables[0].exp_values else 0.0
    encode_ev(rows, max_ev)
    if can_discard:
        for c in tables:
            row = SP_REQUIRED + (34 if c.shanten_down else 0) + deaka(c.tile)
            for r, _ in c.required_tiles:
                rows[row, r] = 1.0
        rows[SP_BEST, deaka(best_by_required(tables).tile)] = 1.0
    else:
        for r, _ in tables[0].required_tiles:
            rows[SP_REQUIRED + 69, r] = 1.0
    first = tables[0]
    if not first.tenpai_probs or not first.tenpai_probs[0] > 0.0:
        return  # probabilities not computed (shanten >= 4) or all zero
    scale = 0.0 if max_ev < 1.0 else 1.0 / max_ev
    for c in (tables if can_discard else [first]):
        col = deaka(c.tile) if can_discard else slice(None)
        tp = np.asarray(c.tenpai_probs)
        n = len(tp) if (tp > 0.0).all() else int(np.argmin(tp > 0.0))  # turns up to the first zero
        if n == 0:
            continue
        wp = np.asarray(c.win_probs[:n])
        ev = np.minimum(np.asarray(c.exp_values[:n]) * scale, 1.0)
        for k, v in enumerate((tp[:n], wp, ev)):
            start = SP_TABLE + k * MAX_TSUMOS_LEFT
            rows[start:start + n, col] = v[:, None] if not can_discard else v


# (v4 start, v3 start, rows) of the rows copied as they are (Mortal's obs_repr.rs, version 4)
_V3_BLOCKS = ((0, 0, 4), (4, 4, 3), (15, 47, 4), (19, 51, 4), (25, 59, 2), (27, 61, 1), (28, 62, 7), (35, 69, 683),
              (722, 764, 1), (723, 768, 166))


def old_repack_v3(v3, scores, honba: int, kyotaku: int) -> np.ndarray:
    """Rows 0-888 of the version-4 observation, (889, 34) float32, from the v3 one as numpy did it."""
    out = np.zeros((889, 34), dtype=np.float32)
    for start, src, n in _V3_BLOCKS:
        out[start:start + n] = v3[src:src + n]
    for p, s in enumerate(scores):
        out[7 + 2 * p] = v3[7 + 10 * p]
        out[8 + 2 * p] = min(max(s, 0), 30000) / 30000.0
    out[23] = min(honba, 10) / 10.0
    out[24] = min(kyotaku, 10) / 10.0
    for p in range(4):
        out[718 + p] = v3[752 + 3 * p]
    return out


def old_sp_rows(enc, state) -> np.ndarray:
    """Rows 889-1011 of ``state``'s decision, (123, 34) float32, computed the old way."""
    rows = np.zeros((SP_ROWS, 34), dtype=np.float32)
    ctx = context(enc, state)
    job = sp_job(enc, state, ctx)
    if job is None:
        encode_ev(rows, min_tsumo_agari(enc, state, ctx))
        return rows
    calc, args, last_tsumo = job
    raw = require_core_sp_calc(calc.core_args(*args))
    tables = sort_candidates(_candidates(raw), args[6] <= SHANTEN_THRES)
    if last_tsumo is not None:  # accepted riichi: the one candidate is the drawn tile
        tables[0].tile = last_tsumo
    fill_sp_tables(tables, state.last_cans.can_discard, rows)
    return rows


def require_core_sp_calc(args):
    from mortal.features.sp.calc import require_core
    return require_core().sp_calc(*args)
