// mortal.model._stem: the first convolution of the Brain, computed from the nonzero inputs only.
//
// An encoded observation (C, 34) float32 is about 90% zeros (most rows are 0/1 flags), so the
// width-3, padding-1 convolution out[o, t] = sum_{c,k} W[o, c, k] * x[c, t + k - 1] costs far less
// when it walks the nonzero x[c, t] and adds v * W[:, c, k] to out[:, t - k + 1] for k = 0..2 than
// as a dense product. Every value is used as it is (not only 0/1), so the result is the dense
// convolution's up to the order of the float additions. Used by mortal.model.inference for CPU
// inference and by mortal.model.networks' stem (forward, and the weight gradient from the same nonzeros).
// Also Mish and its gradient elementwise from one exp (mish_forward, mish_backward), for networks.Mish on the CPU.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace {

constexpr int kWidth = 34;  // tile columns
constexpr int kPad = kWidth + 2;  // accumulator positions -1 .. 34; the two ends are dropped

// acc[p * O + o] += v * w[o] for one tap; O is a multiple of 8 on the AVX2 path.
inline void axpy(float* acc, const float* w, float v, int n_out) {
    for (int o = 0; o < n_out; ++o) acc[o] += v * w[o];
}

// Bit t set iff row[t] != 0 (any nonzero bit pattern but -0.0), t < 34.
inline uint64_t nonzero_bits_scalar(const uint32_t* row) {
    uint64_t bits = 0;
    for (int t = 0; t < kWidth; ++t) bits |= static_cast<uint64_t>((row[t] & 0x7FFFFFFFu) != 0) << t;
    return bits;
}

// Per input position t, the nonzero channels: y[t] = sum_c x[c, t] * W[c] (3 * O floats, the three taps
// side by side) is accumulated in registers, 96 floats at a time; then out[:, t] = y[t + 1] tap 0 +
// y[t] tap 1 + y[t - 1] tap 2. No store-to-load chain through memory, unlike the per-nonzero scatter.
struct Scratch {
    std::vector<int32_t> chan;   // (34, C): the nonzero channels of each position
    std::vector<float> val;      // (34, C): their values
    std::vector<float> y;        // (34, 3 * O)
    Scratch(int n_in, int n_out)
        : chan(static_cast<size_t>(kWidth) * n_in), val(static_cast<size_t>(kWidth) * n_in),
          y(static_cast<size_t>(kWidth) * 3 * n_out) {}
};

// One sample without SIMD: x (C, 34), w (C, 3, O), out (O, 34); the nonzero x[c, t] scattered into the
// outputs (acc: positions -1 .. 34, the two ends dropped).
void stem_scalar(const float* x, const float* w, float* out, Scratch& s, int n_in, int n_out) {
    float* acc = s.y.data();  // at least kPad * O floats
    std::memset(acc, 0, sizeof(float) * kPad * n_out);
    for (int c = 0; c < n_in; ++c) {
        const float* row = x + static_cast<size_t>(c) * kWidth;
        uint64_t bits = nonzero_bits_scalar(reinterpret_cast<const uint32_t*>(row));
        const float* wc = w + static_cast<size_t>(c) * 3 * n_out;
        while (bits) {
            const int t = __builtin_ctzll(bits);
            bits &= bits - 1;
            const float v = row[t];
            // tap k sends x[c, t] to output t - k + 1, accumulator position t - k + 2
            for (int k = 0; k < 3; ++k) axpy(acc + (t - k + 2) * n_out, wc + k * n_out, v, n_out);
        }
    }
    for (int o = 0; o < n_out; ++o)
        for (int t = 0; t < kWidth; ++t) out[o * kWidth + t] = acc[(t + 1) * n_out + o];
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MORTAL_STEM_AVX2 1
__attribute__((target("avx2,fma"))) inline uint64_t nonzero_bits_avx2(const float* row) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i zero = _mm256_setzero_si256();
    uint64_t bits = 0;
    for (int j = 0; j < 32; j += 8) {
        const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + j)), abs_mask);
        const unsigned is_zero = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero))));
        bits |= static_cast<uint64_t>(~is_zero & 0xFFu) << j;
    }
    const uint32_t* u = reinterpret_cast<const uint32_t*>(row);
    bits |= static_cast<uint64_t>((u[32] & 0x7FFFFFFFu) != 0) << 32 | static_cast<uint64_t>((u[33] & 0x7FFFFFFFu) != 0) << 33;
    return bits;
}

__attribute__((target("avx2,fma"))) void accumulate_avx2(const float* w, float* out, Scratch& s, const int* count,
                                                         int n_in, int n_out);

__attribute__((target("avx2,fma"))) void stem_avx2(const float* x, const float* w, float* out, Scratch& s, int n_in,
                                                   int n_out) {
    int count[kWidth] = {0};
    int32_t* chan = s.chan.data();
    float* val = s.val.data();
    for (int c = 0; c < n_in; ++c) {
        const float* row = x + static_cast<size_t>(c) * kWidth;
        uint64_t bits = nonzero_bits_avx2(row);
        while (bits) {
            const int t = __builtin_ctzll(bits);
            bits &= bits - 1;
            const int k = t * n_in + count[t]++;
            chan[k] = c;
            val[k] = row[t];
        }
    }
    accumulate_avx2(w, out, s, count, n_in, n_out);
}

