// Yaku, fu and han of a winning hand: the compiled twin of tests/sp_oracle/agari.py
// (Tenhou rule, with the semantics of Mortal's algo/agari.rs, quirks included:
// 4-fu double-wind pair, dora only with a yaku, best-fu fallback for a win that
// only additional_hans make possible, no double yakuman for a single yakuman).
// Verified against the Python case by case: identical results on ~60k hands
// (random winning hands of every yaku shape, every complete one-suit hand,
// near-misses and random non-winning hands, with and without calls).
//
// Header-only, no heap allocation, no exceptions. Divisions of the concealed
// tiles are enumerated canonically (each pung/chow multiset once) and scored on
// the fly; the Python reference deduplicates the same multisets, so the best
// score is the same.
//
// Preconditions (always true for hands from a real game): tile ids 0-33,
// bakaze/jikaze 27-30, n_chis/n_pons/n_minkans/n_ankans <= 4 (larger values are
// clamped to 4), the concealed part holds at most 14 tiles (more gives false).
//
// The kokushi test uses sp::calc_kokushi from shanten.hpp.
#pragma once

#include <cstdint>

#include "shanten.hpp"

namespace sp {

struct Hand {
    uint8_t tehai[34];  // concealed counts by deaka'd id, incl. the winning tile (3n+2)
    bool is_menzen;
    uint8_t n_chis, n_pons, n_minkans, n_ankans;
    uint8_t chis[4], pons[4], minkans[4], ankans[4];  // deaka'd ids; chi = lowest tile
    uint8_t bakaze, jikaze;                           // 27-30
    uint8_t winning_tile;                             // deaka'd 0-33
    bool is_ron;
};

// yakuman > 0: a yakuman hand (han and fu are then 0).
struct Yaku {
    int yakuman;
    int han;
    int fu;
};

namespace agari_detail {

constexpr int kP = 31, kF = 32, kC = 33;  // haku, hatsu, chun
constexpr int kMaxMelds = 4;

inline bool yaokyuu(int t) { return t >= 27 || t % 9 == 0 || t % 9 == 8; }
inline bool sangen(int t) { return t == kP || t == kF || t == kC; }
inline bool simple(int t) { return t < 27 && t % 9 != 0 && t % 9 != 8; }
inline int clamp4(int n) { return n < 4 ? n : 4; }

// One division of the concealed tiles (agari.py Div); kotsu/shuntsu ascending.
struct Div {
    int pair;
    int n_kotsu, n_shuntsu;
    uint8_t kotsu[kMaxMelds];
    uint8_t shuntsu[kMaxMelds];  // first tile of each chow
    bool chitoi, chuuren, ittsuu, ryanpeikou, ipeikou;
    uint8_t chitoi_pairs[7];
};

// The whole 14-tile hand is 1112345678999 + one more of a single suit.
inline bool is_chuuren(const uint8_t* counts) {
    for (int suit = 0; suit < 3; ++suit) {
        const uint8_t* p = counts + suit * 9;
        int sum = 0;
        for (int i = 0; i < 9; ++i) sum += p[i];
        if (sum != 14 || p[0] < 3 || p[8] < 3) continue;
        bool ok = true;
        for (int i = 1; i < 8; ++i) ok = ok && p[i] >= 1;
        if (ok) return true;
    }
    return false;
}

// Mortal's division table omits a pung directly below three identical chows
// (666 789x3); agari.py _listed.
inline bool listed(const Div& d) {
    for (int a = 0; a < d.n_kotsu; ++a) {
        const int k = d.kotsu[a];
        if (k >= 27 || k % 9 >= 8) continue;
        int n = 0;
        for (int b = 0; b < d.n_shuntsu; ++b) n += d.shuntsu[b] == k + 1;
        if (n >= 3) return false;
    }
    return true;
}

inline bool contains(const uint8_t* xs, int n, int v) {
    for (int i = 0; i < n; ++i)
        if (xs[i] == v) return true;
    return false;
}

// Ron on a tile that completes a pung which no chow of the division could have
// taken instead (agari.py _winning_tile_makes_minkou).
inline bool winning_tile_makes_minkou(const Hand& h, const Div& d) {
    const int w = h.winning_tile;
    if (!h.is_ron || !contains(d.kotsu, d.n_kotsu, w)) return false;
    if (w >= 27) return true;
    const int kind = w / 9, num = w % 9;
    const int low = kind * 9 + (num - 2 > 0 ? num - 2 : 0);
    const int high = kind * 9 + (num < 6 ? num : 6);
    for (int i = 0; i < d.n_shuntsu; ++i)
        if (low <= d.shuntsu[i] && d.shuntsu[i] <= high) return false;
    return true;
}

inline int calc_fu(const Hand& h, const Div& d, bool minkou, bool has_pinfu) {
    if (d.chitoi) return 25;
    const int w = h.winning_tile;
    int fu = 20;
    for (int i = 0; i < d.n_kotsu; ++i) {
        const int t = d.kotsu[i];
        const bool yao = yaokyuu(t);
        if (minkou && t == w)
            fu += yao ? 4 : 2;
        else
            fu += yao ? 8 : 4;
    }
    for (int i = 0; i < clamp4(h.n_pons); ++i) fu += yaokyuu(h.pons[i]) ? 4 : 2;
    for (int i = 0; i < clamp4(h.n_ankans); ++i) fu += yaokyuu(h.ankans[i]) ? 32 : 16;
    for (int i = 0; i < clamp4(h.n_minkans); ++i) fu += yaokyuu(h.minkans[i]) ? 16 : 8;
    if (sangen(d.pair)) {
        fu += 2;
    } else {
        if (d.pair == h.bakaze) fu += 2;
        if (d.pair == h.jikaze) fu += 2;
    }
    if (fu == 20) {
        if (!h.is_menzen) return 30;
        if (has_pinfu) return h.is_ron ? 30 : 20;
        return h.is_ron ? 40 : 30;
    }
    if (!h.is_ron)
        fu += 2;
    else if (h.is_menzen)
        fu += 10;
    if (!minkou) {
        if (d.pair == w) {
            fu += 2;
        } else {
            for (int i = 0; i < d.n_shuntsu; ++i) {
                const int s = d.shuntsu[i];
                if (s + 1 == w || (s % 9 == 0 && s + 2 == w) || (s % 9 == 6 && s == w)) {
                    fu += 2;  // kanchan, penchan
                    break;
                }
            }
        }
    }
    return ((fu - 1) / 10 + 1) * 10;
}

// Yaku of one division (agari.py _score_div with any_only=False); false = no yaku.
inline bool score_div(const Hand& h, const Div& d, Yaku* out) {
    int han = 0, yakuman = 0;
    const int w = h.winning_tile;
    const bool minkou = winning_tile_makes_minkou(h, d);
    const int pair = d.pair;
    const int menzen = h.is_menzen ? 1 : 0;
    const int n_chis = clamp4(h.n_chis);

    bool has_pinfu = false;
    if (d.n_shuntsu == 4 && !sangen(pair) && pair != h.bakaze && pair != h.jikaze) {
        for (int i = 0; i < d.n_shuntsu && !has_pinfu; ++i) {
            const int s = d.shuntsu[i];
            has_pinfu = (s % 9 + 1 <= 6 && s == w) || (s % 9 + 1 >= 2 && s + 2 == w);
        }
    }
    if (has_pinfu) han += 1;
    if (d.chitoi) han += 2;
    if (d.ryanpeikou) han += 3;
    if (d.chuuren) yakuman += 1;

    // every pung/kan and chow of the hand, concealed part first
    uint8_t all_kotsu[4 * kMaxMelds];
    int nk = 0;
    for (int i = 0; i < d.n_kotsu; ++i) all_kotsu[nk++] = d.kotsu[i];
    for (int i = 0; i < clamp4(h.n_pons); ++i) all_kotsu[nk++] = h.pons[i];
    for (int i = 0; i < clamp4(h.n_minkans); ++i) all_kotsu[nk++] = h.minkans[i];
    for (int i = 0; i < clamp4(h.n_ankans); ++i) all_kotsu[nk++] = h.ankans[i];
    uint8_t all_shuntsu[2 * kMaxMelds];
    int ns = 0;
    for (int i = 0; i < d.n_shuntsu; ++i) all_shuntsu[ns++] = d.shuntsu[i];
    for (int i = 0; i < n_chis; ++i) all_shuntsu[ns++] = h.chis[i];

    bool tanyao = true;
    if (d.chitoi) {
        for (int i = 0; i < 7; ++i) tanyao = tanyao && simple(d.chitoi_pairs[i]);
    } else {
        for (int i = 0; i < ns; ++i) tanyao = tanyao && all_shuntsu[i] % 9 > 0 && all_shuntsu[i] % 9 < 6;
        for (int i = 0; i < nk; ++i) tanyao = tanyao && simple(all_kotsu[i]);
        tanyao = tanyao && simple(pair);
    }
    if (tanyao) han += 1;

    const bool toitoi = !d.chitoi && d.n_shuntsu == 0 && n_chis == 0;
    if (toitoi) han += 2;

    // honitsu / chinitsu / tsuuiisou from the suit of every meld and the pair
    {
        int kinds = 0;
        bool has_jihai = false;
        auto mark = [&](int t) {
            if (t >= 27)
                has_jihai = true;
            else
                kinds |= 1 << (t / 9);
        };
        if (d.chitoi) {
            for (int i = 0; i < 7; ++i) mark(d.chitoi_pairs[i]);
        } else {
            for (int i = 0; i < nk; ++i) mark(all_kotsu[i]);
            for (int i = 0; i < ns; ++i) mark(all_shuntsu[i]);
            mark(pair);
        }
        if (kinds == 0)
            yakuman += 1;
        else if (kinds == 1 || kinds == 2 || kinds == 4)
            han += (has_jihai ? 2 : 5) + menzen;
    }

    if (!d.chitoi) {
        // iipeikou; with an ankan the concealed part is short of 14 tiles
        if (d.ipeikou) {
            han += 1;
        } else if (h.n_ankans > 0 && h.is_menzen && d.n_shuntsu >= 2) {
            bool dup = false;
            for (int i = 0; i < d.n_shuntsu && !dup; ++i)
                for (int j = i + 1; j < d.n_shuntsu && !dup; ++j) dup = d.shuntsu[i] == d.shuntsu[j];
            if (dup) han += 1;
        }

        // ittsuu
        if (h.is_menzen && d.ittsuu) {
            han += 2;
        } else if (n_chis == 0 && d.ittsuu) {
            han += 1;
        } else if (d.n_shuntsu + n_chis >= 3) {
            int marks[3] = {0, 0, 0};
            for (int i = 0; i < ns; ++i) {
                const int s = all_shuntsu[i];
                const int kind = s / 9, num = s % 9;
                if (kind > 2) continue;
                if (num == 0)
                    marks[kind] |= 1;
                else if (num == 3)
                    marks[kind] |= 2;
                else if (num == 6)
                    marks[kind] |= 4;
            }
            if (marks[0] == 7 || marks[1] == 7 || marks[2] == 7) han += 1;
        }

        // sanshoku doujun, else sanshoku doukou
        int s_counter[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < ns; ++i) s_counter[all_shuntsu[i] % 9] |= 1 << (all_shuntsu[i] / 9);
        bool doujun = false;
        for (int v : s_counter) doujun = doujun || v == 7;
        if (doujun) {
            han += h.is_menzen ? 2 : 1;
        } else {
            int k_counter[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
            for (int i = 0; i < nk; ++i)
                if (all_kotsu[i] < 27) k_counter[all_kotsu[i] % 9] |= 1 << (all_kotsu[i] / 9);
            bool doukou = false;
            for (int v : k_counter) doukou = doukou || v == 7;
            if (doukou) han += 2;
        }

        const int ankous = clamp4(h.n_ankans) + d.n_kotsu - (minkou ? 1 : 0);
        if (ankous == 4)
            yakuman += 1;  // suuankou
        else if (ankous == 3)
            han += 2;  // sanankou

        const int kans = clamp4(h.n_ankans) + clamp4(h.n_minkans);
        if (kans == 4)
            yakuman += 1;  // suukantsu
        else if (kans == 3)
            han += 2;  // sankantsu

        // ryuuiisou: 2346 8s and hatsu; the only green chow is 234s
        {
            auto green = [](int t) { return t == 19 || t == 20 || t == 21 || t == 23 || t == 25 || t == kF; };
            bool ok = green(pair);
            for (int i = 0; i < nk && ok; ++i) ok = green(all_kotsu[i]);
            for (int i = 0; i < ns && ok; ++i) ok = all_shuntsu[i] == 19;
            if (ok) yakuman += 1;
        }

        if (!tanyao) {
            bool jihai[7] = {false, false, false, false, false, false, false};
            for (int i = 0; i < nk; ++i)
                if (all_kotsu[i] >= 27 && all_kotsu[i] <= 33) jihai[all_kotsu[i] - 27] = true;
            const int ba = h.bakaze - 27, ji = h.jikaze - 27;
            if (ba >= 0 && ba < 7 && jihai[ba]) han += 1;
            if (ji >= 0 && ji < 7 && jihai[ji]) han += 1;
            const int n_sangen = jihai[4] + jihai[5] + jihai[6];
            if (n_sangen) {
                han += n_sangen;
                if (n_sangen == 3)
                    yakuman += 1;  // daisangen
                else if (n_sangen == 2 && sangen(pair))
                    han += 2;  // shousangen
            }
            const int winds = jihai[0] + jihai[1] + jihai[2] + jihai[3];
            if (winds == 4 || (winds == 3 && pair >= 27 && pair <= 30)) yakuman += 1;  // (shou|dai)suushii
        }
    }

    // chanta / junchan / honroutou / chinroutou
    if (!tanyao) {
        bool has_jihai = false, all_yao = true;
        auto visit = [&](int k) {
            if (k >= 27)
                has_jihai = true;
            else if (k % 9 != 0 && k % 9 != 8)
                all_yao = false;
        };
        if (d.chitoi) {
            for (int i = 0; i < 7 && all_yao; ++i) visit(d.chitoi_pairs[i]);
        } else {
            for (int i = 0; i < nk && all_yao; ++i) visit(all_kotsu[i]);
            if (all_yao) visit(pair);
        }
        if (all_yao) {
            if (d.chitoi || toitoi) {
                if (has_jihai)
                    han += 2;
                else
                    yakuman += 1;
            } else {
                bool ends = true;
                for (int i = 0; i < ns; ++i) ends = ends && (all_shuntsu[i] % 9 == 0 || all_shuntsu[i] % 9 == 6);
                if (ends) han += (has_jihai ? 1 : 2) + menzen;
            }
        }
    }

    if (yakuman) {
        *out = Yaku{yakuman, 0, 0};
        return true;
    }
    if (han) {
        *out = Yaku{0, han, han >= 5 ? 0 : calc_fu(h, d, minkou, has_pinfu)};
        return true;
    }
    return false;
}

// agari.py _better: more yakuman, else more (han, fu).
inline bool better(const Yaku& a, const Yaku& b) {
    if (a.yakuman || b.yakuman) return a.yakuman > b.yakuman;
    return a.han > b.han || (a.han == b.han && a.fu > b.fu);
}

// Running best over the divisions, plus the best plain fu of yaku-less ones.
struct Search {
    const Hand* h;
    bool full;
    bool chuuren;
    bool any_div = false;
    bool any_ryanpeikou = false;
    bool found = false;
    Yaku best{0, 0, 0};
    int fallback_fu = 0;

    void consider(const Div& d) {
        any_div = true;
        Yaku y;
        if (score_div(*h, d, &y)) {
            if (!found || better(y, best)) best = y;
            found = true;
        } else {
            const int fu = calc_fu(*h, d, winning_tile_makes_minkou(*h, d), false);
            if (fu > fallback_fu) fallback_fu = fu;
        }
    }

    // A complete pung/chow split of the concealed tiles minus the pair.
    void on_split(int pair, const uint8_t* kotsu, int nk, const uint8_t* shuntsu, int ns) {
        Div d;
        d.pair = pair;
        d.n_kotsu = nk;
        d.n_shuntsu = ns;
        for (int i = 0; i < nk; ++i) d.kotsu[i] = kotsu[i];
        for (int i = 0; i < ns; ++i) d.shuntsu[i] = shuntsu[i];
        if (!listed(d)) return;
        d.chitoi = false;
        d.chuuren = chuuren;
        d.ittsuu = false;
        for (int i = 0; i < ns; ++i) {
            const int s = shuntsu[i];
            if (s % 9 == 0 && contains(shuntsu, ns, s + 3) && contains(shuntsu, ns, s + 6)) d.ittsuu = true;
        }
        d.ryanpeikou = d.ipeikou = false;
        if (full && ns >= 2) {
            int dup = 0;  // shuntsu are ascending: count pairs within runs
            for (int i = 0; i < ns;) {
                int j = i;
                while (j < ns && shuntsu[j] == shuntsu[i]) ++j;
                dup += (j - i) / 2;
                i = j;
            }
            d.ryanpeikou = dup >= 2;
            d.ipeikou = dup == 1;
        }
        if (d.ryanpeikou) any_ryanpeikou = true;
        consider(d);
    }

    // Every way to take the lowest remaining tile as pungs and/or chows
    // starting at it; each pung/chow multiset is produced exactly once.
    void melds(uint8_t* counts, int start, int pair, uint8_t* kotsu, int nk, uint8_t* shuntsu, int ns) {
        int i = start;
        while (i < 34 && counts[i] == 0) ++i;
        if (i == 34) {
            on_split(pair, kotsu, nk, shuntsu, ns);
            return;
        }
        const int have = counts[i];
        const bool can_chow = i < 27 && i % 9 <= 6;
        for (int k = have / 3; k >= 0; --k) {
            const int c = have - 3 * k;
            if (nk + k + ns + c > kMaxMelds) continue;
            if (c > 0 && (!can_chow || counts[i + 1] < c || counts[i + 2] < c)) continue;
            for (int j = 0; j < k; ++j) kotsu[nk + j] = static_cast<uint8_t>(i);
            for (int j = 0; j < c; ++j) shuntsu[ns + j] = static_cast<uint8_t>(i);
            counts[i] = 0;
            if (c > 0) {
                counts[i + 1] = static_cast<uint8_t>(counts[i + 1] - c);
                counts[i + 2] = static_cast<uint8_t>(counts[i + 2] - c);
            }
            melds(counts, i + 1, pair, kotsu, nk + k, shuntsu, ns + c);
            counts[i] = static_cast<uint8_t>(have);
            if (c > 0) {
                counts[i + 1] = static_cast<uint8_t>(counts[i + 1] + c);
                counts[i + 2] = static_cast<uint8_t>(counts[i + 2] + c);
            }
        }
    }

    void run() {
        uint8_t counts[34];
        for (int i = 0; i < 34; ++i) counts[i] = h->tehai[i];
        uint8_t kotsu[kMaxMelds], shuntsu[kMaxMelds];
        for (int p = 0; p < 34; ++p) {
            if (counts[p] < 2) continue;
            counts[p] = static_cast<uint8_t>(counts[p] - 2);
            melds(counts, 0, p, kotsu, 0, shuntsu, 0);
            counts[p] = static_cast<uint8_t>(counts[p] + 2);
        }
        // seven pairs, unless the same tiles make ryanpeikou (which scores higher)
        if (full && !any_ryanpeikou) {
            Div d{};
            int n = 0;
            for (int i = 0; i < 34 && n < 8; ++i)
                if (counts[i] == 2) {
                    if (n < 7) d.chitoi_pairs[n] = static_cast<uint8_t>(i);
                    ++n;
                }
            if (n == 7) {
                d.pair = d.chitoi_pairs[0];
                d.chitoi = true;
                consider(d);
            }
        }
    }
};

}  // namespace agari_detail

// Final yaku of a winning hand with situational han (riichi, menzen tsumo,
// haitei, ...) and dora added; false where tests/sp_oracle/agari.py agari returns None
// (no yaku and additional_hans == 0, or not a winning shape). A yakuman hand
// gives {yakuman, 0, 0}; fu is 0 when han >= 5. Tenhou rule, as Mortal's
// algo/agari.rs. `out` must not be null; it is written only on true.
inline bool agari(const Hand& h, int additional_hans, int doras, Yaku* out) {
    using namespace agari_detail;
    if (h.is_menzen && calc_kokushi(h.tehai) == -1) {
        *out = Yaku{1, 0, 0};
        return true;
    }
    int total = 0;
    for (int i = 0; i < 34; ++i) total += h.tehai[i];
    if (total > 3 * kMaxMelds + 2) return false;  // outside the precondition

    Search s;
    s.h = &h;
    s.full = total == 14;
    s.chuuren = s.full && is_chuuren(h.tehai);
    s.run();

    if (s.found) {
        if (s.best.yakuman) {
            *out = s.best;
        } else {
            *out = Yaku{0, s.best.han + additional_hans + doras, s.best.fu};
        }
        return true;
    }
    if (additional_hans == 0) return false;
    if (additional_hans + doras >= 5) {
        *out = Yaku{0, additional_hans + doras, 0};
        return true;
    }
    if (!s.any_div) return false;
    *out = Yaku{0, additional_hans + doras, s.fallback_fu};
    return true;
}

}  // namespace sp
