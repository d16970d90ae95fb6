// mortal.features.sp._core: the compiled single-player (SP) core behind observation v4.
//
// Thin CPython bindings over shanten.hpp, agari.hpp and calc.hpp, reached through
// mortal/features/sp/calc.py. The pure-Python twin is a test oracle (tests/sp_oracle);
// tests/test_sp_core.py checks this module against it.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <thread>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "agari.hpp"
#include "calc.hpp"
#include "rows.hpp"
#include "shanten.hpp"

namespace {

// Copy a bytes object of tile counts (each 0-4) into out; false + ValueError on bad input.
bool read_counts(const char* name, const char* buf, Py_ssize_t len, uint8_t out[34]) {
    if (len != 34) {
        PyErr_Format(PyExc_ValueError, "%s: expected 34 tile counts, got %zd", name, len);
        return false;
    }
    for (int i = 0; i < 34; ++i) {
        const unsigned char c = static_cast<unsigned char>(buf[i]);
        if (c > 4) {
            PyErr_Format(PyExc_ValueError, "%s: count %d of tile %d is above 4", name, c, i);
            return false;
        }
        out[i] = c;
    }
    return true;
}

// Copy a bytes object of at most `max_n` tile ids, deaka'd (0-33) unless `red` (0-36: red fives 34-36).
bool read_tiles(const char* name, const char* buf, Py_ssize_t len, int max_n, uint8_t* out, uint8_t* n,
                bool red = false) {
    if (len > max_n) {
        PyErr_Format(PyExc_ValueError, "%s: at most %d tiles, got %zd", name, max_n, len);
        return false;
    }
    for (Py_ssize_t i = 0; i < len; ++i) {
        const unsigned char t = static_cast<unsigned char>(buf[i]);
        if (t > (red ? 36 : 33)) {
            PyErr_Format(PyExc_ValueError, "%s: tile id %d is not %s", name, t,
                         red ? "an id 0-36" : "a deaka'd id 0-33");
            return false;
        }
        out[i] = t;
    }
    *n = static_cast<uint8_t>(len);
    return true;
}

// Dora and extra-han counts: a real hand has at most 18 tiles, each a dora of up to
// 5 indicators, plus 3 red fives, and well under 100 extra han. Bounding them
// keeps every han sum (and the shift in point.hpp) inside int.
constexpr int kMaxCount = 100;

bool check_count(const char* name, int v) {
    if (v < 0 || v > kMaxCount) {
        PyErr_Format(PyExc_ValueError, "%s: expected 0-%d, got %d", name, kMaxCount, v);
        return false;
    }
    return true;
}

bool check_wind(const char* name, int w) {
    if (w < 27 || w > 30) {
        PyErr_Format(PyExc_ValueError, "%s: expected a wind tile id 27-30, got %d", name, w);
        return false;
    }
    return true;
}

PyObject* py_shanten(PyObject*, PyObject* args) {
    const char* buf;
    Py_ssize_t len;
    int len_div3;
    if (!PyArg_ParseTuple(args, "y#i:shanten", &buf, &len, &len_div3)) return nullptr;
    uint8_t tehai[34];
    if (!read_counts("tehai", buf, len, tehai)) return nullptr;
    if (len_div3 < 0 || len_div3 > 4) {
        PyErr_Format(PyExc_ValueError, "len_div3: expected 0-4, got %d", len_div3);
        return nullptr;
    }
    try {
        return PyLong_FromLong(sp::calc_all(tehai, len_div3));
    } catch (const std::bad_alloc&) {  // the shanten tables are allocated on first use
        return PyErr_NoMemory();
    }
}

// Parse the fixed hand context shared by agari() and sp_calc().
struct HandArgs {
    const char *chis, *pons, *minkans, *ankans;
    Py_ssize_t n_chis, n_pons, n_minkans, n_ankans;
    int bakaze, jikaze, is_menzen;
};

bool fill_hand(const HandArgs& a, sp::Hand* h) {
    if (!read_tiles("chis", a.chis, a.n_chis, 4, h->chis, &h->n_chis) ||
        !read_tiles("pons", a.pons, a.n_pons, 4, h->pons, &h->n_pons) ||
        !read_tiles("minkans", a.minkans, a.n_minkans, 4, h->minkans, &h->n_minkans) ||
        !read_tiles("ankans", a.ankans, a.n_ankans, 4, h->ankans, &h->n_ankans) ||
        !check_wind("bakaze", a.bakaze) || !check_wind("jikaze", a.jikaze))
        return false;
    for (int i = 0; i < h->n_chis; ++i) {
        if (h->chis[i] >= 27 || h->chis[i] % 9 > 6) {
            PyErr_Format(PyExc_ValueError, "chis: tile id %d cannot start a chi (a number tile of rank 1-7)",
                         h->chis[i]);
            return false;
        }
    }
    if (h->n_chis + h->n_pons + h->n_minkans + h->n_ankans > 4) {
        PyErr_SetString(PyExc_ValueError, "chis/pons/minkans/ankans: more than 4 calls");
        return false;
    }
    h->bakaze = static_cast<uint8_t>(a.bakaze);
    h->jikaze = static_cast<uint8_t>(a.jikaze);
    h->is_menzen = a.is_menzen != 0;
    return true;
}

// The concealed tiles must number 3 * (4 - calls) + extra (extra 1 or 2).
bool check_hand_size(const sp::Hand& h, const uint8_t tehai[34], int extra) {
    const int calls = h.n_chis + h.n_pons + h.n_minkans + h.n_ankans;
    int total = 0;
    for (int i = 0; i < 34; ++i) total += tehai[i];
    if (total != 3 * (4 - calls) + extra) {
        PyErr_Format(PyExc_ValueError, "tehai: %d tiles with %d calls, expected %d", total, calls,
                     3 * (4 - calls) + extra);
        return false;
    }
    return true;
}

PyObject* py_agari(PyObject*, PyObject* args) {
    const char* tbuf;
    Py_ssize_t tlen;
    HandArgs a{};
    int winning_tile, is_ron, additional_hans, doras;
    if (!PyArg_ParseTuple(args, "y#py#y#y#y#iiipii:agari", &tbuf, &tlen, &a.is_menzen, &a.chis, &a.n_chis,
                          &a.pons, &a.n_pons, &a.minkans, &a.n_minkans, &a.ankans, &a.n_ankans, &a.bakaze,
                          &a.jikaze, &winning_tile, &is_ron, &additional_hans, &doras))
        return nullptr;
    sp::Hand h{};
    if (!read_counts("tehai", tbuf, tlen, h.tehai) || !fill_hand(a, &h) || !check_hand_size(h, h.tehai, 2))
        return nullptr;
    if (winning_tile < 0 || winning_tile > 33) {
        PyErr_Format(PyExc_ValueError, "winning_tile: expected a deaka'd id 0-33, got %d", winning_tile);
        return nullptr;
    }
    if (!check_count("additional_hans", additional_hans) || !check_count("doras", doras)) return nullptr;
    h.winning_tile = static_cast<uint8_t>(winning_tile);
    h.is_ron = is_ron != 0;
    sp::Yaku y{};
    if (!sp::agari(h, additional_hans, doras, &y)) Py_RETURN_NONE;
    return Py_BuildValue("(iii)", y.yakuman, y.han, y.fu);
}

PyObject* float_tuple(const double* v, int n) {
    PyObject* t = PyTuple_New(n);
    if (!t) return nullptr;
    for (int i = 0; i < n; ++i) {
        PyObject* f = PyFloat_FromDouble(v[i]);
        if (!f) {
            Py_DECREF(t);
            return nullptr;
        }
        PyTuple_SET_ITEM(t, i, f);
    }
    return t;
}

PyObject* candidate_tuple(const sp::Candidate& c, int T) {
    const int n = c.has_values ? T : 0;
    PyObject* req = PyTuple_New(static_cast<Py_ssize_t>(c.required.size()));
    if (!req) return nullptr;
    for (size_t i = 0; i < c.required.size(); ++i) {
        PyObject* p = Py_BuildValue("(ii)", c.required[i].first, c.required[i].second);
        if (!p) {
            Py_DECREF(req);
            return nullptr;
        }
        PyTuple_SET_ITEM(req, static_cast<Py_ssize_t>(i), p);
    }
    PyObject* tp = float_tuple(c.values.tenpai, n);
    PyObject* wp = float_tuple(c.values.win, n);
    PyObject* ev = float_tuple(c.values.ev, n);
    if (!tp || !wp || !ev) {
        Py_XDECREF(tp);
        Py_XDECREF(wp);
        Py_XDECREF(ev);
        Py_DECREF(req);
        return nullptr;
    }
    return Py_BuildValue("(iNNNNO)", c.tile, tp, wp, ev, req, c.shanten_down ? Py_True : Py_False);
}

// One SP calculation (and, for sp_rows, its decision's rows), parsed from Python and run without the
// interpreter lock.
struct Job {
    sp::Context ctx;
    uint8_t tehai[34], seen[34];
    int akas_in_hand = 0, akas_seen = 0, can_discard = 0, tsumos_left = 1, cur_shanten = 0;
    std::vector<sp::Candidate> out;
    bool out_of_memory = false;  // set instead of letting std::bad_alloc end the process
    bool no_candidates = false;
    sp::Decision decision;       // sp_rows only
    float* rows = nullptr;       // sp_rows only: 123 x 34 float32 to write

