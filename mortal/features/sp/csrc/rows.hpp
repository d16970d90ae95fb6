// One version-4 decision's single-player (SP) rows 889-1011 (123 x 34 float32), as Mortal's
// agent_helper.rs sets the search up and obs_repr.rs writes its tables: the search job from the
// decision's facts (tsumos left, haitei, double riichi, the accepted-riichi discard), the
// candidates sorted best first, the rows written; where no search runs, the value of winning
// now (the fallback). tests/sp_oracle/rows.py is the Python twin these rows are checked against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "calc.hpp"

namespace sp {

constexpr int kSpRows = 123;
constexpr int kRowRequired = 2;   // 68 rows (3n+2: +34 when the discard lowers the shanten), +69 (3n+1)
constexpr int kRowBest = 70;      // 3n+2: the discard with the most required tiles
constexpr int kRowTable = 72;     // 3 x 17 rows: tenpai, win, EV by turn

// What a decision needs besides its search input: the seat's facts at the decision.
struct Decision {
    bool search = false;         // false: write the fallback value only
    bool can_discard = false;    // of the seat's options (the layout), not of the search
    bool by_ev = false;          // sort by EV (the full search ran, shanten <= 3)
    int last_tsumo = -1;         // accepted riichi: the one candidate is this drawn tile
    // the fallback (no search): Mortal's agari_points(can_ron, []) of winning now
    bool can_ron = false, can_tsumo = false, is_oya = false, w_riichi_tsumo = false;
    int win_tile = -1;           // id 0-36 of the winning tile, -1 if none
    int extra_han = 0, doras = 0;
    Hand hand{};                 // the winning hand (3n+2), winning tile set
};

inline int num_required(const Candidate& c) {
    int n = 0;
    for (const auto& r : c.required) n += r.second;
    return n;
}

// Columns 3-6 of Mortal's candidate order: not shanten-down, more required tiles, discard priority.
inline int cmp_by_required(const Candidate& l, const Candidate& r) {
    if (l.tile == r.tile) return 0;
    if (l.shanten_down != r.shanten_down) return l.shanten_down ? -1 : 1;
    const int a = num_required(l), b = num_required(r);
    if (a != b) return a > b ? 1 : -1;
    return cmp_discard_priority(l.tile, r.tile);
}

// Mortal's order, best first: by EV, win and tenpai probability of the first turn when by_ev, then as above.
inline void sort_candidates(std::vector<Candidate>& cands, bool by_ev) {
    std::stable_sort(cands.begin(), cands.end(), [by_ev](const Candidate& l, const Candidate& r) {
        if (by_ev) {
            if (l.values.ev[0] != r.values.ev[0]) return l.values.ev[0] > r.values.ev[0];
            if (l.values.win[0] != r.values.win[0]) return l.values.win[0] > r.values.win[0];
            if (l.values.tenpai[0] != r.values.tenpai[0]) return l.values.tenpai[0] > r.values.tenpai[0];
        }
        return cmp_by_required(l, r) > 0;
    });
}

inline void fill_ev(float* rows, double value) {
    const double v = std::min(std::max(value, 0.0), 100000.0) / 100000.0;
    const double w = std::min(std::max(value, 0.0), 30000.0) / 30000.0;
    for (int c = 0; c < 34; ++c) {
        rows[c] = static_cast<float>(v);
        rows[34 + c] = static_cast<float>(w);
    }
}

// Rows 0-122 (zeroed first) from the sorted, non-empty candidates.
inline void fill_rows(const std::vector<Candidate>& cands, int T, bool can_discard, float* rows) {
    std::memset(rows, 0, sizeof(float) * kSpRows * 34);
    const Candidate& first = cands[0];
    const double max_ev = first.has_values ? first.values.ev[0] : 0.0;
    fill_ev(rows, max_ev);
    if (can_discard) {
        const Candidate* best = &cands[0];
        for (const Candidate& c : cands) {
            float* row = rows + 34 * (kRowRequired + (c.shanten_down ? 34 : 0) + deaka(c.tile));
            for (const auto& r : c.required) row[r.first] = 1.0f;
            if (cmp_by_required(c, *best) > 0) best = &c;
        }
        rows[34 * kRowBest + deaka(best->tile)] = 1.0f;
    } else {
        for (const auto& r : first.required) rows[34 * (kRowRequired + 69) + r.first] = 1.0f;
    }
    if (!first.has_values || !(first.values.tenpai[0] > 0.0)) return;  // simple path, or all zero
    const double scale = max_ev < 1.0 ? 0.0 : 1.0 / max_ev;
    const size_t n_cands = can_discard ? cands.size() : 1;
    for (size_t k = 0; k < n_cands; ++k) {
        const Candidate& c = cands[k];
        int n = 0;  // turns up to the first zero tenpai probability
        while (n < T && c.values.tenpai[n] > 0.0) ++n;
        const int lo = can_discard ? deaka(c.tile) : 0, hi = can_discard ? lo + 1 : 34;
        for (int i = 0; i < n; ++i) {
            const float tp = static_cast<float>(c.values.tenpai[i]);
            const float wp = static_cast<float>(c.values.win[i]);
            const float ev = static_cast<float>(std::min(c.values.ev[i] * scale, 1.0));
            for (int col = lo; col < hi; ++col) {
                rows[34 * (kRowTable + i) + col] = tp;
                rows[34 * (kRowTable + kMaxTsumosLeft + i) + col] = wp;
                rows[34 * (kRowTable + 2 * kMaxTsumosLeft + i) + col] = ev;
            }
        }
    }
}

// Tsumo total of the fallback (0 when it cannot win now or has no yaku).
inline double fallback_value(const Decision& d) {
    if (!(d.can_ron || d.can_tsumo)) return 0.0;
    if (d.w_riichi_tsumo) return yakuman_tsumo_total(d.is_oya, 1);
    if (d.win_tile < 0) return 0.0;
    Yaku y{};
    if (!agari(d.hand, d.extra_han, d.doras, &y)) return 0.0;
    return y.yakuman ? yakuman_tsumo_total(d.is_oya, y.yakuman) : tsumo_total(d.is_oya, y.fu, y.han);
}

}  // namespace sp
