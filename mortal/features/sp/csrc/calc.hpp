// Single-player (SP) expected-value search: the compiled twin of tests/sp_oracle/search.py.
//
// Same model and settings as the Python reference (Mortal's algo/sp with the
// options obs v4 uses: no tegawari, no shanten-down search, rank by EV): from a
// hand at <= 3 shanten, every sequence of shanten-reducing draws and
// shanten-keeping discards over the remaining own draws is searched, nobody else
// wins, and discards never return to the wall. States are memoised on the moves
// from the root (StateKey), which within one search decide hand, wall and red fives.
//
// One difference in arithmetic, not in the model: for each state the Python
// loops over (from-turn i, draw-turn j) pairs; here the values of all draws of a
// state are first summed per turn and the per-turn totals come from suffix sums,
// O(T) instead of O(T^2). Results agree with the Python to float64 rounding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "agari.hpp"
#include "point.hpp"
#include "shanten.hpp"

namespace sp {

constexpr int kShantenThres = 3;
constexpr int kMaxTsumosLeft = 17;
constexpr int kUnknownTile = 37;
constexpr int kFives[3] = {4, 13, 22};

// Probability that 0..12 uradora hit with 2..5 indicators (row k-1 for k);
// nekobean's statistical table, the data Mortal ships. Same as calc.py.
constexpr double kUradoraProb[5][13] = {
    {0.639485, 0.327801, 0.0327134, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {0.406736, 0.42281, 0.147966, 0.021674, 0.0008142, 0, 0, 0, 0, 0, 0, 0, 0},
    {0.257516, 0.406819, 0.246851, 0.0757724, 0.0122266, 0.0008004, 1.43e-5, 0, 0, 0, 0, 0, 0},
    {0.162199, 0.346513, 0.301539, 0.142396, 0.0401276, 0.0066491, 0.0005575, 1.85e-5, 0, 0, 0, 0, 0},
    {0.101768, 0.275319, 0.313742, 0.20189, 0.081774, 0.0215394, 0.0035918, 0.0003607, 1.52e-5, 3e-7, 0,
     0, 0},
};

// Mortal's tile.rs discard priorities by id 0-37 (higher = discarded first on ties).
constexpr int kDiscardPriority[38] = {6, 5, 4, 3, 2, 3, 4, 5, 6, 6, 5, 4, 3, 2, 3, 4, 5, 6, 6,
                                      5, 4, 3, 2, 3, 4, 5, 6, 7, 7, 7, 7, 7, 7, 7, 1, 1, 1, 0};

// Red fives 34-36 map to their plain five; every result is a valid 0-33 index.
inline int deaka(int t) { return t < 34 ? t : kFives[(t - 34) % 3]; }

inline int next_tile(int t) {
    t = deaka(t);
    if (t < 27) return t / 9 * 9 + (t % 9 + 1) % 9;
    if (t < 31) return 27 + (t - 27 + 1) % 4;
    return 31 + (t - 31 + 1) % 3;
}

inline int prev_tile(int t) {
    t = deaka(t);
    if (t < 27) return t / 9 * 9 + (t % 9 + 8) % 9;
    if (t < 31) return 27 + (t - 27 + 3) % 4;
    return 31 + (t - 31 + 2) % 3;
}

// > 0 if a is preferred over b as a discard (Mortal's cmp_discard_priority).
inline int cmp_discard_priority(int a, int b) {
    const int pa = kDiscardPriority[a], pb = kDiscardPriority[b];
    if (pa != pb) return pa > pb ? 1 : -1;
    return (b > a) - (b < a);
}

// Fixed context of one calculation (SPCalculator fields of calc.py).
struct Context {
    int len_div3 = 4;
    Hand hand_base{};  // calls, winds, menzen; tehai/winning tile filled per leaf
    int num_doras_in_fuuro = 0;
    int n_indicators = 0;
    uint8_t dora_indicators[5] = {};  // deaka'd
    uint8_t doras[5] = {};
    bool calc_double_riichi = false;
    bool calc_haitei = false;
    bool prefer_riichi = false;
};

struct Values {
    double tenpai[kMaxTsumosLeft];
    double win[kMaxTsumosLeft];
    double ev[kMaxTsumosLeft];
};

struct Candidate {
    int tile = kUnknownTile;
    bool has_values = false;
    bool shanten_down = false;
    Values values{};
    std::vector<std::pair<int, int>> required;  // (tile 0-33, count left)
};

// The concealed hand as counts, 3 bits a tile: w[0] tiles 0-16 (red-five bits at 51-53), w[1] tiles 17-33.
struct HandKey {
    uint64_t w[2];
};

// A search state by the moves from the root: the tiles drawn (bits 0-29) and the tiles discarded (bits 32-61),
// each a list of tile ids 0-36 plus one in ascending 6-bit fields. Exact within one search: the wall is the
// root's minus the drawn tiles and the hand the root's plus the drawn minus the discarded (red fives are ids
// 34-36), so two states share a key only if they share hand, wall and red fives. A search makes at most 4
// draws and 4 discards below its root (5 fields each). 8 bytes instead of the 32 of (hand, wall): the memo
// slots are what a search waits on.
using StateKey = uint64_t;
static_assert(kShantenThres + 1 <= 5, "a StateKey list holds 5 tiles: a search draws at most kShantenThres + 1");

// `key` with tile `t` added to its list at bit `base` (0: drawn, 32: discarded).
inline StateKey key_add(StateKey key, int t, int base) {
    const uint64_t list = key >> base & 0x3FFFFFFF, v = static_cast<uint64_t>(t + 1);
    int shift = 0;
    while (shift < 30 && (list >> shift & 63) != 0 && (list >> shift & 63) < v) shift += 6;
    const uint64_t low = (uint64_t{1} << shift) - 1;
    const uint64_t grown = ((list & low) | v << shift | (list & ~low) << 6) & 0x3FFFFFFF;
    return (key & ~(uint64_t{0x3FFFFFFF} << base)) | grown << base;
}

inline uint64_t hash_key(StateKey k) {
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

// A memoised state's values at turns depth..T-1, the only turns ever read of a state `depth` draws
// below the root: tenpai at t[0..len), then win, then ev; index with the absolute turn.
struct StoredValues {
    const double* base;
    int depth, len;
    double tenpai(int i) const { return base[i - depth]; }
    double win(int i) const { return base[len + i - depth]; }
    double ev(int i) const { return base[2 * len + i - depth]; }
};

// Memo of search states: open addressing, linear probing, values in one pool of
// doubles (3 x (T - depth) a state, not 3 x 17: the pool is most of the search's memory traffic).
// clear() keeps the memory (a slot is live only in the current generation), so a
// reused map costs no allocation or page faults in the next search.
class StateMap {
public:
    StateMap() { slots_.assign(64, Slot{}); }

    // Forget every state. The slots are sized for the states of the search just ended (at most half
    // full): a table grown by one large search would make every look-up of the smaller searches that
    // follow a cache miss.
    void clear() {
        size_t want = 64;
        while (want < 2 * count_) want *= 2;
        pool_.clear();
        count_ = 0;
        if (slots_.size() > 2 * want) {
            slots_.assign(want, Slot{});
            gen_ = 1;
        } else if (++gen_ == 0) {  // wrapped: forget every generation explicitly
            for (Slot& s : slots_) s.gen = 0;
            gen_ = 1;
        }
    }

    // Pool index of `k`, or -1.
    int find(StateKey k) const {
        size_t i = hash_key(k) & (slots_.size() - 1);
        while (slots_[i].gen == gen_) {
            if (slots_[i].key == k) return slots_[i].index;
            i = (i + 1) & (slots_.size() - 1);
        }
        return -1;
    }

    // `index` from find(); depth and T as when it was inserted (both are functions of the state).
    StoredValues at(int index, int depth, int T) const {
        return StoredValues{pool_.data() + index, depth, std::max(T - depth, 0)};
    }

    // Store turns depth..T-1 of `v`; valid until the next insert.
    StoredValues insert(StateKey k, const Values& v, int depth, int T) {
        if ((count_ + 1) * 2 > slots_.size()) grow();
        const size_t at = pool_.size();
        const int len = std::max(T - depth, 0);  // a state deeper than the last turn is never read
        pool_.resize(at + 3 * static_cast<size_t>(len));
        double* dst = pool_.data() + at;
        std::memcpy(dst, v.tenpai + depth, sizeof(double) * len);
        std::memcpy(dst + len, v.win + depth, sizeof(double) * len);
        std::memcpy(dst + 2 * len, v.ev + depth, sizeof(double) * len);
        place(k, static_cast<int>(at));
        ++count_;
        return StoredValues{dst, depth, len};
    }

    size_t size() const { return count_; }
    size_t capacity() const { return slots_.size(); }

private:
    struct Slot {
        StateKey key = 0;
        int index = -1;
        uint32_t gen = 0;
    };
    std::vector<Slot> slots_;
    std::vector<double> pool_;
    size_t count_ = 0;
    uint32_t gen_ = 1;

    void place(StateKey k, int index) {
        size_t i = hash_key(k) & (slots_.size() - 1);
        while (slots_[i].gen == gen_) i = (i + 1) & (slots_.size() - 1);
        slots_[i].key = k;
        slots_[i].index = index;
        slots_[i].gen = gen_;
    }

    void grow() {
        std::vector<Slot> old(slots_.size() * 2, Slot{});
        old.swap(slots_);
        for (const Slot& s : old)
            if (s.gen == gen_) place(s.key, s.index);
    }
};

// Tile masks by concealed hand (tehai + len_div3), kept across searches: which
// draws lower the shanten of a 3n+1 hand, which discards keep that of a 3n+2 hand.
// They depend on the hand only, and successive decisions of a seat search
// mostly the same hands. Emptied when it reaches kMaxEntries: 4,096 hands (8,192 slots, 192 KB) stay in a
// core's L2 cache beside the memo; 16,384 measured 4-8% slower a decision, 1,024 slower too.
class MaskMap {
public:
    static constexpr size_t kMaxEntries = size_t{1} << 12;

    MaskMap() { slots_.assign(1024, Slot{}); }

    // Mask of (a, b); false if absent. b's bit 63 is free (it marks a used slot).
    bool find(uint64_t a, uint64_t b, uint64_t* mask) const {
        b |= kUsed;
        size_t i = hash(a, b) & (slots_.size() - 1);
        while (slots_[i].b != 0) {
            if (slots_[i].a == a && slots_[i].b == b) {
                *mask = slots_[i].mask;
                return true;
            }
            i = (i + 1) & (slots_.size() - 1);
        }
        return false;
    }

    void insert(uint64_t a, uint64_t b, uint64_t mask) {
        if (size_ >= kMaxEntries) {
            slots_.assign(slots_.size(), Slot{});
            size_ = 0;
        }
        if ((size_ + 1) * 2 > slots_.size()) grow();
        place(a, b | kUsed, mask);
        ++size_;
    }

private:
    static constexpr uint64_t kUsed = uint64_t{1} << 63;
    struct Slot {
        uint64_t a = 0, b = 0, mask = 0;  // b == 0: empty (24 bytes a slot: the table is read at random)
    };
    std::vector<Slot> slots_;
    size_t size_ = 0;

    static size_t hash(uint64_t a, uint64_t b) {
        uint64_t h = (a ^ (b * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
        return static_cast<size_t>(h ^ (h >> 31));
    }

    void place(uint64_t a, uint64_t b, uint64_t mask) {
        size_t i = hash(a, b) & (slots_.size() - 1);
        while (slots_[i].b != 0) i = (i + 1) & (slots_.size() - 1);
        slots_[i] = Slot{a, b, mask};
    }

    void grow() {
        std::vector<Slot> old(slots_.size() * 2, Slot{});
        old.swap(slots_);
        for (const Slot& s : old)
            if (s.b != 0) place(s.a, s.b, s.mask);
    }
};

// The memo maps of one search, reused by later searches (see workspace_pool), and
// the hand masks, which stay valid from one search to the next.
struct Workspace {
    StateMap draw[kShantenThres + 1];
    StateMap discard[kShantenThres + 1];
    MaskMap draw_effect;   // 3n+1 hand -> tiles whose draw lowers the shanten
    MaskMap discard_keep;  // 3n+2 hand -> tiles whose discard keeps the shanten
    NeighbourCache neighbours;  // group pattern -> its cost vectors and its neighbours'
    GroupShantenCache group_shanten;  // group in its surroundings -> standard shanten after a change
};

// Workspaces outlive searches so their memory is reused; one per concurrently
// running search. Maps grown past kKeepSlots are dropped rather than kept.
class WorkspacePool {
public:
    static constexpr size_t kKeepSlots = size_t{1} << 18;

    std::unique_ptr<Workspace> acquire() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!free_.empty()) {
                std::unique_ptr<Workspace> w = std::move(free_.back());
                free_.pop_back();
                return w;
            }
        }
        return std::unique_ptr<Workspace>(new Workspace());
    }

    void release(std::unique_ptr<Workspace> w) {
        for (int i = 0; i <= kShantenThres; ++i)
            if (w->draw[i].capacity() > kKeepSlots || w->discard[i].capacity() > kKeepSlots) return;
        std::lock_guard<std::mutex> lock(mutex_);
        free_.push_back(std::move(w));
    }

private:
    std::mutex mutex_;
    std::vector<std::unique_ptr<Workspace>> free_;
};

inline WorkspacePool& workspace_pool() {
    static WorkspacePool pool;
    return pool;
}

class Search {
public:
    // tehai, tiles_seen: 34 counts; akas_in_hand, akas_seen: bit r set = red five of suit r (m, p, s).
    Search(const Context& ctx, const uint8_t tehai[34], int akas_in_hand, const uint8_t tiles_seen[34],
           int akas_seen, int max_tsumo)
        : ctx_(ctx), T_(max_tsumo) {
        n_left_ = 0;
        for (int i = 0; i < 34; ++i) {
            tehai_[i] = tehai[i];
            wall_[i] = static_cast<uint8_t>(4 - tiles_seen[i]);
            n_left_ += wall_[i];
        }
        akas_hand_ = akas_in_hand & 7;
        akas_wall_ = ~akas_seen & 7;
        not_tsumo_.assign(static_cast<size_t>(n_left_ + 1) * T_, 0.0);
        for (int i = 0; i <= n_left_; ++i) {
            double* row = &not_tsumo_[static_cast<size_t>(i) * T_];
            row[0] = 1.0;
            const int lim = std::min(T_ - 1, n_left_ - i);
            for (int j = 0; j < lim; ++j) row[j + 1] = row[j] * (n_left_ - i - j) / (n_left_ - j);
        }
        assume_riichi_ = ctx.hand_base.is_menzen && ctx.prefer_riichi;
        init_key();
        ws_ = workspace_pool().acquire();
        for (int i = 0; i <= kShantenThres; ++i) {
            ws_->draw[i].clear();
            ws_->discard[i].clear();
        }
    }

    ~Search() { workspace_pool().release(std::move(ws_)); }
    Search(const Search&) = delete;
    Search& operator=(const Search&) = delete;

    // Candidates of a 3n+2 hand (discards keeping shanten), unsorted.
    std::vector<Candidate> analyze_discard(int shanten) {
        std::vector<Candidate> out;
        int tiles[14], diffs[14];
        const int n = discard_tiles(shanten, tiles, diffs);
        for (int k = 0; k < n; ++k) {
            if (diffs[k] != 0) continue;  // no shanten-down search (v4 setting)
            Candidate c;
            c.tile = tiles[k];
            discard(tiles[k]);
            c.required = required_tiles();
            root_values(draw(shanten), c.values);
            undo_discard(tiles[k]);
            finish(c, shanten);
            out.push_back(std::move(c));
        }
        return out;
    }

    // The single "draw" candidate of a 3n+1 hand.
    std::vector<Candidate> analyze_draw(int shanten) {
        Candidate c;
        c.required = required_tiles();
        root_values(draw(shanten), c.values);
        finish(c, shanten);
        return {c};
    }

    // Above the search threshold: required tiles only, every discard listed.
    std::vector<Candidate> analyze_discard_simple(int shanten) {
        std::vector<Candidate> out;
        int tiles[14], diffs[14];
        const int n = discard_tiles(shanten, tiles, diffs);
        for (int k = 0; k < n; ++k) {
            Candidate c;
            c.tile = tiles[k];
            discard(tiles[k]);
            c.required = required_tiles();
            undo_discard(tiles[k]);
            c.shanten_down = diffs[k] == 1;
            out.push_back(std::move(c));
        }
        return out;
    }

    std::vector<Candidate> analyze_draw_simple() {
        Candidate c;
        c.required = required_tiles();
        return {c};
    }

    int max_tsumo() const { return T_; }
    size_t states() const {
        size_t n = 0;
        for (int i = 0; i <= kShantenThres; ++i) n += ws_->draw[i].size() + ws_->discard[i].size();
        return n;
    }

private:
    const Context& ctx_;
    int T_;
    int n_left_;
    uint8_t tehai_[34];
    uint8_t wall_[34];
    int akas_hand_, akas_wall_;
    bool assume_riichi_;
    std::vector<double> not_tsumo_;  // (n_left+1) x T: no required tile in the first j draws
    HandKey key_{{0, 0}};  // the hand's counts and red fives, kept in step with every move
    StateKey state_ = 0;  // the moves from the root (see StateKey), kept in step with every move
    StateKey saved_[16];  // state_ before each move not yet undone (moves nest at most 9 deep)
    int n_saved_ = 0;     // the nesting level of the current hand (0: the root's)
    // Per level: the move that made it (tile 0-33, +1 drawn / -1 discarded) and, once a tile mask was computed
    // there, that hand's shanten view, from which the next level's view is derived.
    int move_tile_[16], move_delta_[16];
    ShantenView views_[16];
    bool view_ok_[16] = {};
    int depth_ = 0;  // draws made below the root: a state's values are read at turns >= its depth only
    std::unique_ptr<Workspace> ws_;  // the memo maps, borrowed from workspace_pool()

    // A root state's stored values as a whole record (turns T..16 zero).
    void root_values(const StoredValues& v, Values& out) const {
        std::memset(&out, 0, sizeof out);
        for (int i = 0; i < T_; ++i) {
            out.tenpai[i] = v.tenpai(i);
            out.win[i] = v.win(i);
            out.ev[i] = v.ev(i);
        }
    }

    void finish(Candidate& c, int shanten) {
        c.has_values = true;
        for (int i = 0; i < T_; ++i) {
            double& t = c.values.tenpai[i];
            t = shanten == 0 ? 1.0 : std::min(std::max(t, 0.0), 1.0);
            c.values.win[i] = std::min(std::max(c.values.win[i], 0.0), 1.0);
            c.values.ev[i] = std::max(c.values.ev[i], 0.0);
        }
    }

    // Hand key layout: see HandKey.
    static int word_of(int tid) { return tid < 17 ? 0 : 1; }
    static int shift_of(int tid) { return 3 * (tid < 17 ? tid : tid - 17); }

    void init_key() {
        key_ = HandKey{{0, 0}};
        for (int t = 0; t < 34; ++t) key_.w[word_of(t)] |= static_cast<uint64_t>(tehai_[t]) << shift_of(t);
        key_.w[0] |= static_cast<uint64_t>(akas_hand_) << 51;
        state_ = 0;
        n_saved_ = 0;
        view_ok_[0] = false;
    }

    void push_move(int t, int delta) {
        saved_[n_saved_++] = state_;
        move_tile_[n_saved_] = deaka(t);
        move_delta_[n_saved_] = delta;
        view_ok_[n_saved_] = false;
    }

    void take(int t) {
        const int d = deaka(t);
        tehai_[d] -= 1;
        key_.w[word_of(d)] -= uint64_t{1} << shift_of(d);
        if (t >= 34) {
            akas_hand_ &= ~(1 << (t - 34));
            key_.w[0] &= ~(uint64_t{1} << (51 + t - 34));
        }
    }
    void put(int t) {
        const int d = deaka(t);
        tehai_[d] += 1;
        key_.w[word_of(d)] += uint64_t{1} << shift_of(d);
        if (t >= 34) {
            akas_hand_ |= 1 << (t - 34);
            key_.w[0] |= uint64_t{1} << (51 + t - 34);
        }
    }
    // Moves nest (each undo reverses the last move not yet undone), so state_ is restored from saved_.
    void discard(int t) {
        push_move(t, -1);
        state_ = key_add(state_, t, 32);
        take(t);
    }
    void undo_discard(int t) {
        state_ = saved_[--n_saved_];
        put(t);
    }
    void deal(int t) {
        push_move(t, +1);
        state_ = key_add(state_, t, 0);
        ++depth_;
        const int d = deaka(t);
        wall_[d] -= 1;
        if (t >= 34) akas_wall_ &= ~(1 << (t - 34));
        put(t);
    }
    void undo_deal(int t) {
        state_ = saved_[--n_saved_];
        --depth_;
        take(t);
        const int d = deaka(t);
        wall_[d] += 1;
        if (t >= 34) akas_wall_ |= 1 << (t - 34);
    }

    // Tiles t (as a bit mask) whose draw (delta +1) or discard (delta -1) gives a hand of
    // `target` shanten, from `cache` or computed once for this hand, len_div3 and target.
    uint64_t hand_mask(MaskMap& cache, int delta, int target) {
        const uint64_t a = key_.w[0] & ((uint64_t{1} << 51) - 1);
        // target is a function of the hand for honest input; keyed anyway so that a caller's
        // wrong cur_shanten cannot poison later searches
        const uint64_t b = key_.w[1] | static_cast<uint64_t>(ctx_.len_div3) << 51 |
                           static_cast<uint64_t>(target + 1 + 8) << 54;
        uint64_t mask = 0;
        if (cache.find(a, b, &mask)) return mask;
        const int level = n_saved_;
        ShantenView& view = views_[level];
        if (level > 0 && view_ok_[level - 1])
            view.derive(views_[level - 1], move_tile_[level], move_delta_[level], tehai_);
        else
            view.init(tehai_, ctx_.len_div3, ws_->neighbours);
        view_ok_[level] = true;
        for (int g = 0; g < 4; ++g) {
            const uint64_t fields = view.group_fields(g, delta, ws_->group_shanten);
            for (int p = 0; p < (g == 3 ? 7 : 9); ++p) {
                const int f = static_cast<int>(fields >> (4 * p) & 15);
                if (f == 15) continue;  // the count would leave 0-4
                const int tid = 9 * g + p;
                if (view.adjust(tid, delta, f - 1) == target) mask |= uint64_t{1} << tid;
            }
        }
        cache.insert(a, b, mask);
        return mask;
    }

    // Discards of the current 3n+2 hand that keep `shanten` (aka when it is the only five of its kind).
    int keeping_discards(int shanten, int* tiles) {
        const uint64_t mask = hand_mask(ws_->discard_keep, -1, shanten);
        int n = 0;
        for (int tid = 0; tid < 34; ++tid) {
            if (!(mask >> tid & 1)) continue;
            int tile = tid;
            if (tehai_[tid] == 1) {
                for (int r = 0; r < 3; ++r)
                    if (tid == kFives[r] && (akas_hand_ >> r & 1)) tile = 34 + r;
            }
            tiles[n++] = tile;
        }
        return n;
    }

    // Discard candidates (aka when it is the only five of its kind) and their shanten change.
    int discard_tiles(int shanten, int* tiles, int* diffs) {
        int n = 0;
        ShantenView view;
        view.init(tehai_, ctx_.len_div3, ws_->neighbours);
        for (int tid = 0; tid < 34; ++tid) {
            const int c = tehai_[tid];
            if (!c) continue;
            const int diff = view.with_delta(tid, -1) - shanten;
            int tile = tid;
            if (c == 1) {
                for (int r = 0; r < 3; ++r)
                    if (tid == kFives[r] && (akas_hand_ >> r & 1)) tile = 34 + r;
            }
            tiles[n] = tile;
            diffs[n] = diff;
            ++n;
        }
        return n;
    }

    std::vector<std::pair<int, int>> required_tiles() {
        std::vector<std::pair<int, int>> out;
        const int shanten = calc_all(tehai_, ctx_.len_div3);
        ShantenView view;
        view.init(tehai_, ctx_.len_div3, ws_->neighbours);
        for (int tid = 0; tid < 34; ++tid) {
            const int count = wall_[tid];
            if (count && view.with_delta(tid, +1) < shanten) out.emplace_back(tid, count);
        }
        return out;
    }

    // Draws that reduce shanten: (tile, count); a red five is its own entry of count 1.
    int effective_draws(int shanten, int* tiles, int* counts) {
        int n = 0;
        const uint64_t mask = hand_mask(ws_->draw_effect, +1, shanten - 1);
        for (int tid = 0; tid < 34; ++tid) {
            const int count = wall_[tid];
            if (!count || !(mask >> tid & 1)) continue;
            int red = -1;
            for (int r = 0; r < 3; ++r)
                if (tid == kFives[r] && (akas_wall_ >> r & 1)) red = r;
            if (red >= 0) {
                if (count >= 2) {
                    tiles[n] = tid;
                    counts[n++] = count - 1;
                }
                tiles[n] = 34 + red;
                counts[n++] = 1;
            } else {
                tiles[n] = tid;
                counts[n++] = count;
            }
        }
        return n;
    }

    // Values of the current state from `cache`, computed by `compute(Values&)` (turns >= depth_) on a
    // miss. The view is valid until the next insertion into the same map.
    template <class Compute>
    StoredValues memoised(StateMap& cache, Compute compute) {
        const int hit = cache.find(state_);
        if (hit >= 0) return cache.at(hit, depth_, T_);
        const StateKey k = state_;
        const int depth = depth_;
        Values v;
        compute(v);
        return cache.insert(k, v, depth, T_);
    }

    // Values of the current 3n+1 state.
    StoredValues draw(int shanten) {
        return memoised(ws_->draw[shanten], [&](Values& v) { draw_slow(shanten, v); });
    }

    void draw_slow(int shanten, Values& out) {
        const int T = T_, d0 = depth_;  // turns before d0 are never read
        int tiles[40], counts[40];
        const int n = effective_draws(shanten, tiles, counts);
        int sum_required = 0;
        for (int k = 0; k < n; ++k) sum_required += counts[k];
        const double* nt = &not_tsumo_[static_cast<size_t>(sum_required) * T];
        double q[kMaxTsumosLeft];  // P(first required draw at turn j) per required tile
        for (int j = d0; j < T; ++j) q[j] = n_left_ - j > 0 ? nt[j] / (n_left_ - j) : 0.0;
        for (int j = d0; j < T; ++j) out.tenpai[j] = out.win[j] = out.ev[j] = 0.0;

        if (shanten == 0) {
            double sc[4] = {0, 0, 0, 0};  // count-weighted tsumo values with +0..+3 han
            double cw = 0.0;
            for (int k = 0; k < n; ++k) {
                double scores[4];
                deal(tiles[k]);
                const bool ok = get_score(tiles[k], scores);
                undo_deal(tiles[k]);
                if (!ok) continue;
                cw += counts[k];
                for (int h = 0; h < 4; ++h) sc[h] += counts[k] * scores[h];
            }
            if (cw == 0.0) return;
            const int ar = assume_riichi_ ? 1 : 0;
            const int haitei = ctx_.calc_haitei ? 1 : 0;
            double tail = 0.0;  // sum of q[j] for i < j < T-1
            double qsum = 0.0;  // sum of q[j] for j >= i
            for (int i = T - 1; i >= d0; --i) {
                qsum += q[i];
                if (nt[i] != 0.0) {
                    const int d = (assume_riichi_ && ctx_.calc_double_riichi && i == 0) ? 1 : 0;
                    double ev = tail * sc[d] + q[i] * sc[d + ar + (i == T - 1 ? haitei : 0)];
                    if (i < T - 1) ev += q[T - 1] * sc[d + haitei];
                    out.win[i] = cw * qsum / nt[i];
                    out.ev[i] = ev / nt[i];
                }
                if (i < T - 1) tail += q[i];
            }
            return;
        }

        // a[j]: count-weighted child values at turn j+1 (the child draws next).
        // (turns j >= d0: the child is one draw deeper, its values at j + 1 >= d0 + 1 exist)
        double at[kMaxTsumosLeft] = {}, aw[kMaxTsumosLeft] = {}, ae[kMaxTsumosLeft] = {};
        for (int k = 0; k < n; ++k) {
            deal(tiles[k]);
            const StoredValues nxt = discard_step(shanten - 1);
            const double c = counts[k];
            const double* nt1 = nxt.base;  // turn d0 + 1
            const double* nw1 = nxt.base + nxt.len;
            const double* ne1 = nxt.base + 2 * nxt.len;
            for (int j = d0; j + 1 < T; ++j) {
                at[j] += c * nt1[j - d0];
                aw[j] += c * nw1[j - d0];
                ae[j] += c * ne1[j - d0];
            }
            undo_deal(tiles[k]);
        }
        double st = 0.0, sw = 0.0, se = 0.0;
        for (int i = T - 1; i >= d0; --i) {
            if (shanten == 1) st += q[i] * sum_required;
            if (i < T - 1) {
                if (shanten > 1) st += q[i] * at[i];
                sw += q[i] * aw[i];
                se += q[i] * ae[i];
            }
            if (nt[i] != 0.0) {
                out.tenpai[i] = st / nt[i];
                out.win[i] = sw / nt[i];
                out.ev[i] = se / nt[i];
            }
        }
    }

    // Best-discard values of the current 3n+2 state.
    StoredValues discard_step(int shanten) {
        return memoised(ws_->discard[shanten], [&](Values& v) { discard_slow(shanten, v); });
    }

    void discard_slow(int shanten, Values& out) {
        const int T = T_, d0 = depth_;  // turns before d0 are never read
        constexpr double kF32Min = -3.4028234663852886e38;
        int best_tile[kMaxTsumosLeft];
        long long best_val[kMaxTsumosLeft];
        for (int i = d0; i < T; ++i) {
            out.tenpai[i] = out.win[i] = out.ev[i] = kF32Min;
            best_tile[i] = kUnknownTile;
            best_val[i] = -(1LL << 31);
        }
        int tiles[14];
        const int n = keeping_discards(shanten, tiles);
        for (int k = 0; k < n; ++k) {
            discard(tiles[k]);
            const StoredValues v = draw(shanten);
            undo_discard(tiles[k]);
            for (int i = d0; i < T; ++i) {
                // EVs equal to the point count tie (Mortal compares them as integers)
                const long long val = static_cast<long long>(v.ev(i));
                if (val > best_val[i] ||
                    (val == best_val[i] && cmp_discard_priority(tiles[k], best_tile[i]) > 0)) {
                    out.tenpai[i] = v.tenpai(i);
                    out.win[i] = v.win(i);
                    out.ev[i] = v.ev(i);
                    best_val[i] = val;
                    best_tile[i] = tiles[k];
                }
            }
        }
    }

    // Tsumo values with +0..+3 extra han (double riichi, ippatsu, haitei), uradora
    // expected under riichi; false when the hand has no yaku.
    bool get_score(int win_tile, double scores[4]) {
        Hand h = ctx_.hand_base;
        std::memcpy(h.tehai, tehai_, 34);
        h.winning_tile = static_cast<uint8_t>(deaka(win_tile));
        h.is_ron = false;
        const bool is_oya = h.jikaze == 27;
        const int additional = h.is_menzen ? (ctx_.prefer_riichi ? 2 : 1) : 0;
        int num_doras = ctx_.num_doras_in_fuuro;
        for (int k = 0; k < ctx_.n_indicators; ++k) num_doras += tehai_[ctx_.doras[k]];
        for (int r = 0; r < 3; ++r) num_doras += akas_hand_ >> r & 1;
        Yaku y;
        if (!agari(h, additional, num_doras, &y)) return false;
        if (y.yakuman) {
            const double v = yakuman_tsumo_total(is_oya, y.yakuman);
            for (int i = 0; i < 4; ++i) scores[i] = v;
            return true;
        }
        const int fu = y.fu, han = y.han;
        if (assume_riichi_ && ctx_.n_indicators == 1) {
            double by_count[5] = {0, 0, 0, 0, 0};
            int sum_ind = 0, n_left = 0;
            for (int tid = 0; tid < 34; ++tid) n_left += wall_[tid];
            for (int tid = 0; tid < 34; ++tid) {
                const int c = tehai_[tid];
                if (!c) continue;
                const int k = wall_[prev_tile(tid)];
                by_count[c] += k;
                sum_ind += k;
            }
            double ura[5];
            ura[0] = static_cast<double>(n_left - sum_ind) / n_left;
            for (int i = 1; i < 5; ++i) ura[i] = by_count[i] / n_left;
            for (int i = 0; i < 4; ++i) {
                double s = 0.0;
                for (int j = 0; j < 5; ++j)
                    if (ura[j] != 0.0) s += tsumo_total(is_oya, fu, han + i + j) * ura[j];
                scores[i] = s;
            }
        } else if (assume_riichi_ && ctx_.n_indicators > 1) {
            const double* table = kUradoraProb[ctx_.n_indicators - 1];
            for (int i = 0; i < 4; ++i) {
                double s = 0.0;
                for (int j = 0; j < 13; ++j)
                    if (table[j] != 0.0) s += tsumo_total(is_oya, fu, han + i + j) * table[j];
                scores[i] = s;
            }
        } else {
            for (int i = 0; i < 4; ++i) scores[i] = tsumo_total(is_oya, fu, han + i);
        }
        return true;
    }
};

}  // namespace sp
