// Shanten numbers with the four-copies limit: the compiled twin of tests/sp_oracle/shanten.py.
//
// Shanten = least number of tiles to exchange to reach a complete hand whose
// counts never exceed four, minus one (the definition Mortal's algo/shanten.rs
// uses). Each numbered suit (9 counts) and the honours (7 counts) get a cost
// vector: entry m (0-4) = tiles to add for exactly m melds, entry 5+m = m melds
// plus a pair. Vectors are computed on first use by a small dynamic programme
// and kept in process-wide tables indexed by the base-5 count pattern, so the
// 2-million-entry table Mortal ships is never needed in full.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <cstring>
#include <vector>

namespace sp {

constexpr uint8_t kInf = 99;
constexpr int kSuitPatterns = 1953125;  // 5^9
constexpr int kHonorPatterns = 78125;   // 5^7

struct CostVec {
    uint8_t v[10];
};

// Cost vector of one numbered suit: chows allowed (port of _suit_costs).
inline CostVec suit_costs_slow(const uint8_t* counts) {
    // state index: c (chows started at the previous rank) * 250 + b (two ranks ago) * 50 + m * 2 + pair
    uint8_t cur[250], nxt[250];
    std::memset(cur, kInf, sizeof cur);
    cur[0] = 0;
    for (int i = 0; i < 9; ++i) {
        std::memset(nxt, kInf, sizeof nxt);
        const int have = counts[i];
        const bool can_chow = i <= 6;
        for (int s = 0; s < 250; ++s) {
            const uint8_t cost = cur[s];
            if (cost >= kInf) continue;
            const int b = s / 50, a = (s / 10) % 5, m = (s / 2) % 5, pr = s % 2;
            const int base = a + b;
            const int max_c = can_chow ? 4 - m : 0;
            for (int c = 0; c <= max_c; ++c) {
                for (int k = 0; k <= 1; ++k) {
                    if (m + c + k > 4) continue;
                    for (int q = 0; q <= (pr ? 0 : 1); ++q) {
                        const int need = base + c + 3 * k + 2 * q;
                        if (need > 4) continue;
                        const int add = need > have ? need - have : 0;
                        const int key = c * 50 + b * 10 + (m + c + k) * 2 + (pr | q);
                        const int v = cost + add;
                        if (v < nxt[key]) nxt[key] = static_cast<uint8_t>(v);
                    }
                }
            }
        }
        std::memcpy(cur, nxt, sizeof cur);
    }
    CostVec out;
    std::memset(out.v, kInf, sizeof out.v);
    for (int s = 0; s < 250; ++s) {
        const int b = s / 50, a = (s / 10) % 5, m = (s / 2) % 5, pr = s % 2;
        if (a || b) continue;  // a chow still open past rank 9
        const int j = 5 * pr + m;
        if (cur[s] < out.v[j]) out.v[j] = cur[s];
    }
    return out;
}

// Cost vector of the seven honours: pungs and pairs only (port of _honor_costs).
inline CostVec honor_costs_slow(const uint8_t* counts) {
    CostVec out;
    std::memset(out.v, kInf, sizeof out.v);
    out.v[0] = 0;
    for (int h = 0; h < 7; ++h) {
        const int have = counts[h];
        const int pung = have < 3 ? 3 - have : 0;
        const int pair = have < 2 ? 2 - have : 0;
        CostVec next = out;
        for (int j = 0; j < 10; ++j) {
            if (out.v[j] >= kInf) continue;
            const int m = j % 5, pr = j / 5;
            if (m < 4) next.v[j + 1] = std::min<int>(next.v[j + 1], out.v[j] + pung);
            if (!pr) next.v[j + 5] = std::min<int>(next.v[j + 5], out.v[j] + pair);
        }
        out = next;
    }
    return out;
}

// Lazily filled, process-wide tables of cost vectors by base-5 pattern index.
// Safe for concurrent searches: an entry is published through its ready flag
// (0 empty, 2 being written, 1 ready); a reader that finds it not ready
// computes the vector itself.
struct Tables {
    std::vector<CostVec> suit, honor;
    std::unique_ptr<std::atomic<uint8_t>[]> suit_ready, honor_ready;
    Tables()
        : suit(kSuitPatterns),
          honor(kHonorPatterns),
          suit_ready(new std::atomic<uint8_t>[kSuitPatterns]),
          honor_ready(new std::atomic<uint8_t>[kHonorPatterns]) {
        for (int i = 0; i < kSuitPatterns; ++i) suit_ready[i].store(0, std::memory_order_relaxed);
        for (int i = 0; i < kHonorPatterns; ++i) honor_ready[i].store(0, std::memory_order_relaxed);
    }
};

inline Tables& tables() {
    static Tables t;  // initialisation is thread-safe (C++11 static)
    return t;
}

// Cost vector of a group by its base-5 index (first count most significant).
inline CostVec group_costs(int idx, bool honors) {
    Tables& t = tables();
    std::atomic<uint8_t>& ready = honors ? t.honor_ready[idx] : t.suit_ready[idx];
    CostVec& entry = honors ? t.honor[idx] : t.suit[idx];
    if (ready.load(std::memory_order_acquire) == 1) return entry;
    uint8_t counts[9];
    const int n = honors ? 7 : 9;
    for (int i = n - 1, rest = idx; i >= 0; --i, rest /= 5) counts[i] = static_cast<uint8_t>(rest % 5);
    const CostVec v = honors ? honor_costs_slow(counts) : suit_costs_slow(counts);
    uint8_t empty = 0;
    if (ready.compare_exchange_strong(empty, 2, std::memory_order_acq_rel)) {
        entry = v;
        ready.store(1, std::memory_order_release);
    }
    return v;
}

inline int group_index(const uint8_t* counts, int n) {
    int idx = 0;
    for (int i = 0; i < n; ++i) idx = idx * 5 + counts[i];
    return idx;
}

inline CostVec suit_costs(const uint8_t* counts) { return group_costs(group_index(counts, 9), false); }

inline CostVec honor_costs(const uint8_t* counts) { return group_costs(group_index(counts, 7), true); }

// Cost vector of two groups together (entries up to L melds; the others stay kInf). L is a template
// argument so that the loops unroll: this runs six times for every hand a search meets.
template <int L>
inline CostVec combine_n(const CostVec& lhs, const CostVec& rhs) {
    CostVec out;
    std::memset(out.v, kInf, sizeof out.v);
    for (int i = 0; i <= L; ++i) {
        const int li = lhs.v[i], lpi = lhs.v[5 + i];
        for (int j = 0; j <= L - i; ++j) {
            const int ri = rhs.v[j], rpi = rhs.v[5 + j];
            const int s = i + j;
            int v = li + ri;
            if (v < out.v[s]) out.v[s] = static_cast<uint8_t>(std::min(v, 255));
            v = std::min(li + rpi, lpi + ri);
            if (v < out.v[5 + s]) out.v[5 + s] = static_cast<uint8_t>(std::min(v, 255));
        }
    }
    return out;
}

inline CostVec combine(const CostVec& lhs, const CostVec& rhs, int len_div3) {
    switch (len_div3) {
        case 0: return combine_n<0>(lhs, rhs);
        case 1: return combine_n<1>(lhs, rhs);
        case 2: return combine_n<2>(lhs, rhs);
        case 3: return combine_n<3>(lhs, rhs);
        default: return combine_n<4>(lhs, rhs);
    }
}

// Standard-form shanten for len_div3 melds plus a pair (-1 = complete).
inline int calc_normal(const uint8_t tehai[34], int len_div3) {
    CostVec v = suit_costs(tehai);
    v = combine(v, suit_costs(tehai + 9), len_div3);
    v = combine(v, suit_costs(tehai + 18), len_div3);
    v = combine(v, honor_costs(tehai + 27), len_div3);
    return static_cast<int>(v.v[5 + len_div3]) - 1;
}

inline int calc_chitoi(const uint8_t tehai[34]) {
    int pairs = 0, kinds = 0;
    for (int i = 0; i < 34; ++i) {
        if (tehai[i]) {
            ++kinds;
            if (tehai[i] >= 2) ++pairs;
        }
    }
    return 7 - pairs + std::max(0, 7 - kinds) - 1;
}

constexpr int kYaokyuu[13] = {0, 8, 9, 17, 18, 26, 27, 28, 29, 30, 31, 32, 33};

inline int calc_kokushi(const uint8_t tehai[34]) {
    int kinds = 0;
    bool pair = false;
    for (int i : kYaokyuu) {
        if (tehai[i]) {
            ++kinds;
            if (tehai[i] >= 2) pair = true;
        }
    }
    return 14 - kinds - (pair ? 1 : 0) - 1;
}

// Least of standard, seven pairs and thirteen orphans (the latter two only for a
// fully concealed hand, len_div3 == 4), exactly as tests/sp_oracle/shanten.py calc_all_py.
inline int calc_all(const uint8_t tehai[34], int len_div3) {
    int s = calc_normal(tehai, len_div3);
    if (s <= 0 || len_div3 < 4) return s;
    s = std::min(s, calc_chitoi(tehai));
    if (s > 0) return std::min(s, calc_kokushi(tehai));
    return s;
}

constexpr int kPow5[9] = {390625, 78125, 15625, 3125, 625, 125, 25, 5, 1};

// The cost vectors of a group's pattern and of each pattern one tile away (+1 / -1 at each position; entries
// that would leave 0-4 are not set).
struct Neighbours {
    CostVec self;
    CostVec plus[9], minus[9];
};

inline void fill_neighbours(int idx, bool honors, Neighbours* nb) {
    const int n = honors ? 7 : 9;
    nb->self = group_costs(idx, honors);
    int rest = idx;
    for (int p = n - 1; p >= 0; --p, rest /= 5) {
        const int c = rest % 5;
        const int step = kPow5[p + (honors ? 2 : 0)];
        if (c < 4) nb->plus[p] = group_costs(idx + step, honors);
        if (c > 0) nb->minus[p] = group_costs(idx - step, honors);
    }
}

// Neighbours by group pattern, direct-mapped (one cache per search workspace, kept across searches). The hands
// of a search differ from each other in one or two groups, so most look-ups hit; each hit replaces up to 19
// scattered reads of the 20 MB tables.
class NeighbourCache {
public:
    static constexpr int kBits = 12;