    void search() {
        sp::Search s(ctx, tehai, akas_in_hand, seen, akas_seen, tsumos_left);
        if (cur_shanten <= sp::kShantenThres)
            out = can_discard ? s.analyze_discard(cur_shanten) : s.analyze_draw(cur_shanten);
        else
            out = can_discard ? s.analyze_discard_simple(cur_shanten) : s.analyze_draw_simple();
    }

    void run() noexcept {
        try {
            if (rows == nullptr) {
                search();
                return;
            }
            const sp::Decision& d = decision;
            if (!d.search) {
                std::memset(rows, 0, sizeof(float) * sp::kSpRows * 34);
                sp::fill_ev(rows, sp::fallback_value(d));
                return;
            }
            search();
            if (out.empty()) {
                no_candidates = true;
                return;
            }
            sp::sort_candidates(out, d.by_ev);
            if (d.last_tsumo >= 0) out[0].tile = d.last_tsumo;
            sp::fill_rows(out, tsumos_left, d.can_discard, rows);
        } catch (const std::bad_alloc&) {
            out.clear();
            out_of_memory = true;
        }
    }
};

// The checks of a parsed job (ctx.hand_base, tehai, seen, the scalars set); completes ctx. False with a
// Python error set.
bool check_job(Job* job, int len_div3, int num_doras_in_fuuro) {
    sp::Context& ctx = job->ctx;
    const sp::Hand& h = ctx.hand_base;
    if (len_div3 != 4 - (h.n_chis + h.n_pons + h.n_minkans + h.n_ankans)) {
        PyErr_Format(PyExc_ValueError, "len_div3: %d does not match the calls (%d)", len_div3,
                     h.n_chis + h.n_pons + h.n_minkans + h.n_ankans);
        return false;
    }
    if (!check_hand_size(h, job->tehai, job->can_discard ? 2 : 1)) return false;
    if (job->cur_shanten < 0) {
        PyErr_SetString(PyExc_ValueError, "can't calculate an agari hand");
        return false;
    }
    if (job->tsumos_left < 1 || job->tsumos_left > sp::kMaxTsumosLeft) {
        PyErr_Format(PyExc_ValueError, "tsumos_left must be 1-17, got %d", job->tsumos_left);
        return false;
    }
    int unseen = 0;
    for (int i = 0; i < 34; ++i) {
        if (job->tehai[i] > job->seen[i]) {
            PyErr_Format(PyExc_ValueError, "tiles_seen: tile %d is seen %d times but %d are in hand", i,
                         job->seen[i], job->tehai[i]);
            return false;
        }
        unseen += 4 - job->seen[i];
    }
    // A search path draws at most kShantenThres + 1 tiles and the uradora estimate
    // divides by the tiles still unseen after that; a real game always leaves the
    // dead wall (9+ tiles) unseen.
    if (unseen < sp::kShantenThres + 2) {
        PyErr_Format(PyExc_ValueError, "tiles_seen: only %d tiles unseen, at least %d needed", unseen,
                     sp::kShantenThres + 2);
        return false;
    }
    if (!check_count("num_doras_in_fuuro", num_doras_in_fuuro)) return false;
    ctx.len_div3 = len_div3;
    ctx.num_doras_in_fuuro = num_doras_in_fuuro;
    for (int k = 0; k < ctx.n_indicators; ++k)
        ctx.doras[k] = static_cast<uint8_t>(sp::next_tile(ctx.dora_indicators[k]));
    return true;
}

// Parse sp_calc's argument tuple into `job`; false with a Python error set.
bool parse_job(PyObject* args, Job* job) {
    HandArgs a{};
    int len_div3, num_doras_in_fuuro, calc_double_riichi, calc_haitei, prefer_riichi;
    const char *ind_buf, *tehai_buf, *seen_buf;
    Py_ssize_t ind_len, tehai_len, seen_len;
    if (!PyArg_ParseTuple(args, "iy#y#y#y#iipiy#pppy#iy#ipii:sp_calc", &len_div3, &a.chis, &a.n_chis, &a.pons,
                          &a.n_pons, &a.minkans, &a.n_minkans, &a.ankans, &a.n_ankans, &a.bakaze, &a.jikaze,
                          &a.is_menzen, &num_doras_in_fuuro, &ind_buf, &ind_len, &calc_double_riichi,
                          &calc_haitei, &prefer_riichi, &tehai_buf, &tehai_len, &job->akas_in_hand, &seen_buf,
                          &seen_len, &job->akas_seen, &job->can_discard, &job->tsumos_left, &job->cur_shanten))
        return false;
    sp::Context& ctx = job->ctx;
    if (!fill_hand(a, &ctx.hand_base) || !read_counts("tehai", tehai_buf, tehai_len, job->tehai) ||
        !read_counts("tiles_seen", seen_buf, seen_len, job->seen))
        return false;
    uint8_t n_ind = 0;
    if (!read_tiles("dora_indicators", ind_buf, ind_len, 5, ctx.dora_indicators, &n_ind)) return false;
    ctx.n_indicators = n_ind;
    ctx.calc_double_riichi = calc_double_riichi != 0;
    ctx.calc_haitei = calc_haitei != 0;
    ctx.prefer_riichi = prefer_riichi != 0;
    return check_job(job, len_div3, num_doras_in_fuuro);
}

enum DecisionFlag {
    kCanDiscard = 1, kRiichiAccepted = 2, kCanWRiichi = 4, kCanRon = 8, kCanTsumo = 16, kIsOya = 32,
    kIsWRiichi = 64, kAtIppatsu = 128, kAtRinshan = 256, kPendingKakan = 512,
};

// Parse one decision's facts (see sp_rows) into `job` as Mortal's agent_helper.rs sets up its search, or
// its fallback; false with a Python error set.
bool parse_decision(PyObject* args, Job* job) {
    HandArgs a{};
    const char *tehai_buf, *seen_buf, *ind_buf, *fuuro_buf;
    Py_ssize_t tehai_len, seen_len, ind_len, fuuro_len;
    int tiles_left, flags, target_rel, last_tsumo, last_kawa, score0;
    if (!PyArg_ParseTuple(args, "y#iy#y#y#y#iiy#iy#y#iiiiii:sp_rows", &tehai_buf, &tehai_len, &job->akas_in_hand,
                          &a.chis, &a.n_chis, &a.pons, &a.n_pons, &a.minkans, &a.n_minkans, &a.ankans,
                          &a.n_ankans, &a.bakaze, &a.jikaze, &seen_buf, &seen_len, &job->akas_seen, &ind_buf,
                          &ind_len, &fuuro_buf, &fuuro_len, &tiles_left, &flags, &target_rel, &last_tsumo,
                          &last_kawa, &score0))
        return false;
    a.is_menzen = a.n_chis + a.n_pons + a.n_minkans == 0;
    sp::Context& ctx = job->ctx;
    sp::Decision& d = job->decision;
    uint8_t ind[5], fuuro[16], n_ind = 0, n_fuuro = 0;
    if (!fill_hand(a, &ctx.hand_base) || !read_counts("tehai", tehai_buf, tehai_len, job->tehai) ||
        !read_counts("tiles_seen", seen_buf, seen_len, job->seen) ||
        !read_tiles("dora_indicators", ind_buf, ind_len, 5, ind, &n_ind, true) ||
        !read_tiles("own_fuuro_tiles", fuuro_buf, fuuro_len, 16, fuuro, &n_fuuro, true))
        return false;
    if (last_tsumo < -1 || last_tsumo > 36 || last_kawa < -1 || last_kawa > 36) {
        PyErr_Format(PyExc_ValueError, "last tiles: expected ids -1-36, got %d and %d", last_tsumo, last_kawa);
        return false;
    }
    job->akas_in_hand &= 7;
    job->akas_seen &= 7;
    const sp::Hand& h = ctx.hand_base;
    const int len_div3 = 4 - (h.n_chis + h.n_pons + h.n_minkans + h.n_ankans);
    int factor[34] = {};
    for (int k = 0; k < n_ind; ++k) {
        ctx.dora_indicators[k] = static_cast<uint8_t>(sp::deaka(ind[k]));
        ++factor[sp::next_tile(ind[k])];
    }
    ctx.n_indicators = n_ind;
    int in_fuuro = 0, doras_owned = 0;
    for (int k = 0; k < n_fuuro; ++k) in_fuuro += factor[sp::deaka(fuuro[k])] + (fuuro[k] >= 34);
    for (int t = 0; t < 34; ++t) doras_owned += job->tehai[t] * factor[t];
    for (int r = 0; r < 3; ++r) doras_owned += job->akas_in_hand >> r & 1;
    doras_owned += in_fuuro;
    if (h.is_menzen && h.n_ankans == 0) in_fuuro = 0;

    d.can_discard = flags & kCanDiscard;
    int shanten = -1, tsumos_left = 0;
    bool haitei = false;
    if (tiles_left >= 4) {
        shanten = sp::calc_all(job->tehai, len_div3);
        if (!d.can_discard) shanten = std::max(shanten, 0);
        if (shanten >= 0) {
            const int next = d.can_discard ? tiles_left : std::max(tiles_left - (4 - target_rel), 0);
            tsumos_left = next / 4;
            haitei = next % 4 == 0;
        }
    }
    d.search = shanten >= 0 && tsumos_left >= 1;
    if (d.search) {
        job->can_discard = d.can_discard;
        if (d.can_discard && (flags & kRiichiAccepted)) {  // the discard after riichi: only the drawn tile
            const int t = sp::deaka(last_tsumo);
            if (last_tsumo < 0 || job->tehai[t] == 0) {
                PyErr_SetString(PyExc_ValueError, "riichi accepted: the last own draw is not in the hand");
                return false;
            }
            job->tehai[t] -= 1;
            if (last_tsumo >= 34) job->akas_in_hand &= ~(1 << (last_tsumo - 34));
            job->can_discard = 0;
            d.last_tsumo = last_tsumo;
        }
        ctx.calc_double_riichi = d.can_discard && (flags & kCanWRiichi);
        ctx.calc_haitei = haitei;
        ctx.prefer_riichi = score0 >= 1000;
        job->tsumos_left = std::min(tsumos_left, sp::kMaxTsumosLeft);
        job->cur_shanten = shanten;
        d.by_ev = shanten <= sp::kShantenThres;
        return check_job(job, len_div3, in_fuuro);
    }
    // no search: the value of winning now
    d.can_ron = flags & kCanRon;
    d.can_tsumo = flags & kCanTsumo;
    d.is_oya = flags & kIsOya;
    if (!(d.can_ron || d.can_tsumo)) return true;
    if (!d.can_ron && (flags & kCanWRiichi)) {
        d.w_riichi_tsumo = true;
        return true;
    }
    const int win = d.can_ron ? last_kawa : last_tsumo;
    d.win_tile = win;
    if (win < 0) return true;
    const bool ron = d.can_ron, kakan = flags & kPendingKakan, rinshan = flags & kAtRinshan;
    const int riichi = (flags & kRiichiAccepted) != 0, w_riichi = (flags & kIsWRiichi) != 0;
    const int ippatsu = (flags & kAtIppatsu) && !(kakan && !ron);
    const bool last = tiles_left == 0;
    uint8_t counts[34];
    std::memcpy(counts, job->tehai, 34);
    if (ron) {
        d.extra_han = riichi + w_riichi + ippatsu + last + (kakan && ron);
        counts[sp::deaka(win)] += 1;
        doras_owned += factor[sp::deaka(win)] + (win >= 34);
    } else {
        d.extra_han = riichi + w_riichi + ippatsu + h.is_menzen + (last && !rinshan) + rinshan;
    }
    d.doras = doras_owned;
    d.hand = h;
    if (!read_counts("tehai", reinterpret_cast<const char*>(counts), 34, d.hand.tehai) ||
        !check_hand_size(d.hand, d.hand.tehai, 2) || !check_count("additional_hans", d.extra_han) ||
        !check_count("doras", d.doras))
        return false;
    d.hand.winning_tile = static_cast<uint8_t>(sp::deaka(win));
    d.hand.is_ron = ron;
    return true;
}

PyObject* job_result(const Job& job) {
    if (job.out_of_memory) return PyErr_NoMemory();
    PyObject* out = PyList_New(static_cast<Py_ssize_t>(job.out.size()));
    if (!out) return nullptr;
    for (size_t i = 0; i < job.out.size(); ++i) {
        PyObject* c = candidate_tuple(job.out[i], job.tsumos_left);
        if (!c) {
            Py_DECREF(out);
            return nullptr;
        }
        PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), c);
    }
    return out;
}