// The second half of stem_avx2: from the per-position lists in s (count[t] channels of position t, ascending) to
// out (O, 34).
__attribute__((target("avx2,fma"))) void accumulate_avx2(const float* w, float* out, Scratch& s, const int* count,
                                                         int n_in, int n_out) {
    const int32_t* chan = s.chan.data();
    const float* val = s.val.data();
    const int width = 3 * n_out;  // a multiple of 24
    for (int t = 0; t < kWidth; ++t) {
        const int32_t* ct = chan + t * n_in;
        const float* vt = val + t * n_in;
        float* yt = s.y.data() + static_cast<size_t>(t) * width;
        int j = 0;
        for (; j + 96 <= width; j += 96) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
            __m256 a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
            for (int i = 0; i < count[t]; ++i) {
                const float* wr = w + static_cast<size_t>(ct[i]) * width + j;
                const __m256 v = _mm256_set1_ps(vt[i]);
                a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr), a0);
                a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 8), a1);
                a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 16), a2);
                a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 24), a3);
                a4 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 32), a4);
                a5 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 40), a5);
                a6 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 48), a6);
                a7 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 56), a7);
                a8 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 64), a8);
                a9 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 72), a9);
                a10 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 80), a10);
                a11 = _mm256_fmadd_ps(v, _mm256_loadu_ps(wr + 88), a11);
            }
            _mm256_storeu_ps(yt + j, a0);
            _mm256_storeu_ps(yt + j + 8, a1);
            _mm256_storeu_ps(yt + j + 16, a2);
            _mm256_storeu_ps(yt + j + 24, a3);
            _mm256_storeu_ps(yt + j + 32, a4);
            _mm256_storeu_ps(yt + j + 40, a5);
            _mm256_storeu_ps(yt + j + 48, a6);
            _mm256_storeu_ps(yt + j + 56, a7);
            _mm256_storeu_ps(yt + j + 64, a8);
            _mm256_storeu_ps(yt + j + 72, a9);
            _mm256_storeu_ps(yt + j + 80, a10);
            _mm256_storeu_ps(yt + j + 88, a11);
        }
        for (; j < width; j += 8) {  // the last < 96 floats, 8 at a time
            __m256 a = _mm256_setzero_ps();
            for (int i = 0; i < count[t]; ++i)
                a = _mm256_fmadd_ps(_mm256_set1_ps(vt[i]), _mm256_loadu_ps(w + static_cast<size_t>(ct[i]) * width + j), a);
            _mm256_storeu_ps(yt + j, a);
        }
    }
    const float* y = s.y.data();
    for (int o = 0; o < n_out; ++o) {
        for (int t = 0; t < kWidth; ++t) {
            float acc = y[t * width + n_out + o];  // tap 1 of position t
            if (t > 0) acc += y[(t - 1) * width + o];  // tap 0 of position t - 1
            if (t + 1 < kWidth) acc += y[(t + 1) * width + 2 * n_out + o];  // tap 2 of position t + 1
            out[o * kWidth + t] = acc;
        }
    }
}
#endif

using StemFn = void (*)(const float*, const float*, float*, Scratch&, int, int);

StemFn pick(int n_out) {
#ifdef MORTAL_STEM_AVX2
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && n_out % 8 == 0) return stem_avx2;
#endif
    return stem_scalar;
}

bool is_c_float32(const Py_buffer& b) {
    return b.itemsize == 4 && b.format != nullptr && std::strcmp(b.format, "f") == 0 && PyBuffer_IsContiguous(&b, 'C');
}

// sparse_stem(obs, weight, out): see the method table.
PyObject* py_sparse_stem(PyObject*, PyObject* args) {
    PyObject *obs_seq, *w_obj, *o_obj;
    Py_buffer wbuf, obuf;
    int n_in, n_out;
    if (!PyArg_ParseTuple(args, "OOOii:sparse_stem", &obs_seq, &w_obj, &o_obj, &n_in, &n_out)) return nullptr;
    if (PyObject_GetBuffer(w_obj, &wbuf, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) return nullptr;
    if (PyObject_GetBuffer(o_obj, &obuf, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
        PyBuffer_Release(&wbuf);
        return nullptr;
    }
    PyObject* result = nullptr;
    std::vector<Py_buffer> views;
    PyObject* seq = PySequence_Fast(obs_seq, "sparse_stem: obs must be a sequence of (C, 34) float32 arrays");
    Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
    const size_t sample = static_cast<size_t>(n_in) * kWidth;
    if (!seq) {
        // error set
    } else if (n_in <= 0 || n_out <= 0) {
        PyErr_Format(PyExc_ValueError, "sparse_stem: bad sizes C=%d O=%d", n_in, n_out);
    } else if (!is_c_float32(wbuf) || wbuf.len != static_cast<Py_ssize_t>(sample / kWidth * 3 * n_out * 4)) {
        PyErr_Format(PyExc_ValueError, "sparse_stem: weight must be contiguous float32 (C=%d, 3, O=%d)", n_in, n_out);
    } else if (!is_c_float32(obuf) || obuf.len != static_cast<Py_ssize_t>(n) * n_out * kWidth * 4) {
        PyErr_Format(PyExc_ValueError, "sparse_stem: out must be contiguous float32 (N=%zd, O=%d, 34)", n, n_out);
    } else {
        views.reserve(static_cast<size_t>(n));
        bool ok = true;
        for (Py_ssize_t i = 0; i < n && ok; ++i) {
            Py_buffer b;
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
                ok = false;
                break;
            }
            views.push_back(b);
            if (!is_c_float32(b) || b.len != static_cast<Py_ssize_t>(sample * 4)) {
                PyErr_Format(PyExc_ValueError, "sparse_stem: observation %zd must be contiguous float32 (%d, 34)", i,
                             n_in);
                ok = false;
            }
        }
        if (ok) {
            const StemFn fn = pick(n_out);
            const float* w = static_cast<const float*>(wbuf.buf);
            float* out = static_cast<float*>(obuf.buf);
            Scratch scratch(n_in, n_out);
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < n; ++i)
                fn(static_cast<const float*>(views[static_cast<size_t>(i)].buf), w,
                   out + static_cast<size_t>(i) * n_out * kWidth, scratch, n_in, n_out);
            Py_END_ALLOW_THREADS
            Py_INCREF(Py_None);
            result = Py_None;
        }
    }
    for (auto& b : views) PyBuffer_Release(&b);
    Py_XDECREF(seq);
    PyBuffer_Release(&wbuf);
    PyBuffer_Release(&obuf);
    return result;
}