    NeighbourCache() : slots_(size_t{1} << kBits) {}

    const Neighbours& get(int idx, bool honors) {
        const uint32_t key = (static_cast<uint32_t>(idx) << 1 | (honors ? 1u : 0u)) + 1;
        Slot& s = slots_[(key * 0x9E3779B1u) >> (32 - kBits)];
        if (s.key != key) {
            fill_neighbours(idx, honors, &s.nb);
            s.key = key;
        }
        return s.nb;
    }

private:
    struct Slot {
        uint32_t key = 0;  // pattern index * 2 + honors, plus 1 (0: empty)
        Neighbours nb;
    };
    std::vector<Slot> slots_;
};

// Standard-form shanten after changing one tile of a group, for each position of the group: 4 bits per
// position p (bits 4p-4p+3: shanten + 1, 15 where the count would leave 0-4), keyed by all it depends on (the
// group's pattern, the other groups' combined cost vector, len_div3, the sign of the change). Direct-mapped, one
// per search workspace, kept across searches: the hands of a search share most of their groups and most of
// those groups' surroundings, so a hand's tile masks come mostly from here.
class GroupShantenCache {
public:
    static constexpr int kBits = 13;

    GroupShantenCache() : slots_(size_t{1} << kBits) {}

    bool find(uint64_t a, uint64_t b, uint64_t* fields) const {
        const Slot& s = slots_[index(a, b)];
        if (s.a != a || s.b != b) return false;
        *fields = s.fields;
        return true;
    }