PyObject* py_sp_calc(PyObject*, PyObject* args) {
    Job job;
    if (!parse_job(args, &job)) return nullptr;
    Py_BEGIN_ALLOW_THREADS
    job.run();
    Py_END_ALLOW_THREADS
    return job_result(job);
}

// Run jobs[i].run() for every job on up to `threads` threads (the caller released the interpreter lock).
void run_jobs(std::vector<Job>& jobs, int threads) {
    const int workers = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), jobs.size()));
    std::atomic<size_t> next{0};
    auto work = [&jobs, &next]() {
        for (size_t i = next++; i < jobs.size(); i = next++) jobs[i].run();
    };
    std::vector<std::thread> pool;
    for (int w = 1; w < workers; ++w) {
        try {
            pool.emplace_back(work);
        } catch (const std::exception&) {  // no more threads (limits, memory): go on with those started
            break;
        }
    }
    work();
    for (std::thread& t : pool) t.join();
}

PyObject* py_sp_rows(PyObject*, PyObject* args) {
    PyObject* seq;
    Py_buffer out;
    int threads, defer = 0;
    if (!PyArg_ParseTuple(args, "Ow*i|p:sp_rows", &seq, &out, &threads, &defer)) return nullptr;
    PyObject* fast = PySequence_Fast(seq, "sp_rows: expected a sequence of decision tuples");
    if (!fast) {
        PyBuffer_Release(&out);
        return nullptr;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const Py_ssize_t row_bytes = static_cast<Py_ssize_t>(sizeof(float)) * sp::kSpRows * 34;
    std::vector<Job> jobs;
    bool ok = true;
    if (out.len != n * row_bytes) {
        PyErr_Format(PyExc_ValueError, "sp_rows: an output of %zd bytes for %zd decisions (%zd bytes each)",
                     out.len, n, row_bytes);
        ok = false;
    } else {
        try {
            jobs.resize(static_cast<size_t>(n));
        } catch (const std::bad_alloc&) {
            PyErr_NoMemory();
            ok = false;
        }
    }
    for (Py_ssize_t i = 0; ok && i < n; ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "sp_rows: item %zd is not a tuple", i);
            ok = false;
        } else if (!parse_decision(item, &jobs[static_cast<size_t>(i)])) {
            ok = false;
        } else {
            jobs[static_cast<size_t>(i)].rows = reinterpret_cast<float*>(static_cast<char*>(out.buf) + i * row_bytes);
        }
    }
    Py_DECREF(fast);
    if (ok && defer) {  // checked; only the decisions without a search are written (cheap: no search)
        PyObject* pending = PyList_New(n);
        for (Py_ssize_t i = 0; pending && i < n; ++i) {
            Job& job = jobs[static_cast<size_t>(i)];
            if (!job.decision.search) job.run();
            PyObject* flag = job.decision.search ? Py_True : Py_False;
            Py_INCREF(flag);
            PyList_SET_ITEM(pending, i, flag);
        }
        PyBuffer_Release(&out);
        return pending;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        run_jobs(jobs, threads);
        Py_END_ALLOW_THREADS
        for (const Job& job : jobs) {
            if (job.out_of_memory) {
                PyErr_NoMemory();
                ok = false;
                break;
            }
            if (job.no_candidates) {
                PyErr_SetString(PyExc_ValueError, "sp_rows: the search found no candidate");
                ok = false;
                break;
            }
        }
    }
    PyBuffer_Release(&out);
    if (!ok) return nullptr;
    Py_RETURN_NONE;
}