// ---- the weight gradient: dW[o, c, k] = sum_{n, t} g[n, o, t - k + 1] * x[n, c, t] over the nonzero x ----

// The nonzero entries of x (N, C, 34) in channel-major order, as the gradient pass reads them: row r = c * N + n
// has bits[r] (bit t set iff x[n, c, t] != 0) and its values packed in val from start[r] on.
struct Nonzeros {
    std::vector<uint64_t> bits;
    std::vector<int64_t> start;
    std::vector<float> val;
};

template <uint64_t (*Bits)(const float*)>
void gather(const float* x, int n, int n_in, Nonzeros& nz) {
    const size_t rows = static_cast<size_t>(n) * n_in;
    nz.bits.resize(rows);
    nz.start.resize(rows);
    for (int i = 0; i < n; ++i)
        for (int c = 0; c < n_in; ++c)
            nz.bits[static_cast<size_t>(c) * n + i] = Bits(x + (static_cast<size_t>(i) * n_in + c) * kWidth);
    int64_t total = 0;
    for (size_t r = 0; r < rows; ++r) {
        nz.start[r] = total;
        total += __builtin_popcountll(nz.bits[r]);
    }
    nz.val.resize(static_cast<size_t>(total));
    for (int i = 0; i < n; ++i)  // x in order once more, the nonzero rows only
        for (int c = 0; c < n_in; ++c) {
            const size_t r = static_cast<size_t>(c) * n + i;
            uint64_t bits = nz.bits[r];
            const float* row = x + (static_cast<size_t>(i) * n_in + c) * kWidth;
            float* out = nz.val.data() + nz.start[r];
            while (bits) {
                *out++ = row[__builtin_ctzll(bits)];
                bits &= bits - 1;
            }
        }
}

inline uint64_t bits_scalar(const float* row) { return nonzero_bits_scalar(reinterpret_cast<const uint32_t*>(row)); }

// g: (N, 36, O), the output gradient transposed, positions -1 .. 34 (both ends zero); dw: (C, 3, O). For a
// nonzero x[n, c, t], taps 2, 1, 0 read positions t - 1, t, t + 1: the 3 * O floats g[n, t .. t + 2, :] in a row.
// block: 3 * O floats of scratch.
void grad_scalar(const Nonzeros& nz, const float* g, float* dw, float* block, int n, int n_in, int n_out) {
    const int width = 3 * n_out;
    for (int c = 0; c < n_in; ++c) {
        std::memset(block, 0, sizeof(float) * width);
        for (int i = 0; i < n; ++i) {
            const size_t r = static_cast<size_t>(c) * n + i;
            uint64_t bits = nz.bits[r];
            const float* v = nz.val.data() + nz.start[r];
            const float* gi = g + static_cast<size_t>(i) * (kWidth + 2) * n_out;
            while (bits) {
                const int t = __builtin_ctzll(bits);
                bits &= bits - 1;
                axpy(block, gi + t * n_out, *v++, width);
            }
        }
        for (int k = 0; k < 3; ++k)
            std::memcpy(dw + (static_cast<size_t>(c) * 3 + k) * n_out, block + (2 - k) * n_out, sizeof(float) * n_out);
    }
}

#ifdef MORTAL_STEM_AVX2
__attribute__((target("avx2,fma"))) void gather_avx2(const float* x, int n, int n_in, Nonzeros& nz) {
    gather<nonzero_bits_avx2>(x, n, n_in, nz);
}

