// Points of a win from fu and han: the compiled twin of mortal/features/sp/point.py
// (Tenhou rule, no kiriage mangan, as Mortal's algo/point.rs).
#pragma once

namespace sp {

inline int ceil100(int v) { return (v + 99) / 100 * 100; }

// Base points: fu * 2^(2+han) capped at mangan (2000); 3000 for 6-7 han,
// 4000 for 8-10, 6000 for 11-12 and 8000 (counted yakuman) from 13 han.
inline int base_points(int fu, int han) {
    if (han >= 13) return 8000;
    if (han >= 11) return 6000;
    if (han >= 8) return 4000;
    if (han >= 6) return 3000;
    if (han >= 5) return 2000;
    const int b = fu * (1 << (2 + han));
    return b < 2000 ? b : 2000;
}

// Total points a tsumo win collects, without honba.
inline int tsumo_total(bool is_oya, int fu, int han) {
    const int base = base_points(fu, han);
    if (is_oya) return ceil100(base * 2) * 3;
    return ceil100(base) * 2 + ceil100(base * 2);
}

// Tsumo total of `count` yakuman.
inline int yakuman_tsumo_total(bool is_oya, int count) {
    return is_oya ? 16000 * count * 3 : (8000 * 2 + 16000) * count;
}

}  // namespace sp