// repack_v3(v3, scores, honba, kyotaku, out): rows 0-888 of a version-4 observation (1012 x 34 float32)
// from a version-3 one (934 x 34), as mortal.features.obs_v4.ROW_TABLE lays them out: v3 rows copied
// in blocks, each score as clamp(s, 0, 30000) / 30000 after its v3 row, honba and kyotaku as min(n, 10) / 10,
// the doras-owned rescale rows only.
struct RowCopy {
    int dst, src, n;
};
constexpr RowCopy kV3Rows[] = {{0, 0, 4},    {4, 4, 3},     {15, 47, 4},   {19, 51, 4},    {25, 59, 2},
                               {27, 61, 1},  {28, 62, 7},   {35, 69, 683}, {722, 764, 1}, {723, 768, 166}};
constexpr int kV3Channels = 934, kV4Channels = 1012, kV4SpStart = 889;

PyObject* py_repack_v3(PyObject*, PyObject* args) {
    Py_buffer v3, out;
    int scores[4], honba, kyotaku;
    if (!PyArg_ParseTuple(args, "y*(iiii)iiw*:repack_v3", &v3, &scores[0], &scores[1], &scores[2], &scores[3],
                          &honba, &kyotaku, &out))
        return nullptr;
    PyObject* result = nullptr;
    if (v3.len != kV3Channels * 34 * 4 || out.len != kV4Channels * 34 * 4) {
        PyErr_Format(PyExc_ValueError, "repack_v3: %zd and %zd bytes, expected (934, 34) and (1012, 34) float32",
                     v3.len, out.len);
    } else {
        const float* src = static_cast<const float*>(v3.buf);
        float* dst = static_cast<float*>(out.buf);
        for (const RowCopy& r : kV3Rows) std::memcpy(dst + 34 * r.dst, src + 34 * r.src, sizeof(float) * 34 * r.n);
        auto fill = [dst](int row, double v) {
            for (int c = 0; c < 34; ++c) dst[34 * row + c] = static_cast<float>(v);
        };
        for (int p = 0; p < 4; ++p) {
            std::memcpy(dst + 34 * (7 + 2 * p), src + 34 * (7 + 10 * p), sizeof(float) * 34);
            fill(8 + 2 * p, std::min(std::max(scores[p], 0), 30000) / 30000.0);
            std::memcpy(dst + 34 * (718 + p), src + 34 * (752 + 3 * p), sizeof(float) * 34);
        }
        fill(23, std::min(honba, 10) / 10.0);
        fill(24, std::min(kyotaku, 10) / 10.0);
        static_assert(kV4SpStart == 723 + 166, "the v3 rows end where the single-player rows start");
        Py_INCREF(Py_None);
        result = Py_None;
    }
    PyBuffer_Release(&v3);
    PyBuffer_Release(&out);
    return result;
}