// As grad_scalar; each channel's 3 * O sums stay in registers, 96 floats at a time, over all rows (O a multiple of
// 32, as Mortal's 192 channels and the quickstart's 32; other counts take grad_scalar).
__attribute__((target("avx2,fma"))) void grad_avx2(const Nonzeros& nz, const float* g, float* dw, float* block, int n,
                                                   int n_in, int n_out) {
    const int width = 3 * n_out;  // a multiple of 96
    const size_t g_row = static_cast<size_t>(kWidth + 2) * n_out;
    for (int c = 0; c < n_in; ++c) {
        int j = 0;
        for (; j + 96 <= width; j += 96) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
            __m256 a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
            for (int i = 0; i < n; ++i) {
                const size_t r = static_cast<size_t>(c) * n + i;
                uint64_t bits = nz.bits[r];
                const float* v = nz.val.data() + nz.start[r];
                const float* gi = g + i * g_row + j;
                while (bits) {
                    const float* gr = gi + __builtin_ctzll(bits) * n_out;
                    bits &= bits - 1;
                    const __m256 s = _mm256_set1_ps(*v++);
                    a0 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr), a0);
                    a1 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 8), a1);
                    a2 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 16), a2);
                    a3 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 24), a3);
                    a4 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 32), a4);
                    a5 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 40), a5);
                    a6 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 48), a6);
                    a7 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 56), a7);
                    a8 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 64), a8);
                    a9 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 72), a9);
                    a10 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 80), a10);
                    a11 = _mm256_fmadd_ps(s, _mm256_loadu_ps(gr + 88), a11);
                }
            }
            float* b = block + j;
            _mm256_storeu_ps(b, a0);
            _mm256_storeu_ps(b + 8, a1);
            _mm256_storeu_ps(b + 16, a2);
            _mm256_storeu_ps(b + 24, a3);
            _mm256_storeu_ps(b + 32, a4);
            _mm256_storeu_ps(b + 40, a5);
            _mm256_storeu_ps(b + 48, a6);
            _mm256_storeu_ps(b + 56, a7);
            _mm256_storeu_ps(b + 64, a8);
            _mm256_storeu_ps(b + 72, a9);
            _mm256_storeu_ps(b + 80, a10);
            _mm256_storeu_ps(b + 88, a11);
        }
        for (int k = 0; k < 3; ++k)
            std::memcpy(dw + (static_cast<size_t>(c) * 3 + k) * n_out, block + (2 - k) * n_out, sizeof(float) * n_out);
    }
}
#endif

// sparse_stem_grad(x, g, dw, C, O): see the method table.
PyObject* py_sparse_stem_grad(PyObject*, PyObject* args) {
    PyObject *x_obj, *g_obj, *d_obj;
    int n_in, n_out;
    if (!PyArg_ParseTuple(args, "OOOii:sparse_stem_grad", &x_obj, &g_obj, &d_obj, &n_in, &n_out)) return nullptr;
    Py_buffer bufs[3];
    PyObject* objs[3] = {x_obj, g_obj, d_obj};
    int got = 0;
    for (; got < 3; ++got) {
        const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (got == 2 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[got], &bufs[got], flags) != 0) break;
    }
    PyObject* result = nullptr;
    if (got == 3) {
        const Py_ssize_t sample = static_cast<Py_ssize_t>(n_in) * kWidth * 4;
        const Py_ssize_t n = n_in > 0 ? bufs[0].len / sample : 0;
        if (n_in <= 0 || n_out <= 0) {
            PyErr_Format(PyExc_ValueError, "sparse_stem_grad: bad sizes C=%d O=%d", n_in, n_out);
        } else if (!is_c_float32(bufs[0]) || bufs[0].len != n * sample) {
            PyErr_Format(PyExc_ValueError, "sparse_stem_grad: x must be contiguous float32 (N, C=%d, 34)", n_in);
        } else if (!is_c_float32(bufs[1]) || bufs[1].len != n * (kWidth + 2) * n_out * 4) {
            PyErr_Format(PyExc_ValueError, "sparse_stem_grad: g must be contiguous float32 (N=%zd, 36, O=%d)", n,
                         n_out);
        } else if (!is_c_float32(bufs[2]) || bufs[2].len != static_cast<Py_ssize_t>(n_in) * 3 * n_out * 4) {
            PyErr_Format(PyExc_ValueError, "sparse_stem_grad: dw must be contiguous float32 (C=%d, 3, O=%d)", n_in,
                         n_out);
        } else {
            const float* x = static_cast<const float*>(bufs[0].buf);
            const float* g = static_cast<const float*>(bufs[1].buf);
            float* dw = static_cast<float*>(bufs[2].buf);
            Py_BEGIN_ALLOW_THREADS
            Nonzeros nz;
            std::vector<float> block(3 * static_cast<size_t>(n_out));
            bool simd = false;
#ifdef MORTAL_STEM_AVX2
            simd = pick(n_out) == stem_avx2 && n_out % 32 == 0;
            if (simd) {
                gather_avx2(x, static_cast<int>(n), n_in, nz);
                grad_avx2(nz, g, dw, block.data(), static_cast<int>(n), n_in, n_out);
            }
#endif
            if (!simd) {
                gather<bits_scalar>(x, static_cast<int>(n), n_in, nz);
                grad_scalar(nz, g, dw, block.data(), static_cast<int>(n), n_in, n_out);
            }
            Py_END_ALLOW_THREADS
            Py_INCREF(Py_None);
            result = Py_None;
        }
    }
    for (int i = 0; i < got; ++i) PyBuffer_Release(&bufs[i]);
    return result;
}

// ---- packed observations (mortal.features.packed_obs): per sample the rows REAL_ROWS as float32 (R, 34), then one
// bit per element of all C rows (row-major, little bit order), padded to 4 bytes. The stem reads the nonzeros from
// there, in the same order and with the same values as from the unpacked rows, so its results equal sparse_stem's
// and sparse_stem_grad's on the unpacked rows bit for bit, without the 4-byte-an-element float copy. ----

