"""The single-player search of one version-4 decision, as Mortal's ``agent_helper.rs`` sets it up: the hand's
context, the ``mortal.features.sp.calc.SPCalculator`` job (tsumos left, haitei, double riichi, the accepted-riichi
discard), the sorted candidate tables, the fallback value where no search runs (``min_tsumo_agari``), and the rows
889-1011 they fill (``mortal.features.obs_v4_rows``).

``SinglePlayerSearch`` is a part of ``mortal.features.obs_v4.V4Encoder`` (a base class beside
``mortal.features.obs_v4_kyoku.KyokuFacts``, whose facts it reads); running many searches together is
``mortal.features.obs_v4``'s.
"""

from __future__ import annotations

from mortal.features.obs_v4_rows import encode_ev, fill_sp_tables
from mortal.features.sp.calc import MAX_TSUMOS_LEFT, Hand, SPCalculator, agari, calc_all, deaka, next_tile
from mortal.features.sp.point import yaku_point, yakuman_point
from mortal.features.tile import tile_id


def _tid(name: str) -> int:
    return tile_id(name)


class SinglePlayerSearch:
    """One decision's single-player search, from a ``PlayerState`` and the kyoku facts of the host
    (``player_id``, ``dora_indicators``, ``akas_seen``, ``tiles_left``, ``own_fuuro_tiles``, ``is_w_riichi``,
    ``at_ippatsu``, ``at_rinshan``, ``pending_kakan``)."""

    def _context(self, state):
        """Facts shared by the SP block and the fallback value."""
        tehai = list(state.tehai)
        akas = list(state.akas_in_hand)
        chis, pons = list(state.chis), list(state.pons)
        minkans, ankans = list(state.minkans), list(state.ankans)
        is_menzen = not (chis or pons or minkans)
        factor = [0] * 34
        for ind in self.dora_indicators:
            factor[next_tile(ind)] += 1
        doras_owned = (sum(tehai[t] * factor[t] for t in range(34)) + sum(akas)
                       + sum(factor[deaka(t)] + (t >= 34) for t in self.own_fuuro_tiles))
        return tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned

    def _fill_sp(self, state, ctx, tables, obs) -> None:
        """Fill rows 889-1011 of ``obs`` (rows assumed zero) from the sorted ``tables`` (None: fallback)."""
        cans = state.last_cans
        if tables is None:
            value = self.min_tsumo_agari(state, ctx)
            encode_ev(obs, value)
            return
        fill_sp_tables(tables, cans.can_discard, obs)

    def single_player_tables(self, state, ctx=None):
        """Sorted SP candidates, or None where Mortal's ``single_player_tables`` fails.

        Fails (None) when fewer than 4 tiles are left, the hand is complete, or
        no own draw remains. Follows ``agent_helper.rs`` (tsumos left, haitei,
        prefer riichi at >= 1000 points, double riichi, accepted-riichi discard).
        """
        job = self._sp_job(state, self._context(state) if ctx is None else ctx)
        return None if job is None else self._finish_tables(job, job[0].calc(*job[1]))

    def _sp_job(self, state, ctx):
        """``(SPCalculator, calc args, last tsumo or None)`` for this decision, or None (no search)."""
        tehai, akas, chis, pons, minkans, ankans, is_menzen, factor, doras_owned = ctx
        tehai, akas = list(tehai), list(akas)
        cans = state.last_cans
        tiles_left = self.tiles_left
        if tiles_left < 4:
            return None
        len_div3 = 4 - len(chis) - len(pons) - len(minkans) - len(ankans)
        can_discard = cans.can_discard
        if can_discard:
            cur_shanten = calc_all(tehai, len_div3)
        else:
            cur_shanten = max(calc_all(tehai, len_div3), 0)
        if cur_shanten < 0:
            return None
        if can_discard:
            tsumos_left, haitei = tiles_left // 4, tiles_left % 4 == 0
        else:
            target = (cans.target_actor - self.player_id) % 4
            nxt = max(tiles_left - (4 - target), 0)
            tsumos_left, haitei = nxt // 4, nxt % 4 == 0
        if tsumos_left < 1:
            return None
        if is_menzen and not ankans:
            in_fuuro = 0
        else:
            in_tehai = sum(tehai[next_tile(i)] for i in self.dora_indicators)
            in_fuuro = doras_owned - in_tehai - sum(akas)
        riichi_discard = can_discard and state.self_riichi_accepted
        last_tsumo = None
        if riichi_discard:
            last_tsumo = _tid(state.last_self_tsumo())
            tehai[deaka(last_tsumo)] -= 1
            if last_tsumo >= 34:
                akas[last_tsumo - 34] = False
            can_discard = False
        calc = SPCalculator(
            tehai_len_div3=len_div3, chis=chis, pons=pons, minkans=minkans, ankans=ankans,
            bakaze=state.bakaze, jikaze=state.jikaze, is_menzen=is_menzen,
            num_doras_in_fuuro=in_fuuro, dora_indicators=self.dora_indicators,
            calc_double_riichi=cans.can_discard and state.can_w_riichi,
            calc_haitei=haitei, prefer_riichi=state.scores[0] >= 1000,
        )
        args = (tehai, akas, list(state.tiles_seen), self.akas_seen, can_discard,
                min(tsumos_left, MAX_TSUMOS_LEFT), cur_shanten)
        return calc, args, last_tsumo

    @staticmethod
    def _finish_tables(job, tables):
        if job[2] is not None:  # accepted riichi: the one candidate is the drawn tile
            tables[0].tile = job[2]
        return tables

    def min_tsumo_agari(self, state, ctx=None) -> float:
        """Tsumo total of winning now without uradora (Mortal ``agari_points(can_ron, [])``), else 0."""
        if ctx is None:
            ctx = self._context(state)
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
        win = _tid(name)
        riichi = state.self_riichi_accepted
        chankan = self.pending_kakan and is_ron
        ippatsu = self.at_ippatsu and not (self.pending_kakan and not is_ron)
        last = self.tiles_left == 0
        if is_ron:
            extra = riichi + self.is_w_riichi + ippatsu + last + chankan
            tehai[deaka(win)] += 1
            doras_owned += factor[deaka(win)] + (win >= 34)
        else:
            extra = (riichi + self.is_w_riichi + ippatsu + is_menzen
                     + (last and not self.at_rinshan) + self.at_rinshan)
        hand = Hand(tuple(tehai), is_menzen, tuple(chis), tuple(pons), tuple(minkans),
                    tuple(ankans), state.bakaze, state.jikaze, deaka(win), is_ron)
        y = agari(hand, int(extra), doras_owned)
        if y is None:
            return 0.0
        return float(yaku_point(is_oya, y).tsumo_total(is_oya))