// ---------------------------------------------------------------- packed observations
// pack_obs(obs, real_rows, binary_mask, out, index): one pass over a (C, 34) float32
// observation writing row `index` of the packed store `out` (mortal.features.packed_obs):
// the rows flagged in real_rows copied as float32, then one bit per element (element j
// at bit j % 8 of byte j / 8: set iff the value is nonzero). binary_mask has a bit set
// for every element outside the real rows; such an element must be exactly +0.0 or 1.0
// (bit patterns 0 and 0x3F800000), else the flat index of the first one is returned so
// the caller can refuse the sample. Returns -1 when the row was written.
constexpr uint32_t kOneBits = 0x3F800000u;

// Scalar bits of elements [j, n) (bytes from j / 8 on are rewritten); first bad index or -1.
Py_ssize_t pack_bits_tail(const uint32_t* u, Py_ssize_t j, Py_ssize_t n, uint8_t* bits, const uint8_t* allowed) {
    Py_ssize_t bad_at = -1;
    for (Py_ssize_t k = j / 8; k < (n + 7) / 8; ++k) bits[k] = 0;
    for (; j < n; ++j) {
        const bool nz = u[j] != 0;
        bits[j / 8] |= static_cast<uint8_t>(nz << (j % 8));
        if (nz && u[j] != kOneBits && (allowed[j / 8] >> (j % 8) & 1) && bad_at < 0) bad_at = j;
    }
    return bad_at;
}