struct PackedRows {
    const uint8_t* row = nullptr;  // one sample
    const int32_t* real = nullptr;  // per channel: its row in the real section, or -1 (a 0/1 row)
    size_t real_bytes = 0, bit_bytes = 0;  // the sections' sizes (the bit section padded)

    const float* floats(int c) const {
        return reinterpret_cast<const float*>(row) + static_cast<size_t>(real[c]) * kWidth;
    }
    // bit t set iff element (c, t) is nonzero
    uint64_t bits(int c) const {
        if (real[c] >= 0) return nonzero_bits_scalar(reinterpret_cast<const uint32_t*>(floats(c)));
        const size_t first = static_cast<size_t>(c) * kWidth, byte = first >> 3;
        const uint8_t* p = row + real_bytes + byte;
        uint64_t word = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (byte + 8 <= bit_bytes) {
            std::memcpy(&word, p, 8);
        } else
#endif
        {
            const size_t n = std::min<size_t>(8, bit_bytes - byte);
            for (size_t j = 0; j < n; ++j) word |= static_cast<uint64_t>(p[j]) << (8 * j);  // little-endian anywhere
        }
        return (word >> (first & 7)) & ((static_cast<uint64_t>(1) << kWidth) - 1);
    }
    float value(int c, int t) const { return real[c] >= 0 ? floats(c)[t] : 1.0f; }
};

// As stem_scalar, from one packed sample.
void stem_packed_scalar(const PackedRows& r, const float* w, float* out, Scratch& s, int n_in, int n_out) {
    float* acc = s.y.data();
    std::memset(acc, 0, sizeof(float) * kPad * n_out);
    for (int c = 0; c < n_in; ++c) {
        uint64_t bits = r.bits(c);
        const float* wc = w + static_cast<size_t>(c) * 3 * n_out;
        while (bits) {
            const int t = __builtin_ctzll(bits);
            bits &= bits - 1;
            const float v = r.value(c, t);
            for (int k = 0; k < 3; ++k) axpy(acc + (t - k + 2) * n_out, wc + k * n_out, v, n_out);
        }
    }
    for (int o = 0; o < n_out; ++o)
        for (int t = 0; t < kWidth; ++t) out[o * kWidth + t] = acc[(t + 1) * n_out + o];
}

// As gather, from N packed samples (row_bytes apart).
void gather_packed(PackedRows r, size_t row_bytes, int n, int n_in, Nonzeros& nz) {
    const uint8_t* first = r.row;
    const size_t rows = static_cast<size_t>(n) * n_in;
    nz.bits.resize(rows);
    nz.start.resize(rows);
    for (int i = 0; i < n; ++i) {
        r.row = first + static_cast<size_t>(i) * row_bytes;
        for (int c = 0; c < n_in; ++c) nz.bits[static_cast<size_t>(c) * n + i] = r.bits(c);
    }
    int64_t total = 0;
    for (size_t k = 0; k < rows; ++k) {
        nz.start[k] = total;
        total += __builtin_popcountll(nz.bits[k]);
    }
    nz.val.resize(static_cast<size_t>(total));
    for (int i = 0; i < n; ++i) {
        r.row = first + static_cast<size_t>(i) * row_bytes;
        for (int c = 0; c < n_in; ++c) {
            const size_t k = static_cast<size_t>(c) * n + i;
            uint64_t bits = nz.bits[k];
            float* out = nz.val.data() + nz.start[k];
            while (bits) {
                *out++ = r.value(c, __builtin_ctzll(bits));
                bits &= bits - 1;
            }
        }
    }
}

// The packed buffer and the channel map of sparse_stem_packed*: PackedRows of the first sample and the sample count,
// or nullopt-like false with a ValueError set.
bool packed_args(const Py_buffer& packed, const Py_buffer& real, int n_in, Py_ssize_t n, const char* fn,
                 PackedRows& r, size_t& row_bytes) {
    if (real.itemsize != 4 || real.format == nullptr || std::strcmp(real.format, "i") != 0 ||
        real.len != static_cast<Py_ssize_t>(n_in) * 4) {
        PyErr_Format(PyExc_ValueError, "%s: real_index must be contiguous int32 (C=%d,)", fn, n_in);
        return false;
    }
    const int32_t* idx = static_cast<const int32_t*>(real.buf);
    int32_t n_real = 0;
    for (int c = 0; c < n_in; ++c) {  // -1, or the real rows numbered 0, 1, ... in channel order
        if (idx[c] == n_real) {
            ++n_real;
        } else if (idx[c] != -1) {
            PyErr_Format(PyExc_ValueError, "%s: real_index[%d] is %d, expected -1 or %d", fn, c, idx[c], n_real);
            return false;
        }
    }
    r.real = idx;
    r.real_bytes = static_cast<size_t>(n_real) * kWidth * 4;
    r.bit_bytes = (static_cast<size_t>(n_in) * kWidth + 31) / 32 * 4;
    row_bytes = r.real_bytes + r.bit_bytes;
    if (packed.itemsize != 1 || (packed.format != nullptr && std::strcmp(packed.format, "B") != 0) ||
        packed.len != n * static_cast<Py_ssize_t>(row_bytes)) {
        PyErr_Format(PyExc_ValueError, "%s: packed must be contiguous uint8 (N=%zd, %zu)", fn, n, row_bytes);
        return false;
    }
    r.row = static_cast<const uint8_t*>(packed.buf);
    return true;
}