    void put(uint64_t a, uint64_t b, uint64_t fields) { slots_[index(a, b)] = Slot{a, b, fields}; }

private:
    struct Slot {
        uint64_t a = 0, b = 0, fields = 0;  // a has bit 63 set when used
    };
    std::vector<Slot> slots_;

    static size_t index(uint64_t a, uint64_t b) {
        const uint64_t h = (a ^ (b * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
        return static_cast<size_t>(h >> (64 - kBits));
    }
};

// Shanten of a fixed hand changed by one tile, cheaply: the cost vectors of the
// other three groups are combined once in init(), so each query is one
// look-up of the group's neighbouring pattern and one partial combine. with_delta() equals calc_all() of the
// changed hand (tests/test_sp_core.py checks it); group_fields() gives a group's standard-form part at once.
class ShantenView {
public:
    void init(const uint8_t tehai[34], int len_div3, NeighbourCache& cache) {
        tehai_ = tehai;
        len_ = len_div3;
        cache_ = &cache;
        CostVec* v = v_;
        for (int g = 0; g < 4; ++g) {
            idx_[g] = group_index(tehai + 9 * g, g == 3 ? 7 : 9);
            v[g] = cache.get(idx_[g], g == 3).self;
        }
        p1_ = combine(v[0], v[1], len_div3);
        s2_ = combine(v[2], v[3], len_div3);
        rest_[0] = combine(v[1], s2_, len_div3);
        rest_[1] = combine(v[0], s2_, len_div3);
        rest_[2] = combine(p1_, v[3], len_div3);
        rest_[3] = combine(p1_, v[2], len_div3);
        pairs_ = kinds_ = y_kinds_ = y_pairs_ = 0;
        if (len_div3 < 4) return;  // seven pairs and thirteen orphans need a closed hand
        for (int i = 0; i < 34; ++i) {
            if (tehai[i]) ++kinds_;
            if (tehai[i] >= 2) ++pairs_;
        }
        for (int i : kYaokyuu) {
            if (tehai[i]) ++y_kinds_;
            if (tehai[i] >= 2) ++y_pairs_;
        }
    }

    // The view of `parent`'s hand with tile `tid` changed by `delta` (+1 or -1), `tehai` already changed: equal
    // to init() of it (the same combines of the same vectors), with one neighbour look-up instead of four and
    // the combines that do not involve the changed group kept.
    void derive(const ShantenView& parent, int tid, int delta, const uint8_t tehai[34]) {
        *this = parent;
        tehai_ = tehai;
        const int g = tid < 27 ? tid / 9 : 3, pos = tid - 9 * g, L = len_;
        const Neighbours& nb = cache_->get(parent.idx_[g], g == 3);
        v_[g] = delta > 0 ? nb.plus[pos] : nb.minus[pos];
        idx_[g] += delta * kPow5[pos + (g == 3 ? 2 : 0)];
        const CostVec* v = v_;
        if (g < 2) {
            p1_ = combine(v[0], v[1], L);
            rest_[1 - g] = combine(v[g], s2_, L);
            rest_[2] = combine(p1_, v[3], L);
            rest_[3] = combine(p1_, v[2], L);
        } else {
            s2_ = combine(v[2], v[3], L);
            rest_[0] = combine(v[1], s2_, L);
            rest_[1] = combine(v[0], s2_, L);
            rest_[5 - g] = combine(p1_, v[g], L);
        }
        if (L < 4) return;
        const int c2 = tehai[tid], c = c2 - delta;
        kinds_ += (c2 > 0) - (c > 0);
        pairs_ += (c2 >= 2) - (c >= 2);
        if (is_yaokyuu(tid)) {
            y_kinds_ += (c2 > 0) - (c > 0);
            y_pairs_ += (c2 >= 2) - (c >= 2);
        }
    }

    // calc_all() of the hand with tile `tid` changed by `delta` (+1 or -1; the count stays within 0-4).
    int with_delta(int tid, int delta) const {
        const int g = tid < 27 ? tid / 9 : 3;
        const Neighbours& nb = cache_->get(idx_[g], g == 3);
        const int pos = tid - 9 * g;
        return adjust(tid, delta, normal(delta > 0 ? nb.plus[pos] : nb.minus[pos], rest_[g]));
    }

    // The standard-form shanten + 1 (at most 14) of the hand with each tile of group g changed by delta, 4 bits
    // per position (15 where the count would leave 0-4); from `gc` or computed and kept there.
    uint64_t group_fields(int g, int delta, GroupShantenCache& gc) const {
        const CostVec& r = rest_[g];
        uint64_t b;
        std::memcpy(&b, r.v, 8);
        const uint64_t a = static_cast<uint64_t>(idx_[g]) | uint64_t{g == 3} << 21 |
                           static_cast<uint64_t>(len_) << 22 | uint64_t{delta > 0} << 25 |
                           static_cast<uint64_t>(r.v[8]) << 32 | static_cast<uint64_t>(r.v[9]) << 40 |
                           uint64_t{1} << 63;
        uint64_t fields = 0;
        if (gc.find(a, b, &fields)) return fields;
        const Neighbours& nb = cache_->get(idx_[g], g == 3);
        const int n = g == 3 ? 7 : 9;
        for (int p = 0; p < n; ++p) {
            const int c = tehai_[9 * g + p];
            uint64_t f = 15;
            if (delta > 0 ? c < 4 : c > 0)
                f = static_cast<uint64_t>(std::min(normal(delta > 0 ? nb.plus[p] : nb.minus[p], r) + 1, 14));
            fields |= f << (4 * p);
        }
        gc.put(a, b, fields);
        return fields;
    }

    // The least of standard-form shanten `s` of the hand with `tid` changed by `delta` and its seven-pairs and
    // thirteen-orphans shanten (closed hands only), as calc_all() takes it.
    int adjust(int tid, int delta, int s) const {
        if (s <= 0 || len_ < 4) return s;
        const int c = tehai_[tid], c2 = c + delta;
        const int kinds = kinds_ - (c > 0) + (c2 > 0);
        const int pairs = pairs_ - (c >= 2) + (c2 >= 2);
        s = std::min(s, 7 - pairs + std::max(0, 7 - kinds) - 1);
        if (s <= 0) return s;
        int y_kinds = y_kinds_, y_pairs = y_pairs_;
        if (is_yaokyuu(tid)) {
            y_kinds += (c2 > 0) - (c > 0);
            y_pairs += (c2 >= 2) - (c >= 2);
        }
        return std::min(s, 14 - y_kinds - (y_pairs ? 1 : 0) - 1);
    }

private:
    const uint8_t* tehai_ = nullptr;
    int len_ = 4;
    NeighbourCache* cache_ = nullptr;
    int idx_[4] = {};
    CostVec v_[4], p1_, s2_;  // each group's cost vector; groups 0+1 and 2+3 combined
    CostVec rest_[4];
    int pairs_ = 0, kinds_ = 0, y_kinds_ = 0, y_pairs_ = 0;

    // Standard-form shanten of the group with cost vector gv beside the rest r.
    int normal(const CostVec& gv, const CostVec& r) const {
        int best = kInf * 2;
        for (int i = 0; i <= len_; ++i) {
            const int j = len_ - i;
            best = std::min(best, std::min(gv.v[i] + r.v[5 + j], gv.v[5 + i] + r.v[j]));
        }
        return best - 1;
    }

    static bool is_yaokyuu(int t) { return t >= 27 || t % 9 == 0 || t % 9 == 8; }
};

}  // namespace sp