#ifdef __SSE2__
// Bit k set iff 32-bit lane k of a|b|c|d (16 lanes) equals v's lanes.
inline unsigned eq_mask16(__m128i a, __m128i b, __m128i c, __m128i d, __m128i v) {
    const __m128i ab = _mm_packs_epi32(_mm_cmpeq_epi32(a, v), _mm_cmpeq_epi32(b, v));
    const __m128i cd = _mm_packs_epi32(_mm_cmpeq_epi32(c, v), _mm_cmpeq_epi32(d, v));
    return static_cast<unsigned>(_mm_movemask_epi8(_mm_packs_epi16(ab, cd)));
}
#endif

// The bits of all n elements, 16 at a time (SSE2; scalar elsewhere); first bad index or -1.
Py_ssize_t pack_bits_sse2(const uint32_t* u, Py_ssize_t n, uint8_t* bits, const uint8_t* allowed) {
    Py_ssize_t j = 0, bad_at = -1;
    unsigned bad = 0;
#ifdef __SSE2__
    const __m128i zero = _mm_setzero_si128();
    const __m128i one_bits = _mm_set1_epi32(static_cast<int>(kOneBits));
    for (; j + 16 <= n; j += 16) {
        const __m128i* p = reinterpret_cast<const __m128i*>(u + j);
        const __m128i a = _mm_loadu_si128(p), b = _mm_loadu_si128(p + 1);
        const __m128i c = _mm_loadu_si128(p + 2), d = _mm_loadu_si128(p + 3);
        const uint16_t nz = static_cast<uint16_t>(~eq_mask16(a, b, c, d, zero));
        const unsigned one = eq_mask16(a, b, c, d, one_bits);
        uint16_t allowed16;
        std::memcpy(&allowed16, allowed + j / 8, 2);
        std::memcpy(bits + j / 8, &nz, 2);
        const unsigned x = nz & ~one & allowed16;
        if (x != 0 && bad_at < 0) {
            bad_at = j;
            bad = x;
        }
    }
#endif
    const Py_ssize_t tail = pack_bits_tail(u, j, n, bits, allowed);
    return bad_at >= 0 ? bad_at + __builtin_ctz(bad) : tail;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MORTAL_HAVE_AVX2_PATH 1
// As eq_mask16 for 32 lanes; the packs work per 128-bit half, the permute restores lane order.
__attribute__((target("avx2"))) inline uint32_t eq_mask32(__m256i a, __m256i b, __m256i c, __m256i d, __m256i v) {
    const __m256i ab = _mm256_packs_epi32(_mm256_cmpeq_epi32(a, v), _mm256_cmpeq_epi32(b, v));
    const __m256i cd = _mm256_packs_epi32(_mm256_cmpeq_epi32(c, v), _mm256_cmpeq_epi32(d, v));
    const __m256i abcd = _mm256_packs_epi16(ab, cd);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    return static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_permutevar8x32_epi32(abcd, order)));
}