// The four buffers of sparse_stem_packed*, C-contiguous, the last writable: how many were got (4, or fewer with an
// error set; release those).
int four_buffers(PyObject** objs, Py_buffer* bufs) {
    int got = 0;
    for (; got < 4; ++got) {
        const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (got == 3 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[got], &bufs[got], flags) != 0) break;
    }
    return got;
}

// sparse_stem_packed(packed, real_index, weight, out, C, O): see the method table.
PyObject* py_sparse_stem_packed(PyObject*, PyObject* args) {
    PyObject* objs[4];
    int n_in, n_out;
    if (!PyArg_ParseTuple(args, "OOOOii:sparse_stem_packed", &objs[0], &objs[1], &objs[2], &objs[3], &n_in, &n_out))
        return nullptr;
    Py_buffer bufs[4];
    const int got = four_buffers(objs, bufs);
    PyObject* result = nullptr;
    PackedRows r;
    size_t row_bytes = 0;
    const Py_ssize_t n =
        n_in > 0 && n_out > 0 && got == 4 ? bufs[3].len / (static_cast<Py_ssize_t>(n_out) * kWidth * 4) : 0;
    if (got < 4) {
        // error set
    } else if (n_in <= 0 || n_out <= 0) {
        PyErr_Format(PyExc_ValueError, "sparse_stem_packed: bad sizes C=%d O=%d", n_in, n_out);
    } else if (!is_c_float32(bufs[2]) || bufs[2].len != static_cast<Py_ssize_t>(n_in) * 3 * n_out * 4) {
        PyErr_Format(PyExc_ValueError, "sparse_stem_packed: weight must be contiguous float32 (C=%d, 3, O=%d)", n_in,
                     n_out);
    } else if (!is_c_float32(bufs[3]) || bufs[3].len != n * n_out * kWidth * 4) {
        PyErr_Format(PyExc_ValueError, "sparse_stem_packed: out must be contiguous float32 (N, O=%d, 34)", n_out);
    } else if (packed_args(bufs[0], bufs[1], n_in, n, "sparse_stem_packed", r, row_bytes)) {
        const float* w = static_cast<const float*>(bufs[2].buf);
        float* out = static_cast<float*>(bufs[3].buf);
        Py_BEGIN_ALLOW_THREADS
        Scratch scratch(n_in, n_out);
        const uint8_t* first = r.row;
        const bool simd = pick(n_out) != stem_scalar;
        for (Py_ssize_t i = 0; i < n; ++i) {
            r.row = first + static_cast<size_t>(i) * row_bytes;
            float* o = out + static_cast<size_t>(i) * n_out * kWidth;
#ifdef MORTAL_STEM_AVX2
            if (simd) {  // stem_avx2's lists, from the packed rows
                int count[kWidth] = {0};
                for (int c = 0; c < n_in; ++c) {
                    uint64_t bits = r.bits(c);
                    const float* v = r.real[c] >= 0 ? r.floats(c) : nullptr;
                    while (bits) {
                        const int t = __builtin_ctzll(bits);
                        bits &= bits - 1;
                        const int k = t * n_in + count[t]++;
                        scratch.chan[k] = c;
                        scratch.val[k] = v ? v[t] : 1.0f;
                    }
                }
                accumulate_avx2(w, o, scratch, count, n_in, n_out);
                continue;
            }
#endif
            (void)simd;
            stem_packed_scalar(r, w, o, scratch, n_in, n_out);
        }
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
    for (int i = 0; i < got; ++i) PyBuffer_Release(&bufs[i]);
    return result;
}

// sparse_stem_packed_grad(packed, real_index, g, dw, C, O): see the method table.
PyObject* py_sparse_stem_packed_grad(PyObject*, PyObject* args) {
    PyObject* objs[4];
    int n_in, n_out;
    if (!PyArg_ParseTuple(args, "OOOOii:sparse_stem_packed_grad", &objs[0], &objs[1], &objs[2], &objs[3], &n_in,
                          &n_out))
        return nullptr;
    Py_buffer bufs[4];
    const int got = four_buffers(objs, bufs);
    PyObject* result = nullptr;
    PackedRows r;
    size_t row_bytes = 0;
    const Py_ssize_t n =
        n_in > 0 && n_out > 0 && got == 4 ? bufs[2].len / (static_cast<Py_ssize_t>(kWidth + 2) * n_out * 4) : 0;
    if (got < 4) {
        // error set
    } else if (n_in <= 0 || n_out <= 0) {
        PyErr_Format(PyExc_ValueError, "sparse_stem_packed_grad: bad sizes C=%d O=%d", n_in, n_out);
    } else if (!is_c_float32(bufs[2]) || bufs[2].len != n * (kWidth + 2) * n_out * 4) {
        PyErr_Format(PyExc_ValueError, "sparse_stem_packed_grad: g must be contiguous float32 (N, 36, O=%d)", n_out);
    } else if (!is_c_float32(bufs[3]) || bufs[3].len != static_cast<Py_ssize_t>(n_in) * 3 * n_out * 4) {
        PyErr_Format(PyExc_ValueError, "sparse_stem_packed_grad: dw must be contiguous float32 (C=%d, 3, O=%d)", n_in,
                     n_out);
    } else if (packed_args(bufs[0], bufs[1], n_in, n, "sparse_stem_packed_grad", r, row_bytes)) {
        const float* g = static_cast<const float*>(bufs[2].buf);
        float* dw = static_cast<float*>(bufs[3].buf);
        Py_BEGIN_ALLOW_THREADS
        Nonzeros nz;
        gather_packed(r, row_bytes, static_cast<int>(n), n_in, nz);
        std::vector<float> block(3 * static_cast<size_t>(n_out));
        bool simd = false;
#ifdef MORTAL_STEM_AVX2
        simd = pick(n_out) == stem_avx2 && n_out % 32 == 0;
        if (simd) grad_avx2(nz, g, dw, block.data(), static_cast<int>(n), n_in, n_out);
#endif
        if (!simd) grad_scalar(nz, g, dw, block.data(), static_cast<int>(n), n_in, n_out);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
    for (int i = 0; i < got; ++i) PyBuffer_Release(&bufs[i]);
    return result;
}

// ---- Mish: y = x n / (n + 2), n = e (e + 2), e = exp(min(x, 20)) (= x tanh(softplus(x)) without log1p or tanh);
// mish'(x) = n / (n + 2) + 4 x e (1 + e) / (n + 2)^2, 1 above 20. n / (n + 2) is never written 1 - 2 / (n + 2),
// which cancels for very negative x. NaN propagates through the factor x. ----

constexpr float kMishClamp = 20.0f;  // above it n / (n + 2) is 1.0f and the gradient's second term below 1e-15

inline float mish_scalar(float x) {
    const float e = std::exp(std::min(x, kMishClamp));
    const float n = e * (e + 2.0f);
    return x * (n / (n + 2.0f));
}

inline float mish_grad_scalar(float x) {
    if (x > kMishClamp) return 1.0f;  // the formula's 4 x e (1 + e) / (n + 2)^2 grows with x past the clamp
    const float e = std::exp(x);
    const float n = e * (e + 2.0f);
    const float inv = 1.0f / (n + 2.0f);
    return n * inv + 4.0f * x * e * (1.0f + e) * inv * inv;
}

#ifdef MORTAL_STEM_AVX2
// exp(x) for x in [-88, 20], 8 at a time: x = k ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial for e^r (Cephes'
// expf coefficients, ~1 ulp), times 2^k from the exponent bits. k = -127 (x below about -87.7) gives 2^k = 0:
// e^x is then 0, where it is below float's smallest normal anyway.
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);  // ln2 in two parts: k * hi is exact
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// e^x of the clamped x: max_ps returns its second operand for a NaN x, so e stays finite and x carries the NaN.
__attribute__((target("avx2,fma"))) inline __m256 mish_exp_avx2(__m256 x) {
    return exp_avx2(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(kMishClamp)));
}