__attribute__((target("avx2"))) Py_ssize_t pack_bits_avx2(const uint32_t* u, Py_ssize_t n, uint8_t* bits,
                                                          const uint8_t* allowed) {
    Py_ssize_t j = 0, bad_at = -1;
    uint32_t bad = 0;
    const __m256i zero = _mm256_setzero_si256();
    const __m256i one_bits = _mm256_set1_epi32(static_cast<int>(kOneBits));
    for (; j + 32 <= n; j += 32) {
        const __m256i* p = reinterpret_cast<const __m256i*>(u + j);
        const __m256i a = _mm256_loadu_si256(p), b = _mm256_loadu_si256(p + 1);
        const __m256i c = _mm256_loadu_si256(p + 2), d = _mm256_loadu_si256(p + 3);
        const uint32_t nz = ~eq_mask32(a, b, c, d, zero);
        const uint32_t one = eq_mask32(a, b, c, d, one_bits);
        uint32_t allowed32;
        std::memcpy(&allowed32, allowed + j / 8, 4);
        std::memcpy(bits + j / 8, &nz, 4);
        const uint32_t x = nz & ~one & allowed32;
        if (x != 0 && bad_at < 0) {
            bad_at = j;
            bad = x;
        }
    }
    const Py_ssize_t tail = pack_bits_tail(u, j, n, bits, allowed);
    return bad_at >= 0 ? bad_at + __builtin_ctz(bad) : tail;
}
#endif

Py_ssize_t pack_bits(const uint32_t* u, Py_ssize_t n, uint8_t* bits, const uint8_t* allowed) {
#ifdef MORTAL_HAVE_AVX2_PATH
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return pack_bits_avx2(u, n, bits, allowed);
#endif
    return pack_bits_sse2(u, n, bits, allowed);
}

PyObject* py_pack_obs(PyObject*, PyObject* args) {
    Py_buffer obs;
    const char* real_rows;
    Py_ssize_t n_rows;
    const char* binary_mask;
    Py_ssize_t mask_len;
    Py_buffer out;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "y*y#y#w*n:pack_obs", &obs, &real_rows, &n_rows, &binary_mask, &mask_len, &out,
                          &index))
        return nullptr;
    PyObject* result = nullptr;
    const Py_ssize_t n = n_rows * 34;
    const Py_ssize_t n_bytes = (n + 7) / 8;
    Py_ssize_t n_real = 0;
    for (Py_ssize_t r = 0; r < n_rows; ++r) n_real += real_rows[r] != 0;
    const Py_ssize_t real_bytes = n_real * 34 * 4;
    const Py_ssize_t row_bytes = real_bytes + (n_bytes + 3) / 4 * 4;
    if (obs.len != n * 4 || mask_len != n_bytes) {
        PyErr_Format(PyExc_ValueError, "pack_obs: %zd observation bytes and %zd mask bytes for %zd rows", obs.len,
                     mask_len, n_rows);
    } else if (index < 0 || out.len < (index + 1) * row_bytes) {
        PyErr_Format(PyExc_ValueError, "pack_obs: row %zd of %zd bytes does not fit an output of %zd bytes", index,
                     row_bytes, out.len);
    } else {
        const uint32_t* u = static_cast<const uint32_t*>(obs.buf);
        uint8_t* dst = static_cast<uint8_t*>(out.buf) + index * row_bytes;
        uint8_t* real_dst = dst;
        for (Py_ssize_t r = 0; r < n_rows; ++r) {
            if (real_rows[r]) {
                std::memcpy(real_dst, u + r * 34, 34 * 4);
                real_dst += 34 * 4;
            }
        }
        const Py_ssize_t bad_at = pack_bits(u, n, dst + real_bytes, reinterpret_cast<const uint8_t*>(binary_mask));
        for (Py_ssize_t j = real_bytes + n_bytes; j < row_bytes; ++j) dst[j] = 0;
        result = PyLong_FromSsize_t(bad_at);
    }
    PyBuffer_Release(&obs);
    PyBuffer_Release(&out);
    return result;
}

PyMethodDef kMethods[] = {
    {"shanten", py_shanten, METH_VARARGS,
     "shanten(tehai: bytes[34], len_div3: int) -> int\n\n"
     "Least shanten (standard, chitoi, kokushi) as tests/sp_oracle/shanten.py calc_all_py; -1 = complete."},
    {"agari", py_agari, METH_VARARGS,
     "agari(tehai, is_menzen, chis, pons, minkans, ankans, bakaze, jikaze, winning_tile, is_ron,\n"
     "      additional_hans, doras) -> (yakuman, han, fu) | None\n\n"
     "As mortal.features.sp.calc.agari; tile arguments are bytes of deaka'd ids."},
    {"sp_calc", py_sp_calc, METH_VARARGS,
     "sp_calc(len_div3, chis, pons, minkans, ankans, bakaze, jikaze, is_menzen, num_doras_in_fuuro,\n"
     "        dora_indicators, calc_double_riichi, calc_haitei, prefer_riichi, tehai, akas_in_hand,\n"
     "        tiles_seen, akas_seen, can_discard, tsumos_left, cur_shanten) -> list\n\n"
     "Unsorted SP candidates as (tile, tenpai_probs, win_probs, exp_values, required_tiles,\n"
     "shanten_down); see mortal.features.sp.calc.SPCalculator.calc. akas_* are 3-bit masks (m, p, s).\n"
     "Runs without the interpreter lock."},
    {"sp_rows", py_sp_rows, METH_VARARGS,
     "sp_rows(decisions: list[tuple], out: writable buffer, threads: int, defer: bool = False) -> None | list\n\n"
     "Rows 889-1011 (123 x 34 float32) of each version-4 decision into out (len(decisions) x 123 x 34),\n"
     "searched on up to `threads` threads without the interpreter lock. A decision is (tehai: bytes[34],\n"
     "akas_in_hand, chis, pons, minkans, ankans, bakaze, jikaze, tiles_seen: bytes[34], akas_seen,\n"
     "dora_indicators, own_fuuro_tiles, tiles_left, flags, target_rel, last_self_tsumo, last_kawa_tile,\n"
     "score): see mortal.features.obs_v4.V4Encoder. Every decision is checked before any search.\n"
     "defer: check every decision, write only those that need no search, return which need one."},
    {"repack_v3", py_repack_v3, METH_VARARGS,
     "repack_v3(v3: (934, 34) float32, scores: 4 ints, honba: int, kyotaku: int, out: (1012, 34) float32)\n\n"
     "Write rows 0-888 of the version-4 observation out from the version-3 one (mortal.features.obs_v4 ROW_TABLE)."},
    {"pack_obs", py_pack_obs, METH_VARARGS,
     "pack_obs(obs, real_rows: bytes[C], binary_mask: bytes, out, index: int) -> int\n\n"
     "Write row `index` of a packed observation store (see mortal.features.packed_obs.pack_into); -1 when\n"
     "written, else the flat index of the first element outside the real rows that is not 0.0 or 1.0."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_core", "Compiled single-player (SP) core for observation v4 (see mortal.features.sp.calc).",
    -1, kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__core(void) { return PyModule_Create(&kModule); }