__attribute__((target("avx2,fma"))) void mish_forward_avx2(const float* x, float* y, Py_ssize_t size) {
    const __m256 two = _mm256_set1_ps(2.0f);
    Py_ssize_t i = 0;
    for (; i + 8 <= size; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = mish_exp_avx2(v);
        const __m256 n = _mm256_mul_ps(e, _mm256_add_ps(e, two));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_div_ps(n, _mm256_add_ps(n, two))));
    }
    for (; i < size; ++i) y[i] = mish_scalar(x[i]);
}

__attribute__((target("avx2,fma"))) void mish_backward_avx2(const float* x, const float* g, float* dx,
                                                            Py_ssize_t size) {
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), four = _mm256_set1_ps(4.0f);
    const __m256 clamp = _mm256_set1_ps(kMishClamp);
    Py_ssize_t i = 0;
    for (; i + 8 <= size; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = mish_exp_avx2(v);
        const __m256 n = _mm256_mul_ps(e, _mm256_add_ps(e, two));
        const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(n, two));
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(four, e), _mm256_add_ps(one, e)),
                                       _mm256_mul_ps(inv, inv));
        __m256 d = _mm256_fmadd_ps(v, t, _mm256_mul_ps(n, inv));
        d = _mm256_blendv_ps(d, one, _mm256_cmp_ps(v, clamp, _CMP_GT_OQ));
        _mm256_storeu_ps(dx + i, _mm256_mul_ps(d, _mm256_loadu_ps(g + i)));
    }
    for (; i < size; ++i) dx[i] = g[i] * mish_grad_scalar(x[i]);
}
#endif

bool mish_simd(int want) {
#ifdef MORTAL_STEM_AVX2
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return want && avx2;
#else
    (void)want;
    return false;
#endif
}

// Gets n float32 C-contiguous buffers of one byte length (the last writable); on failure sets ValueError naming
// the function and the arguments, and releases what it took.
bool mish_buffers(PyObject** objs, Py_buffer* bufs, int n, const char* fn, const char* names) {
    int got = 0;
    for (; got < n; ++got) {
        const int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (got == n - 1 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[got], &bufs[got], flags) != 0) break;
        if (!is_c_float32(bufs[got]) || bufs[got].len != bufs[0].len) {
            PyErr_Format(PyExc_ValueError, "%s: %s must be contiguous float32 arrays of one size", fn, names);
            ++got;
            break;
        }
    }
    if (got == n && !PyErr_Occurred()) return true;
    for (int i = 0; i < got; ++i) PyBuffer_Release(&bufs[i]);
    return false;
}

PyObject* py_mish_forward(PyObject*, PyObject* args) {
    PyObject* objs[2];
    int simd = 1;
    if (!PyArg_ParseTuple(args, "OO|p:mish_forward", &objs[0], &objs[1], &simd)) return nullptr;
    Py_buffer bufs[2];
    if (!mish_buffers(objs, bufs, 2, "mish_forward", "x and y")) return nullptr;
    const float* x = static_cast<const float*>(bufs[0].buf);
    float* y = static_cast<float*>(bufs[1].buf);
    const Py_ssize_t size = bufs[0].len / 4;
    const bool vec = mish_simd(simd);
    Py_BEGIN_ALLOW_THREADS
#ifdef MORTAL_STEM_AVX2
    if (vec) mish_forward_avx2(x, y, size);
#endif
    if (!vec)
        for (Py_ssize_t i = 0; i < size; ++i) y[i] = mish_scalar(x[i]);
    Py_END_ALLOW_THREADS
    for (auto& b : bufs) PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

PyObject* py_mish_backward(PyObject*, PyObject* args) {
    PyObject* objs[3];
    int simd = 1;
    if (!PyArg_ParseTuple(args, "OOO|p:mish_backward", &objs[0], &objs[1], &objs[2], &simd)) return nullptr;
    Py_buffer bufs[3];
    if (!mish_buffers(objs, bufs, 3, "mish_backward", "x, g and dx")) return nullptr;
    const float* x = static_cast<const float*>(bufs[0].buf);
    const float* g = static_cast<const float*>(bufs[1].buf);
    float* dx = static_cast<float*>(bufs[2].buf);
    const Py_ssize_t size = bufs[0].len / 4;
    const bool vec = mish_simd(simd);
    Py_BEGIN_ALLOW_THREADS
#ifdef MORTAL_STEM_AVX2
    if (vec) mish_backward_avx2(x, g, dx, size);
#endif
    if (!vec)
        for (Py_ssize_t i = 0; i < size; ++i) dx[i] = g[i] * mish_grad_scalar(x[i]);
    Py_END_ALLOW_THREADS
    for (auto& b : bufs) PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"sparse_stem", py_sparse_stem, METH_VARARGS,
     "sparse_stem(obs, weight, out, C: int, O: int) -> None\n\n"
     "out[n] = conv1d(obs[n], W, padding=1) for a width-3 convolution without bias, from the nonzero\n"
     "inputs only. obs: a sequence of N C-contiguous float32 (C, 34) buffers; weight: float32 (C, 3, O)\n"
     "(W permuted so that each input channel's three taps are adjacent); out: writable float32\n"
     "(N, O, 34). Runs without the interpreter lock."},
    {"sparse_stem_grad", py_sparse_stem_grad, METH_VARARGS,
     "sparse_stem_grad(x, g, dw, C: int, O: int) -> None\n\n"
     "The weight gradient of that convolution from the nonzero inputs only: dw[c, k, o] = sum over n, t of\n"
     "g[n, t - k + 2, o] * x[n, c, t]. x: C-contiguous float32 (N, C, 34); g: float32 (N, 36, O), the output\n"
     "gradient transposed and zero-padded by one position each side; dw: writable float32 (C, 3, O), overwritten.\n"
     "Runs without the interpreter lock."},
    {"sparse_stem_packed", py_sparse_stem_packed, METH_VARARGS,
     "sparse_stem_packed(packed, real_index, weight, out, C: int, O: int) -> None\n\n"
     "sparse_stem of packed observations (mortal.features.packed_obs), equal to it on the unpacked rows bit for bit.\n"
     "packed: C-contiguous uint8 (N, row_bytes); real_index: int32 (C,), each channel's row in the real section\n"
     "(0, 1, ... in channel order) or -1 for a 0/1 row; weight: float32 (C, 3, O); out: writable float32 (N, O, 34)."},
    {"sparse_stem_packed_grad", py_sparse_stem_packed_grad, METH_VARARGS,
     "sparse_stem_packed_grad(packed, real_index, g, dw, C: int, O: int) -> None\n\n"
     "sparse_stem_grad of packed observations, equal to it on the unpacked rows bit for bit; packed and real_index\n"
     "as sparse_stem_packed, g and dw as sparse_stem_grad."},
    {"mish_forward", py_mish_forward, METH_VARARGS,
     "mish_forward(x, y, simd: bool = True) -> None\n\n"
     "y = x * tanh(softplus(x)) elementwise, from one exp: x, y C-contiguous float32 buffers of one size (y writable;\n"
     "it may be x). simd=False takes the scalar loop (for tests). Runs without the interpreter lock."},
    {"mish_backward", py_mish_backward, METH_VARARGS,
     "mish_backward(x, g, dx, simd: bool = True) -> None\n\n"
     "dx = g * mish'(x) elementwise (1 above x = 20): x, g, dx C-contiguous float32 buffers of one size (dx\n"
     "writable; it may be g). Runs without the interpreter lock."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_stem",
    "Sparse first convolution of the Brain on the CPU (forward, weight gradient), and Mish (forward, gradient).",
    -1, kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__stem(void) { return PyModule_Create(&kModule); }
