/* The model's incremental step in plain C: 16 ms frames in, enhanced log-magnitude frames out.
 *
 * The same computation as models/static_step.py (pre-encoder convs with their caches, standard and TIM blocks
 * with per-block key/value rings, the output stage with the attenuation floor) with no per-operation overhead:
 * every matrix product streams its weights once per call for up to MAX_BATCH frames (float32 on AVX-512 or
 * AVX2: tiles of outputs held in registers over weights repacked tile by tile; the reduced modes, and float32
 * without AVX2: four rows at a time, "axpy" form, y += x[i] * W[i, :], which vectorises without reassociating
 * sums; x86 builds take AVX-512, AVX2 + FMA + F16C or plain C by what -march=native finds), while the
 * attention goes frame by frame through the rings; everything else is a few thousand flops per frame. A frame's
 * arithmetic is the same whether it comes alone or with others, so the output does not depend on the chunking
 * (bit for bit; tests/test_native.py). enhance/native_backend.py compiles this file, lays out the weights and the
 * state in the order read below, and checks the result against PyTorch (tests/test_native.py).
 *
 * Weights (float32, one array, in this order; the float16 and int8 modes convert the matrices once at start; W is [n_in][n_out], i.e. PyTorch's Linear weight transposed):
 *   conv i (i < n_conv):  W [k][C_in][C_out] (frame-major windows), bias, LayerNorm gain, LayerNorm bias
 *   block j:              per-group joint map [G][dm][s + 3 dm] (s = 1 with competition: the score first, then
 *                         Q, K, V) + bias [G][s + 3 dm]; O [G][dm][dm] + bias; norm1 gain, bias [d];
 *                         TIM only: inter-mechanism Q/K/V [G][dm][3 iw] + bias, O [G][iw][dm] + bias, norm gain,
 *                         bias [d]; FFN in [G][dm][ff] + bias, FFN out [G][ff][dm] + bias, norm gain, bias [d]
 *                         (a standard block is G = 1 without competition or inter-mechanism attention)
 *   head:                 W [d][F] + bias [F]
 * State of one channel (floats): per conv its last k - 1 = 2 input frames [2][C_in]; per block the key and value
 * rings, keys [H][Dh][context] (transposed) and values [H][context][Dh], float32 (float16 in the float16 and int8
 * modes). Counters (int64): [0] frame 0 received, [1] frames output so far.
 *
 * tim_frames (end of file) wraps the step in the engine's signal path (enhance/stft.py's framing): analysis with
 * the window and an FFT, the step, synthesis with the noisy phase and overlap-add, so that a streaming hop is one
 * call with no per-array overhead in Python.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define MAX_CONV 8
#define MAX_LAYERS 64
#define CFG_LAYER 8 /* ints per block in the config */
#define MAX_BATCH 16  /* frames per pass of the step: each matrix is read once for up to this many frames */
#define QUAD_OUT 2048 /* reduced modes: the widest output whose four rows are converted once for all frames */

typedef _Float16 half_t;

typedef struct {
    const float *w, *b;
    const float *p;   /* float32 mode on AVX-512 / AVX2: the weights repacked in output tiles (gemv), or NULL */
    const half_t *h;  /* the weights in float16 (float16 mode), or NULL */
    const int8_t *q;  /* the weights in int8 (int8 mode), or NULL; W[i][o] = q[i][o] * scale[o] per group */
    const float *scale; /* [groups][n_out] */
    int groups, n_in, n_out;
} GroupLinear;

typedef struct {
    const float *gain, *bias;
} Norm;

typedef struct {
    int tim, groups, heads, d_ff, competition, inter_heads, inter_dim;
    float slope;
    GroupLinear qkv, o, inter_qkv, inter_o, ffn_in, ffn_out;
    Norm norm1, norm_inter, norm_ffn;
    int64_t k_off, v_off; /* offsets of the rings in the state (in floats; the rings may hold float16) */
} Block;

typedef struct {
    int n_bins, n_conv, kernel, ch_in[MAX_CONV], ch_out[MAX_CONV];
    int d, n_layers, context, residual, n_maps, map_groups;
    float conv_slope, eps;
    GroupLinear conv[MAX_CONV];
    Norm conv_norm[MAX_CONV];
    int64_t conv_off[MAX_CONV];
    Block blocks[MAX_LAYERS];
    GroupLinear head;
    int64_t state_floats, work_floats, step_work, weight_floats, weight_bytes;
    int n_fft, hop;          /* the signal path (tim_frames): n_fft = 2 (n_bins - 1) = window = 2 hops */
    const float *window;     /* analysis = synthesis window [n_fft] (the config floats) */
    double *tw_re, *tw_im;   /* FFT twiddles exp(-2 pi i k / n_fft), k < n_fft / 2 */
    int *rev;                /* bit reversal of 0 .. n_fft - 1 */
    int precision;  /* the weight matrices: 0 float32, 1 float16, 2 int8 (biases and norms stay float32) */
    void *reduced;  /* float16 or int8 mode: the matrices (and int8's scales), converted once; float32 mode on
                     * AVX-512 / AVX2: the matrices repacked for gemv */
    int half_rings; /* float16 and int8 modes: the key/value rings in float16 */
} Model;

/* The vector width the kernels below are written in: VW floats per register (AVX-512, or AVX2 with FMA; the
 * float16 loads also need F16C there; plain C otherwise, where the compiler vectorises what it can) */
#if defined(__AVX512F__)
#define VW 16
#define VEC __m512
#define SET1 _mm512_set1_ps
#define LOADU _mm512_loadu_ps
#define STOREU _mm512_storeu_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define ZERO _mm512_setzero_ps
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
#define VEC __m256
#define SET1 _mm256_set1_ps
#define LOADU _mm256_loadu_ps
#define STOREU _mm256_storeu_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define ZERO _mm256_setzero_ps
#if defined(__F16C__)
#define LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))) /* VW float16 values as floats */
#endif
#endif
#if defined(VW)
#define PACKED_F32 /* gemv's float32 weights are repacked in tiles (pack_weights) */
#endif

#if defined(__AVX512F__)
/* The float32 product on AVX-512: register-blocked, so that frames batched in one call do not load and store
 * their outputs once per four weight rows. A tile of up to OTILE outputs (nv registers of VW floats, the last
 * masked) for one or two frames stays in registers while ITILE weight rows (32 KiB, in L1 while every frame pair
 * uses them) stream through. The weights are repacked once (pack_weights) so that a tile's rows lie one after
 * the other ([tile][n_in][ow]): the reads are sequential, which the hardware prefetches (row-major W made them
 * 512-byte pieces n_out floats apart, and the step waited on them). Each output is b + x[0] w[0] + x[1] w[1]
 * + ... as one fused multiply-add chain in row order, whatever the tiling, the pairing of frames or nf: a
 * frame's result does not depend on the chunking. */
#define OTILE 128
#define ITILE 64
typedef __mmask16 lanes_t;
#define ALL_LANES ((__mmask16)0xFFFF)
#define TAIL_LANES(ow) ((__mmask16)((ow) % 16 ? (1u << ((ow) % 16)) - 1u : 0xFFFFu))
#define LOAD_M(p, m) _mm512_maskz_loadu_ps(m, p)
#define STORE_M(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#elif defined(PACKED_F32)
/* The same product on AVX2 (16 registers of 8 floats): tiles of up to 32 outputs (4 registers per frame, 8 for
 * a pair), 128 rows of the repacked weights (16 KiB) per pass. */
#define OTILE 32
#define ITILE 128
typedef __m256i lanes_t;
#define ALL_LANES _mm256_set1_epi32(-1)
#define TAIL_LANES(ow)                                                                                          \
    _mm256_cmpgt_epi32(_mm256_set1_epi32((ow) % 8 ? (ow) % 8 : 8), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define LOAD_M(p, m) _mm256_maskload_ps(p, m)
#define STORE_M(p, m, v) _mm256_maskstore_ps(p, m, v)
#endif

#if defined(PACKED_F32)
static inline __attribute__((always_inline)) void tile_f32(float *y0, float *y1, const float *x0, const float *x1,
                                                           const float *restrict w, int ow, int i0, int i1,
                                                           const int nv, lanes_t last, const int two) {
    VEC a[OTILE / VW], c[OTILE / VW];
    for (int r = 0; r < nv; r++) {
        a[r] = LOAD_M(y0 + VW * r, r == nv - 1 ? last : ALL_LANES);
        if (two) c[r] = LOAD_M(y1 + VW * r, r == nv - 1 ? last : ALL_LANES);
    }
    for (int i = i0; i < i1; i++) {
        const float *restrict wr = w + (size_t)i * ow;
        const VEC xa = SET1(x0[i]);
        const VEC xb = two ? SET1(x1[i]) : xa;
        for (int r = 0; r < nv; r++) {
            /* unmasked but for the last register: with AVX2's masked loads on every register the step was 1.12x
             * slower on an AMD EPYC; masking only the last, even in full tiles, measured the same as never */
            const VEC wv = r == nv - 1 ? LOAD_M(wr + VW * r, last) : LOADU(wr + VW * r);
            a[r] = FMA(xa, wv, a[r]);
            if (two) c[r] = FMA(xb, wv, c[r]);
        }
    }
    for (int r = 0; r < nv; r++) {
        STORE_M(y0 + VW * r, r == nv - 1 ? last : ALL_LANES, a[r]);
        if (two) STORE_M(y1 + VW * r, r == nv - 1 ? last : ALL_LANES, c[r]);
    }
}

static void gemv(float *restrict Y, const float *X, const float *restrict w, const float *restrict b, int n_in,
                 int n_out, int nf, int ldx, int ldy) {
    for (int f = 0; f < nf; f++) memcpy(Y + (size_t)f * ldy, b, sizeof(float) * (size_t)n_out);
    for (int o0 = 0; o0 < n_out; o0 += OTILE) { /* w: packed, this tile's rows from w + n_in o0 */
        const int ow = n_out - o0 < OTILE ? n_out - o0 : OTILE, nv = (ow + VW - 1) / VW;
        const lanes_t last = TAIL_LANES(ow);
        for (int i0 = 0; i0 < n_in; i0 += ITILE) {
            const int i1 = n_in - i0 < ITILE ? n_in : i0 + ITILE;
            for (int f = 0; f < nf; f += 2) {
                float *y0 = Y + (size_t)f * ldy + o0, *y1 = y0 + ldy;
                const float *x0 = X + (size_t)f * ldx, *x1 = x0 + ldx;
                const float *wt = w + (size_t)n_in * o0;
#define TILE_CASE(NV)                                                                                           \
    case NV:                                                                                                    \
        if (nf - f >= 2)                                                                                        \
            tile_f32(y0, y1, x0, x1, wt, ow, i0, i1, NV, last, 1);                                              \
        else                                                                                                    \
            tile_f32(y0, y0, x0, x0, wt, ow, i0, i1, NV, last, 0);                                              \
        break;
                switch (nv) {
                    TILE_CASE(1)
                    TILE_CASE(2)
                    TILE_CASE(3)
                    TILE_CASE(4)
#if OTILE / VW > 4
                    TILE_CASE(5)
                    TILE_CASE(6)
                    TILE_CASE(7)
                    TILE_CASE(8)
#endif
                }
#undef TILE_CASE
            }
        }
    }
}
#else
/* Y[f] = b + X[f] W for nf frames, W [n_in][n_out] row-major; X's rows are ldx floats apart (they may overlap:
 * the pre-encoder's windows), Y's ldy. Four rows of W per pass so y is loaded and stored a quarter as often, and
 * each pass serves every frame while its rows are in cache: the weights are read once per call, not per frame.
 * One frame's arithmetic is the same whatever nf is (the same expression, element by element). */
static void gemv(float *restrict Y, const float *X, const float *restrict w, const float *restrict b, int n_in,
                 int n_out, int nf, int ldx, int ldy) {
    for (int f = 0; f < nf; f++) memcpy(Y + (size_t)f * ldy, b, sizeof(float) * (size_t)n_out);
    int i = 0;
    for (; i + 4 <= n_in; i += 4) {
        const float *restrict w0 = w + (size_t)i * n_out;
        const float *restrict w1 = w0 + n_out;
        const float *restrict w2 = w1 + n_out;
        const float *restrict w3 = w2 + n_out;
        for (int f = 0; f < nf; f++) {
            const float *x = X + (size_t)f * ldx;
            float *restrict y = Y + (size_t)f * ldy;
            const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
            for (int o = 0; o < n_out; o++) y[o] += a0 * w0[o] + a1 * w1[o] + a2 * w2[o] + a3 * w3[o];
        }
    }
    for (; i < n_in; i++) {
        const float *restrict w0 = w + (size_t)i * n_out;
        for (int f = 0; f < nf; f++) {
            const float a = X[(size_t)f * ldx + i];
            float *restrict y = Y + (size_t)f * ldy;
            for (int o = 0; o < n_out; o++) y[o] += a * w0[o];
        }
    }
}
#endif

#if defined(LOAD_F16)
/* The pass of gemv16 and gemv8 for one frame (AVX-512, or AVX2 with F16C): y[o] += sum of x[i..i+4) w0..w3[o],
 * the rows' elements of type T loaded VW at a time as floats by LOAD(pointer). */
#define QUAD(T, LOAD, x, y, w0, w1, w2, w3)                                                                     \
    do {                                                                                                        \
        const VEC a0 = SET1((x)[i]), a1 = SET1((x)[i + 1]), a2 = SET1((x)[i + 2]), a3 = SET1((x)[i + 3]);       \
        int o = 0;                                                                                              \
        for (; o + VW <= n_out; o += VW) {                                                                      \
            VEC acc = LOADU((y) + o);                                                                           \
            acc = FMA(a0, LOAD((w0) + o), acc);                                                                 \
            acc = FMA(a1, LOAD((w1) + o), acc);                                                                 \
            acc = FMA(a2, LOAD((w2) + o), acc);                                                                 \
            acc = FMA(a3, LOAD((w3) + o), acc);                                                                 \
            STOREU((y) + o, acc);                                                                               \
        }                                                                                                       \
        for (; o < n_out; o++)                                                                                  \
            (y)[o] += (x)[i] * (float)(w0)[o] + (x)[i + 1] * (float)(w1)[o] + (x)[i + 2] * (float)(w2)[o] +     \
                      (x)[i + 3] * (float)(w3)[o];                                                              \
    } while (0)
#endif

#if defined(__AVX512F__)
/* every four rows of W (elements of type T) for nf frames: one frame reads them as it goes; more frames convert
 * the four rows to floats once (exactly: float16 and int8 values are floats) and run the same pass on them, so
 * a frame's result does not depend on nf; leaves i at the first row not done */
#define ROWS4_AVX512(T, LOAD, CONVERT)                                                                          \
    for (; i + 4 <= n_in; i += 4) {                                                                             \
        const T *w0 = w + (size_t)i * n_out, *w1 = w0 + n_out, *w2 = w1 + n_out, *w3 = w2 + n_out;              \
        if (nf == 1 || n_out > QUAD_OUT) {                                                                      \
            for (int f = 0; f < nf; f++)                                                                        \
                QUAD(T, LOAD, X + (size_t)f * ldx, Y + (size_t)f * ldy, w0, w1, w2, w3);                        \
            continue;                                                                                           \
        }                                                                                                       \
        float *c0 = quad, *c1 = c0 + n_out, *c2 = c1 + n_out, *c3 = c2 + n_out;                                 \
        CONVERT(c0, w0);                                                                                        \
        CONVERT(c1, w1);                                                                                        \
        CONVERT(c2, w2);                                                                                        \
        CONVERT(c3, w3);                                                                                        \
        for (int f = 0; f < nf; f++)                                                                            \
            QUAD(float, LOADU, X + (size_t)f * ldx, Y + (size_t)f * ldy, c0, c1, c2, c3);                       \
    }
#define LOAD_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define CONVERT_ROW(LOAD, dst, src)                                                                             \
    do {                                                                                                        \
        int o_ = 0;                                                                                             \
        for (; o_ + 16 <= n_out; o_ += 16) _mm512_storeu_ps((dst) + o_, LOAD((src) + o_));                      \
        for (; o_ < n_out; o_++) (dst)[o_] = (float)(src)[o_];                                                  \
    } while (0)
#define CONVERT_F16(dst, src) CONVERT_ROW(LOAD_F16, dst, src)
#define CONVERT_I8(dst, src) CONVERT_ROW(LOAD_I8, dst, src)
#elif defined(LOAD_F16)
/* The passes on AVX2 (8 floats per register): without them the reduced modes went one weight row at a time
 * through a loop the compiler vectorised with a load and a store of y per row, and were slower than float32 on
 * an AVX2-only CPU (session 19). Two frames in one pass: each converted weight vector serves both, the same
 * chain per frame as QUAD, so a frame's result does not depend on nf. */
#define QUAD2(T, LOAD, x, xb, y, yb, w0, w1, w2, w3)                                                            \
    do {                                                                                                        \
        const VEC a0 = SET1((x)[i]), a1 = SET1((x)[i + 1]), a2 = SET1((x)[i + 2]), a3 = SET1((x)[i + 3]);       \
        const VEC b0 = SET1((xb)[i]), b1 = SET1((xb)[i + 1]), b2 = SET1((xb)[i + 2]), b3 = SET1((xb)[i + 3]);   \
        int o = 0;                                                                                              \
        for (; o + VW <= n_out; o += VW) {                                                                      \
            const VEC v0 = LOAD((w0) + o), v1 = LOAD((w1) + o), v2 = LOAD((w2) + o), v3 = LOAD((w3) + o);       \
            VEC acc = LOADU((y) + o), bcc = LOADU((yb) + o);                                                    \
            acc = FMA(a0, v0, acc);                                                                             \
            bcc = FMA(b0, v0, bcc);                                                                             \
            acc = FMA(a1, v1, acc);                                                                             \
            bcc = FMA(b1, v1, bcc);                                                                             \
            acc = FMA(a2, v2, acc);                                                                             \
            bcc = FMA(b2, v2, bcc);                                                                             \
            acc = FMA(a3, v3, acc);                                                                             \
            bcc = FMA(b3, v3, bcc);                                                                             \
            STOREU((y) + o, acc);                                                                               \
            STOREU((yb) + o, bcc);                                                                              \
        }                                                                                                       \
        for (; o < n_out; o++) {                                                                                \
            (y)[o] += (x)[i] * (float)(w0)[o] + (x)[i + 1] * (float)(w1)[o] + (x)[i + 2] * (float)(w2)[o] +     \
                      (x)[i + 3] * (float)(w3)[o];                                                              \
            (yb)[o] += (xb)[i] * (float)(w0)[o] + (xb)[i + 1] * (float)(w1)[o] + (xb)[i + 2] * (float)(w2)[o] + \
                       (xb)[i + 3] * (float)(w3)[o];                                                            \
        }                                                                                                       \
    } while (0)
/* every four rows of W for nf frames, two frames per pass; leaves i at the first row not done */
#define ROWS4_AVX2(T, LOAD)                                                                                     \
    for (; i + 4 <= n_in; i += 4) {                                                                             \
        const T *w0 = w + (size_t)i * n_out, *w1 = w0 + n_out, *w2 = w1 + n_out, *w3 = w2 + n_out;              \
        int f = 0;                                                                                              \
        for (; f + 2 <= nf; f += 2) {                                                                           \
            const float *x_ = X + (size_t)f * ldx;                                                              \
            float *y_ = Y + (size_t)f * ldy;                                                                    \
            QUAD2(T, LOAD, x_, x_ + ldx, y_, y_ + ldy, w0, w1, w2, w3);                                         \
        }                                                                                                       \
        if (f < nf) QUAD(T, LOAD, X + (size_t)f * ldx, Y + (size_t)f * ldy, w0, w1, w2, w3);                    \
    }
#define LOAD_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define REDUCED_AVX2
#endif

/* gemv with float16 weights: half the bytes to read, converted to float32 as they are loaded (F16C / AVX-512
 * conversions where the compiler targets them; compilers do not vectorise the conversion loop by themselves) */
static void gemv16(float *restrict Y, const float *X, const half_t *restrict w, const float *restrict b, int n_in,
                   int n_out, int nf, int ldx, int ldy, float *restrict quad) {
    for (int f = 0; f < nf; f++) memcpy(Y + (size_t)f * ldy, b, sizeof(float) * (size_t)n_out);
    int i = 0;
#if defined(__AVX512F__)
    ROWS4_AVX512(half_t, LOAD_F16, CONVERT_F16)
#elif defined(REDUCED_AVX2)
    (void)quad;
    ROWS4_AVX2(half_t, LOAD_F16)
#else
    (void)quad;
#endif
    for (; i < n_in; i++) {
        const half_t *restrict w0 = w + (size_t)i * n_out;
        for (int f = 0; f < nf; f++) {
            const float a = X[(size_t)f * ldx + i];
            float *restrict y = Y + (size_t)f * ldy;
            int o = 0;
#if defined(__F16C__) && defined(__FMA__)
            const __m256 va = _mm256_set1_ps(a);
            for (; o + 8 <= n_out; o += 8) {
                const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w0 + o)));
                _mm256_storeu_ps(y + o, _mm256_fmadd_ps(va, wv, _mm256_loadu_ps(y + o)));
            }
#endif
            for (; o < n_out; o++) y[o] += a * (float)w0[o];
        }
    }
}

/* gemv with int8 weights and one float scale per output: y = b + scale * (x q), a quarter of float32's bytes */
static void gemv8(float *restrict Y, const float *X, const int8_t *restrict w, const float *restrict scale,
                  const float *restrict b, int n_in, int n_out, int nf, int ldx, int ldy, float *restrict quad) {
    for (int f = 0; f < nf; f++) memset(Y + (size_t)f * ldy, 0, sizeof(float) * (size_t)n_out);
    int i = 0;
#if defined(__AVX512F__)
    ROWS4_AVX512(int8_t, LOAD_I8, CONVERT_I8)
#elif defined(REDUCED_AVX2)
    (void)quad;
    ROWS4_AVX2(int8_t, LOAD_I8)
#else
    (void)quad;
#endif
    for (; i < n_in; i++) {
        const int8_t *restrict w0 = w + (size_t)i * n_out;
        for (int f = 0; f < nf; f++) {
            const float a = X[(size_t)f * ldx + i];
            float *restrict y = Y + (size_t)f * ldy;
            for (int o = 0; o < n_out; o++) y[o] += a * (float)w0[o];
        }
    }
    for (int f = 0; f < nf; f++) {
        float *restrict y = Y + (size_t)f * ldy;
        for (int o = 0; o < n_out; o++) y[o] = b[o] + scale[o] * y[o];
    }
}

/* each group's slice of nf frames, X [nf] rows ldx apart -> Y [nf] rows ldy apart (a frame's groups side by
 * side: x[g] is n_in wide, y[g] n_out) */
static void group_linear(const GroupLinear *m, const float *X, float *Y, int nf, int ldx, int ldy) {
    float quad[4 * QUAD_OUT]; /* the reduced modes' four converted rows */
    for (int g = 0; g < m->groups; g++) {
        const float *x = X + (size_t)g * m->n_in;
        float *y = Y + (size_t)g * m->n_out;
        const size_t wo = (size_t)g * m->n_in * m->n_out, bo = (size_t)g * m->n_out;
        if (m->q)
            gemv8(y, x, m->q + wo, m->scale + bo, m->b + bo, m->n_in, m->n_out, nf, ldx, ldy, quad);
        else if (m->h)
            gemv16(y, x, m->h + wo, m->b + bo, m->n_in, m->n_out, nf, ldx, ldy, quad);
        else
            gemv(y, x, (m->p ? m->p : m->w) + wo, m->b + bo, m->n_in, m->n_out, nf, ldx, ldy);
    }
}

/* LayerNorm of each of `groups` slices of n (statistics in double), gain and bias of the whole width */
static void layer_norm(float *x, int groups, int n, const Norm *nm, float eps) {
    for (int g = 0; g < groups; g++) {
        float *v = x + (size_t)g * n;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < n; i++) mean += v[i];
        mean /= n;
        for (int i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
        const float inv = (float)(1.0 / sqrt(var / n + eps)), m = (float)mean;
        const float *gain = nm->gain + (size_t)g * n, *bias = nm->bias + (size_t)g * n;
        for (int i = 0; i < n; i++) v[i] = (v[i] - m) * inv * gain[i] + bias[i];
    }
}

static void leaky(float *x, int n, float slope) {
    for (int i = 0; i < n; i++) x[i] = x[i] >= 0.0f ? x[i] : x[i] * slope;
}

/* exp(x) for x <= 0 (softmax after subtracting the maximum), within 2 ulp of expf; written so that compilers
 * vectorise a loop of it (libm's expf is a call per element: a third of a frame's time in the attention). GCC
 * vectorises the floorf only with -fno-trapping-math (native_backend.FLAGS); without it the loop stays scalar. */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f; /* x - n ln 2 in two parts (Cephes) */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* softmax of x[0..n) in place; the maximum and the sum are taken over 16 lanes (vectorised, not one long chain) */
static void softmax(float *x, int n) {
    float lane[16];
    for (int j = 0; j < 16; j++) lane[j] = x[0];
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    float mx = x[0];
    for (int j = 0; j < 16; j++) mx = lane[j] > mx ? lane[j] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (i = 0; i < n; i++) x[i] = exp_neg(x[i] - mx);
    for (int j = 0; j < 16; j++) lane[j] = 0.0f;
    for (i = 0; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] += x[i + j];
    float sum = 0.0f;
    for (int j = 0; j < 16; j++) sum += lane[j];
    for (; i < n; i++) sum += x[i];
    const float inv = 1.0f / sum;
    for (i = 0; i < n; i++) x[i] *= inv;
}

/* Attention over float16 rings (float16 and int8 modes: half the bytes of float32 rings per frame), float32 maths.
 * score[t] = q . K[:, t] for the n past frames of a transposed key ring K [Dh][C]: VW frames per register (AVX-512,
 * AVX2 with F16C). */
static void scores16(float *restrict score, const float *restrict q, const half_t *restrict K, int Dh, int C,
                     int n) {
    int t = 0;
#if defined(LOAD_F16)
    for (; t + VW <= n; t += VW) {
        VEC acc0 = ZERO(), acc1 = ZERO();
        int i = 0;
        for (; i + 2 <= Dh; i += 2) { /* two chains of dependent adds */
            acc0 = FMA(SET1(q[i]), LOAD_F16(K + (size_t)i * C + t), acc0);
            acc1 = FMA(SET1(q[i + 1]), LOAD_F16(K + (size_t)(i + 1) * C + t), acc1);
        }
        for (; i < Dh; i++) acc0 = FMA(SET1(q[i]), LOAD_F16(K + (size_t)i * C + t), acc0);
        STOREU(score + t, ADD(acc0, acc1));
    }
#endif
    /* the frames left (all of them in plain C): each score a chain over i in order; the loop over
     * frames inside, so that compilers vectorise it (NEON, SSE) */
    for (int u = t; u < n; u++) score[u] = 0.0f;
    for (int i = 0; i < Dh && t < n; i++) {
        const float a = q[i];
        const half_t *restrict k = K + (size_t)i * C;
        for (int u = t; u < n; u++) score[u] += a * (float)k[u];
    }
}

/* y[Dh] += sum over the n past frames of p[t] V[t] for a value ring V [C][Dh] in float16 */
static void mix16(float *restrict y, const float *restrict p, const half_t *restrict V, int Dh, int n) {
    int i = 0;
#if defined(LOAD_F16)
    for (; i + VW <= Dh; i += VW) {
        VEC a0 = LOADU(y + i), a1 = ZERO(), a2 = ZERO(), a3 = ZERO();
        int t = 0;
        for (; t + 4 <= n; t += 4) { /* four frames per pass, four chains */
            const half_t *v = V + (size_t)t * Dh + i;
            a0 = FMA(SET1(p[t]), LOAD_F16(v), a0);
            a1 = FMA(SET1(p[t + 1]), LOAD_F16(v + Dh), a1);
            a2 = FMA(SET1(p[t + 2]), LOAD_F16(v + 2 * Dh), a2);
            a3 = FMA(SET1(p[t + 3]), LOAD_F16(v + 3 * Dh), a3);
        }
        for (; t < n; t++) a0 = FMA(SET1(p[t]), LOAD_F16(V + (size_t)t * Dh + i), a0);
        STOREU(y + i, ADD(ADD(a0, a1), ADD(a2, a3)));
    }
#endif
    /* the values left (all of them in plain C): each a chain over frames in order; the loop over values inside */
    for (int t = 0; t < n && i < Dh; t++) {
        const float pt = p[t];
        const half_t *restrict v = V + (size_t)t * Dh;
        for (int j = i; j < Dh; j++) y[j] += pt * (float)v[j];
    }
}

/* the next n floats of the weights (base NULL: sizing only, no pointers made) */
static const float *take(const float **base, int64_t n, int64_t *total) {
    const float *p = *base ? *base + *total : NULL;
    *total += n;
    return p;
}

static GroupLinear take_linear(const float **cur, int64_t *total, int groups, int n_in, int n_out) {
    GroupLinear m = {0};
    m.groups = groups;
    m.n_in = n_in;
    m.n_out = n_out;
    m.w = take(cur, (int64_t)groups * n_in * n_out, total);
    m.b = take(cur, (int64_t)groups * n_out, total);
    return m;
}

static Norm take_norm(const float **cur, int64_t *total, int n) {
    Norm nm;
    nm.gain = take(cur, n, total);
    nm.bias = take(cur, n, total);
    return nm;
}

void tim_model_free(void *mp);

/* memory for the converted or repacked matrices, in 2 MiB pages where Linux grants them: every frame reads all
 * of it (22 MiB in float32), and in 4 KiB pages the reads wait on the TLB (the tiled float32 step took about
 * 1.4x the time at 1-s chunks and 1.06x at 16-ms chunks without them, two A/B runs against the same base; a hint
 * only, ordinary pages otherwise) */
static void *alloc_matrices(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    bytes = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, bytes);
#if defined(MADV_HUGEPAGE)
    if (p) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

#define MAX_MATRICES (MAX_CONV + 6 * MAX_LAYERS + 1)
/* every weight matrix of the model into all; returns their number */
static int matrices(Model *m, GroupLinear **all) {
    int n_all = 0;
    for (int i = 0; i < m->n_conv; i++) all[n_all++] = &m->conv[i];
    for (int j = 0; j < m->n_layers; j++) {
        Block *b = &m->blocks[j];
        GroupLinear *own[6] = {&b->qkv, &b->o, &b->inter_qkv, &b->inter_o, &b->ffn_in, &b->ffn_out};
        for (int k = 0; k < 6; k++)
            if (own[k]->w) all[n_all++] = own[k];
    }
    all[n_all++] = &m->head;
    return n_all;
}

#if defined(PACKED_F32)
/* float32 mode on AVX-512 or AVX2: every matrix copied once into m->reduced in gemv's tile order, per group
 * [tile][n_in][ow] (ow = OTILE, or what is left for the last tile). The same values: the result is the float32
 * step's. */
static int pack_weights(Model *m) {
    GroupLinear *all[MAX_MATRICES];
    const int n_all = matrices(m, all);
    int64_t size = 0;
    for (int k = 0; k < n_all; k++) size += (int64_t)all[k]->groups * all[k]->n_in * all[k]->n_out;
    float *dst = alloc_matrices(sizeof(float) * (size_t)size);
    if (!dst) return 0;
    m->reduced = dst;
    for (int k = 0; k < n_all; k++) {
        GroupLinear *l = all[k];
        l->p = dst;
        for (int g = 0; g < l->groups; g++) {
            const float *w = l->w + (size_t)g * l->n_in * l->n_out;
            for (int o0 = 0; o0 < l->n_out; o0 += OTILE) {
                const int ow = l->n_out - o0 < OTILE ? l->n_out - o0 : OTILE;
                for (int i = 0; i < l->n_in; i++, dst += ow)
                    memcpy(dst, w + (size_t)i * l->n_out + o0, sizeof(float) * (size_t)ow);
            }
        }
    }
    return 1;
}
#endif

/* float16 or int8 mode: every matrix converted once into m->reduced (int8: symmetric, one scale per output column
 * of each group, the largest |W| of the column mapped to 127). Returns 0 when out of memory. */
static int reduce_weights(Model *m) {
    GroupLinear *all[MAX_MATRICES];
    const int n_all = matrices(m, all);
    int64_t size = 0, scales = 0;
    for (int k = 0; k < n_all; k++) {
        size += (int64_t)all[k]->groups * all[k]->n_in * all[k]->n_out;
        scales += (int64_t)all[k]->groups * all[k]->n_out;
    }
    const int64_t per = m->precision == 1 ? 2 : 1; /* bytes per matrix element */
    m->weight_bytes = 4 * (m->weight_floats - size) + per * size + (m->precision == 2 ? 4 * scales : 0);
    if (m->precision == 1) {
        half_t *dst = alloc_matrices(sizeof(half_t) * (size_t)size);
        if (!dst) return 0;
        m->reduced = dst;
        for (int k = 0; k < n_all; k++) {
            const int64_t n = (int64_t)all[k]->groups * all[k]->n_in * all[k]->n_out;
            for (int64_t e = 0; e < n; e++) dst[e] = (half_t)all[k]->w[e];
            all[k]->h = dst;
            dst += n;
        }
        return 1;
    }
    float *scale = alloc_matrices(sizeof(float) * (size_t)scales + (size_t)size); /* scales, then int8 values */
    if (!scale) return 0;
    m->reduced = scale;
    int8_t *dst = (int8_t *)(scale + scales);
    for (int k = 0; k < n_all; k++) {
        GroupLinear *l = all[k];
        l->q = dst;
        l->scale = scale;
        for (int g = 0; g < l->groups; g++) {
            const float *w = l->w + (size_t)g * l->n_in * l->n_out;
            int8_t *q = dst + (size_t)g * l->n_in * l->n_out;
            float *sc = scale + (size_t)g * l->n_out;
            for (int o = 0; o < l->n_out; o++) {
                float mx = 0.0f;
                for (int i = 0; i < l->n_in; i++) {
                    const float a = fabsf(w[(size_t)i * l->n_out + o]);
                    mx = a > mx ? a : mx;
                }
                sc[o] = mx / 127.0f;
                if (!(sc[o] >= 1e-30f)) sc[o] = 1.0f; /* an all-zero (or tiny) column: its q are 0 (1 / sc finite) */
                const float inv = 1.0f / sc[o];
                for (int i = 0; i < l->n_in; i++) {
                    const float v = nearbyintf(w[(size_t)i * l->n_out + o] * inv);
                    q[(size_t)i * l->n_out + o] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
                }
            }
        }
        dst += (int64_t)l->groups * l->n_in * l->n_out;
        scale += (int64_t)l->groups * l->n_out;
    }
    return 1;
}

/* Config ints: n_bins, n_conv, kernel, C_out[n_conv], d, n_layers, context, residual, then per block
 * CFG_LAYER ints: tim, groups, heads, d_ff (summed over groups), competition, inter_heads, inter_dim, 0.
 * Floats: conv slope, LayerNorm eps, one LeakyReLU slope per block, then the STFT window [2 (n_bins - 1)] (the
 * floats are read, not copied: they must outlive the model). weights: NULL to size only (the
 * sizes are then read with tim_sizes). precision: 0 float32; 1 the matrices in float16, 2 in int8 (a converted copy,
 * close to but not the float32 result), in both the key/value rings in float16. All
 * competition blocks have the same number of groups. Returns NULL on a config this file does not cover. */
void *tim_model_new(const int32_t *ci, const float *cf, const float *weights, int precision) {
    Model *m = calloc(1, sizeof(Model));
    if (!m) return NULL;
    int p = 0;
    m->n_bins = ci[p++];
    m->n_conv = ci[p++];
    m->kernel = ci[p++];
    if (m->n_conv < 1 || m->n_conv > MAX_CONV || m->kernel != 3) goto fail;
    const float *cur = weights;
    int64_t total = 0, state = 0;
    if (precision < 0 || precision > 2) goto fail;
    m->precision = precision;
    m->half_rings = precision != 0;
    m->conv_slope = cf[0];
    m->eps = cf[1];
    for (int i = 0; i < m->n_conv; i++) {
        m->ch_in[i] = i == 0 ? m->n_bins : m->ch_out[i - 1];
        m->ch_out[i] = ci[p++];
        m->conv[i] = take_linear(&cur, &total, 1, m->kernel * m->ch_in[i], m->ch_out[i]);
        m->conv_norm[i] = take_norm(&cur, &total, m->ch_out[i]);
        m->conv_off[i] = state;
        state += (int64_t)(m->kernel - 1) * m->ch_in[i];
    }
    m->d = ci[p++];
    m->n_layers = ci[p++];
    m->context = ci[p++];
    m->residual = ci[p++];
    if (m->d != m->ch_out[m->n_conv - 1] || m->n_layers < 0 || m->n_layers > MAX_LAYERS || m->context < 1)
        goto fail;
    const int64_t B = MAX_BATCH;
    int64_t pre = 0, work = 0; /* the pre-encoder's inputs after their caches, one conv's after the other */
    for (int i = 0; i < m->n_conv; i++) pre += (m->kernel - 1 + B) * m->ch_in[i];
    for (int j = 0; j < m->n_layers; j++) {
        Block *b = &m->blocks[j];
        const int32_t *c = ci + p + j * CFG_LAYER;
        b->tim = c[0];
        b->groups = c[1];
        b->heads = c[2];
        b->d_ff = c[3];
        b->competition = c[4];
        b->inter_heads = c[5];
        b->inter_dim = c[6];
        b->slope = cf[2 + j];
        const int G = b->groups, d = m->d;
        if (G < 1 || G > 64 || d % G || b->heads % G || d % b->heads || d / b->heads > 256 || b->d_ff % G ||
            (!b->tim && (G != 1 || b->competition)))
            goto fail;
        if (b->competition && m->n_maps && G != m->map_groups) goto fail; /* maps [n_maps][G] per frame */
        const int dm = d / G, s = b->competition ? 1 : 0, iw = b->inter_heads * b->inter_dim;
        b->qkv = take_linear(&cur, &total, G, dm, s + 3 * dm);
        b->o = take_linear(&cur, &total, G, dm, dm);
        b->norm1 = take_norm(&cur, &total, d);
        if (b->tim) {
            b->inter_qkv = take_linear(&cur, &total, G, dm, 3 * iw);
            b->inter_o = take_linear(&cur, &total, G, iw, dm);
            b->norm_inter = take_norm(&cur, &total, d);
        }
        b->ffn_in = take_linear(&cur, &total, G, dm, b->d_ff / G);
        b->ffn_out = take_linear(&cur, &total, G, b->d_ff / G, dm);
        b->norm_ffn = take_norm(&cur, &total, d);
        /* a ring of context x d values: floats, or float16 (rounded up to whole floats) */
        const int64_t ring = m->half_rings ? ((int64_t)m->context * d + 1) / 2 : (int64_t)m->context * d;
        b->k_off = state;
        b->v_off = state + ring;
        state += 2 * ring;
        if (b->competition) {
            m->n_maps++;
            m->map_groups = G;
        }
        /* block_step's work for MAX_BATCH frames: joint q/k/v (+ scores), attention out, update, then the
         * inter-mechanism q/k/v and outputs or the FFN's inner layer; and the scores over the ring */
        int64_t inner = 4 * (int64_t)G * iw > b->d_ff ? 4 * (int64_t)G * iw : b->d_ff;
        int64_t need = B * ((int64_t)G * (s + 3 * dm) + 2 * (int64_t)d + inner) + m->context + 1;
        if (need > work) work = need;
    }
    m->head = take_linear(&cur, &total, 1, m->d, m->n_bins);
    m->state_floats = state;
    m->step_work = B * m->d + m->n_bins + (pre > work ? pre : work); /* hidden states, previous input, ... */
    m->weight_floats = total;
    m->weight_bytes = 4 * total;
    m->n_fft = 2 * (m->n_bins - 1);
    m->hop = m->n_fft / 2;
    m->window = cf + 2 + m->n_layers;
    if (m->n_fft < 4 || (m->n_fft & (m->n_fft - 1))) goto fail; /* the radix-2 FFT */
    /* tim_frames' work after the step's: the FFT's doubles (aligned), a frame, then per frame of a batch its
     * features, output and spectrum (and the spectrum of the frame before the batch) */
    m->work_floats = ((m->step_work + 1) & ~(int64_t)1) + 4 * (int64_t)m->n_fft + m->n_fft +
                     B * 2 * (int64_t)m->n_bins + (B + 1) * 2 * (int64_t)m->n_bins;
    m->tw_re = malloc(sizeof(double) * (size_t)m->n_fft);
    m->rev = malloc(sizeof(int) * (size_t)m->n_fft);
    if (!m->tw_re || !m->rev) goto fail;
    m->tw_im = m->tw_re + m->n_fft / 2;
    for (int k = 0; k < m->n_fft / 2; k++) {
        const double a = 2.0 * 3.14159265358979323846 * k / m->n_fft;
        m->tw_re[k] = cos(a);
        m->tw_im[k] = -sin(a);
    }
    int bits = 0;
    while ((1 << bits) < m->n_fft) bits++;
    for (int i = 0; i < m->n_fft; i++) {
        int r = 0;
        for (int b = 0; b < bits; b++) r |= ((i >> b) & 1) << (bits - 1 - b);
        m->rev[i] = r;
    }
    if (precision && weights && !reduce_weights(m)) goto fail;
#if defined(PACKED_F32)
    if (!precision && weights && !pack_weights(m)) goto fail;
#endif
    return m;
fail:
    tim_model_free(m);
    return NULL;
}

void tim_model_free(void *mp) {
    Model *m = mp;
    if (m) {
        free(m->reduced);
        free(m->tw_re);
        free(m->rev);
    }
    free(m);
}

/* sizes: the weight array, one channel's state, one call's work space (floats); competition maps per frame,
 * groups per map; the bytes of weights the step reads per frame (the matrices in their precision) */
void tim_sizes(const void *mp, int64_t *out) {
    const Model *m = mp;
    out[0] = m->weight_floats;
    out[1] = m->state_floats;
    out[2] = m->work_floats;
    out[3] = m->n_maps;
    out[4] = m->map_groups;
    out[5] = m->weight_bytes;
}

/* the attention of one frame over the rings (its joint projection qkv [G][s + 3 dm]), heads side by side in att
 * [d]; the frame (number `done`) is then written into the rings' oldest slot. score: [C + 1] of work */
static void attend(const Model *m, const Block *b, const float *qkv, float *att, float *state, int64_t done,
                   float *score) {
    const int G = b->groups, d = m->d, dm = d / G, s = b->competition ? 1 : 0, H = b->heads, Dh = d / H;
    const int hpg = H / G, C = m->context, row = s + 3 * dm;
    const int n_past = done < C ? (int)done : C, slot = (int)(done % C);
    const float scale = 1.0f / sqrtf((float)Dh);
    float *K = state + b->k_off, *V = state + b->v_off;
    for (int hh = 0; hh < H; hh++) {
        const int g = hh / hpg, off = (hh % hpg) * Dh;
        const float *q0 = qkv + (size_t)g * row + s + off, *kn = q0 + dm, *vn = q0 + 2 * dm;
        float q[256];
        for (int i = 0; i < Dh; i++) q[i] = q0[i] * scale;
        float *y = att + (size_t)hh * Dh;
        if (m->half_rings) {
            half_t *Kh = (half_t *)K + (size_t)hh * C * Dh, *Vh = (half_t *)V + (size_t)hh * C * Dh;
            scores16(score, q, Kh, Dh, C, n_past);
            float acc = 0.0f;
            for (int i = 0; i < Dh; i++) acc += q[i] * kn[i];
            score[n_past] = acc;
            softmax(score, n_past + 1);
            for (int i = 0; i < Dh; i++) y[i] = score[n_past] * vn[i];
            mix16(y, score, Vh, Dh, n_past);
            for (int i = 0; i < Dh; i++) Kh[(size_t)i * C + slot] = (half_t)kn[i];
            for (int i = 0; i < Dh; i++) Vh[(size_t)slot * Dh + i] = (half_t)vn[i];
            continue;
        }
        float *Kh = K + (size_t)hh * C * Dh, *Vh = V + (size_t)hh * C * Dh;
        for (int t = 0; t < n_past; t++) score[t] = 0.0f;
        for (int i = 0; i < Dh; i++) { /* keys are stored transposed [Dh][C]: the loop over frames vectorises */
            const float a = q[i], *restrict krow = Kh + (size_t)i * C;
            float *restrict sc = score;
            for (int t = 0; t < n_past; t++) sc[t] += a * krow[t];
        }
        float acc = 0.0f;
        for (int i = 0; i < Dh; i++) acc += q[i] * kn[i];
        score[n_past] = acc;
        softmax(score, n_past + 1);
        for (int i = 0; i < Dh; i++) y[i] = score[n_past] * vn[i];
        int t = 0;
        for (; t + 4 <= n_past; t += 4) { /* four frames per pass: a quarter of the dependent adds into y */
            const float p0 = score[t], p1 = score[t + 1], p2 = score[t + 2], p3 = score[t + 3];
            const float *v0 = Vh + (size_t)t * Dh, *v1 = v0 + Dh, *v2 = v1 + Dh, *v3 = v2 + Dh;
            for (int i = 0; i < Dh; i++) y[i] += p0 * v0[i] + p1 * v1[i] + p2 * v2[i] + p3 * v3[i];
        }
        for (; t < n_past; t++) {
            const float p = score[t], *vt = Vh + (size_t)t * Dh;
            for (int i = 0; i < Dh; i++) y[i] += p * vt[i];
        }
        for (int i = 0; i < Dh; i++) Kh[(size_t)i * C + slot] = kn[i]; /* this frame into the oldest slot */
        memcpy(Vh + (size_t)slot * Dh, vn, sizeof(float) * (size_t)Dh);
    }
}

/* the inter-mechanism attention of one frame: iqkv [G][3 iw] -> iy [G][iw] */
static void inter_attend(const Block *b, const float *iqkv, float *iy) {
    const int G = b->groups, IH = b->inter_heads, ID = b->inter_dim, iw = IH * ID;
    const float iscale = 1.0f / sqrtf((float)ID);
    for (int a = 0; a < IH; a++)
        for (int g = 0; g < G; g++) {
            float sc[64];
            const float *q = iqkv + (size_t)g * 3 * iw + a * ID;
            for (int g2 = 0; g2 < G; g2++) {
                const float *k = iqkv + (size_t)g2 * 3 * iw + iw + a * ID;
                float acc2 = 0.0f;
                for (int i = 0; i < ID; i++) acc2 += (q[i] * iscale) * k[i];
                sc[g2] = acc2;
            }
            softmax(sc, G);
            float *y = iy + (size_t)g * iw + a * ID;
            for (int i = 0; i < ID; i++) y[i] = 0.0f;
            for (int g2 = 0; g2 < G; g2++) {
                const float *v = iqkv + (size_t)g2 * 3 * iw + 2 * iw + a * ID;
                for (int i = 0; i < ID; i++) y[i] += sc[g2] * v[i];
            }
        }
}

/* one block on the hidden states H [nf][d] of frames done .. done + nf - 1 (the frames before them sit in the
 * rings), in place. The matrix products take all nf frames at once; the attention goes frame by frame, each
 * frame's keys and values written before the next frame attends. maps (or NULL): this block's competition
 * scores of the first frame, the next frame's map_stride floats on. */
static void block_step(const Model *m, const Block *b, float *H, int nf, float *state, int64_t done, float *work,
                       float *maps, int map_stride) {
    const int G = b->groups, d = m->d, dm = d / G, s = b->competition ? 1 : 0;
    const int C = m->context, row = s + 3 * dm;
    float *qkv = work;                          /* [nf][G][s + 3 dm] */
    float *att = qkv + (size_t)nf * G * row;    /* [nf][d] */
    float *upd = att + (size_t)nf * d;          /* [nf][d] */
    float *score = upd + (size_t)nf * d;        /* [C + 1] */
    float *tmp = score + C + 1;                 /* [nf] x (inter-mechanism q/k/v and outputs, or the FFN's inner layer) */
    float comp[MAX_BATCH][64];
    group_linear(&b->qkv, H, qkv, nf, d, G * row);
    for (int f = 0; f < nf; f++) {
        for (int g = 0; g < G; g++) comp[f][g] = b->competition ? qkv[(size_t)f * G * row + (size_t)g * row] : 1.0f;
        if (!b->competition) continue;
        softmax(comp[f], G);
        if (maps) memcpy(maps + (size_t)f * map_stride, comp[f], sizeof(float) * (size_t)G);
    }
    for (int f = 0; f < nf; f++) attend(m, b, qkv + (size_t)f * G * row, att + (size_t)f * d, state, done + f, score);
    group_linear(&b->o, att, upd, nf, d, d);
    for (int f = 0; f < nf; f++) {
        float *h = H + (size_t)f * d;
        const float *u = upd + (size_t)f * d;
        for (int g = 0; g < G; g++)
            for (int i = 0; i < dm; i++) h[g * dm + i] += comp[f][g] * u[g * dm + i];
        layer_norm(h, G, dm, &b->norm1, m->eps);
    }
    if (b->tim) {
        const int iw = b->inter_heads * b->inter_dim;
        float *iqkv = tmp, *iy = iqkv + (size_t)nf * G * 3 * iw; /* [nf][G][3 iw], [nf][G][iw] */
        group_linear(&b->inter_qkv, H, iqkv, nf, d, G * 3 * iw);
        for (int f = 0; f < nf; f++) inter_attend(b, iqkv + (size_t)f * G * 3 * iw, iy + (size_t)f * G * iw);
        group_linear(&b->inter_o, iy, upd, nf, G * iw, d);
        for (int f = 0; f < nf; f++) {
            float *h = H + (size_t)f * d;
            for (int i = 0; i < d; i++) h[i] += upd[(size_t)f * d + i];
            layer_norm(h, G, dm, &b->norm_inter, m->eps);
        }
    }
    float *ff = tmp; /* [nf][d_ff] */
    group_linear(&b->ffn_in, H, ff, nf, d, b->d_ff);
    leaky(ff, nf * b->d_ff, b->slope);
    group_linear(&b->ffn_out, ff, upd, nf, b->d_ff, d);
    for (int f = 0; f < nf; f++) {
        float *h = H + (size_t)f * d;
        for (int i = 0; i < d; i++) h[i] += upd[(size_t)f * d + i];
        layer_norm(h, G, dm, &b->norm_ffn, m->eps);
    }
}

/* nf (<= MAX_BATCH) frames of features feats [nf][F], none of them a stream's frame 0, through the pre-encoder,
 * the blocks and the output stage: out [nf][F], maps (or NULL) [nf][n_maps][G] */
static void step_frames(const Model *m, float *state, int64_t *counters, float *work, const float *feats, int nf,
                        float min_gain, float *out, float *maps) {
    const int F = m->n_bins, k = m->kernel, d = m->d;
    float *H = work;                   /* [nf][d] */
    float *prev0 = H + (size_t)nf * d; /* [F]: the input frame before the first (residual, floor) */
    float *rest = prev0 + F;
    float *cache0 = state + m->conv_off[0];
    memcpy(prev0, cache0 + (size_t)(k - 2) * F, sizeof(float) * (size_t)F);
    /* conv i reads seq = [its cache: k - 1 frames][the nf new frames]: frame f's window is the k ci floats from
     * seq + f ci. Each conv writes its output frames straight after the next conv's cache (the last into H). */
    float *seq = rest;
    memcpy(seq + (size_t)(k - 1) * F, feats, sizeof(float) * (size_t)nf * F);
    for (int i = 0; i < m->n_conv; i++) {
        const int ci = m->ch_in[i], co = m->ch_out[i];
        float *cache = state + m->conv_off[i];
        float *next = seq + (size_t)(k - 1 + nf) * ci;
        float *y = i + 1 < m->n_conv ? next + (size_t)(k - 1) * co : H;
        memcpy(seq, cache, sizeof(float) * (size_t)(k - 1) * ci);
        group_linear(&m->conv[i], seq, y, nf, ci, co);
        for (int f = 0; f < nf; f++) {
            layer_norm(y + (size_t)f * co, 1, co, &m->conv_norm[i], m->eps);
            leaky(y + (size_t)f * co, co, m->conv_slope);
        }
        memcpy(cache, seq + (size_t)nf * ci, sizeof(float) * (size_t)(k - 1) * ci); /* its last k - 1 frames */
        seq = next;
    }
    const int64_t done = counters[1];
    const int stride = m->n_maps * m->map_groups;
    int map = 0;
    for (int j = 0; j < m->n_layers; j++) { /* the pre-encoder's space is free again */
        const Block *b = &m->blocks[j];
        block_step(m, b, H, nf, state, done, rest, maps && b->competition ? maps + (size_t)map * m->map_groups : NULL,
                   stride);
        map += b->competition;
    }
    group_linear(&m->head, H, out, nf, d, F);
    for (int t = 0; t < nf; t++) {
        const float *prev = t ? feats + (size_t)(t - 1) * F : prev0;
        float *o = out + (size_t)t * F;
        for (int f = 0; f < F; f++) {
            float v;
            if (m->residual) {
                v = prev[f] + o[f];
                v = v > 0.0f ? v : 0.0f;
            } else {
                v = o[f] > 20.0f ? o[f] : log1pf(expf(o[f]));
            }
            if (min_gain >= 0.0f) {
                const float floor = log1pf((expf(prev[f]) - 1.0f) * min_gain);
                v = v > floor ? v : floor;
            }
            o[f] = v;
        }
    }
    counters[1] = done + nf;
}

/* n frames of features feats [n][F] through the step; writes the output frames' log magnitudes [m][F] and,
 * with maps != NULL, their competition scores [m][n_maps][G]; returns m (n, or n - 1 at a stream's first call:
 * frame 0 waits for its lookahead frame). min_gain < 0: no attenuation floor. Up to MAX_BATCH frames go through
 * together (each weight read once for all of them); the result does not depend on how frames are split into
 * calls. */
int tim_step(const void *mp, float *state, int64_t *counters, float *work, const float *feats, int n,
             float min_gain, float *out, float *maps) {
    const Model *m = mp;
    const int F = m->n_bins, k = m->kernel;
    int t = 0, produced = 0;
    if (n > 0 && !counters[0]) { /* frame 0: into conv 0's cache only */
        float *cache0 = state + m->conv_off[0];
        memmove(cache0, cache0 + F, sizeof(float) * (size_t)(k - 2) * F);
        memcpy(cache0 + (size_t)(k - 2) * F, feats, sizeof(float) * (size_t)F);
        counters[0] = 1;
        t = 1;
    }
    while (t < n) {
        const int nf = n - t < MAX_BATCH ? n - t : MAX_BATCH;
        step_frames(m, state, counters, work, feats + (size_t)t * F, nf, min_gain, out + (size_t)produced * F,
                    maps ? maps + (size_t)produced * m->n_maps * m->map_groups : NULL);
        t += nf;
        produced += nf;
    }
    return produced;
}

/* ---- The signal path around the step (tim_frames): the same framing as enhance/stft.py ---- */

/* in-place radix-2 FFT of m->n_fft complex doubles; inverse: conjugated twiddles, not scaled by 1 / n */
static void fft(const Model *m, double *re, double *im, int inverse) {
    const int n = m->n_fft;
    for (int i = 0; i < n; i++) {
        const int j = m->rev[i];
        if (j > i) {
            double t = re[i];
            re[i] = re[j];
            re[j] = t;
            t = im[i];
            im[i] = im[j];
            im[j] = t;
        }
    }
    for (int len = 2; len <= n; len <<= 1) {
        const int half = len >> 1, stride = n / len;
        for (int i = 0; i < n; i += len)
            for (int k = 0; k < half; k++) {
                const double wr = m->tw_re[k * stride], wi = inverse ? -m->tw_im[k * stride] : m->tw_im[k * stride];
                const int a = i + k, b = a + half;
                const double xr = re[b] * wr - im[b] * wi, xi = re[b] * wi + im[b] * wr;
                re[b] = re[a] - xr;
                im[b] = im[a] - xi;
                re[a] += xr;
                im[a] += xi;
            }
    }
}

/* one frame x[n_fft] -> its spectrum spec [F][2] (as numpy's complex64) and features log1p |X| [F] */
static void analyse(const Model *m, const float *x, float *spec, float *feats, double *re, double *im) {
    const int n = m->n_fft;
    for (int i = 0; i < n; i++) {
        re[i] = (double)(x[i] * m->window[i]); /* the float32 product, as torch.stft windows the frame */
        im[i] = 0.0;
    }
    fft(m, re, im, 0);
    for (int f = 0; f < m->n_bins; f++) {
        const float sr = (float)re[f], si = (float)im[f];
        spec[2 * f] = sr;
        spec[2 * f + 1] = si;
        feats[f] = (float)log1p(sqrt((double)sr * sr + (double)si * si));
    }
}

/* a log1p magnitude [F] with the noisy spectrum's phase (spec [F][2]; a zero bin has phase 0) -> the windowed
 * time frame [n_fft] (inverse real FFT: the imaginary parts of bins 0 and n_fft / 2 are ignored) */
static void synthesise(const Model *m, const float *log_mag, const float *spec, float *frame, double *re,
                       double *im) {
    const int n = m->n_fft, F = m->n_bins;
    for (int f = 0; f < F; f++) {
        const double mag = expm1(log_mag[f] > 0.0f ? (double)log_mag[f] : 0.0);
        const double sr = spec[2 * f], si = spec[2 * f + 1], a = sqrt(sr * sr + si * si);
        re[f] = a > 0.0 ? mag * sr / a : mag;
        im[f] = a > 0.0 ? mag * si / a : 0.0;
    }
    im[0] = 0.0;
    im[F - 1] = 0.0;
    for (int f = 1; f < F - 1; f++) {
        re[n - f] = re[f];
        im[n - f] = -im[f];
    }
    fft(m, re, im, 1);
    for (int i = 0; i < n; i++) frame[i] = (float)(re[i] / n) * m->window[i];
}

/* The whole per-frame path of a stream for n new frames: frame t is samples[t hop .. t hop + n_fft) (the
 * engine's framing); each is analysed, goes through the step (tim_step), and each output frame is rebuilt with
 * its noisy phase and overlap-added. final: the stream's end (the zero lookahead frame after the last one).
 * pending [F][2]: the spectrum of the frame waiting for its output (the lookahead; read and written), tail
 * [n_fft - hop]: the overlap-add tail (read and written). Writes hop final samples per output frame into out
 * [m][hop] and, with maps, their competition scores [m][n_maps][G]; returns m. Frames go through the step up to
 * MAX_BATCH at a time. */
int tim_frames(const void *mp, float *state, int64_t *counters, float *work, const float *samples, int n,
               int final, float min_gain, float *pending, float *tail, float *out, float *maps) {
    const Model *m = mp;
    const int F = m->n_bins, N = m->n_fft, hop = m->hop, ov = N - hop, B = MAX_BATCH;
    double *re = (double *)(work + ((m->step_work + 1) & ~(int64_t)1)), *im = re + N;
    float *frame = (float *)(im + N), *feats = frame + N, *log_mag = feats + (size_t)B * F;
    float *specs = log_mag + (size_t)B * F; /* [B + 1][F][2]: the frame before the batch's first, then its own */
    const int total = n + (final && (n > 0 || counters[0]) ? 1 : 0); /* with the end's zero frame */
    int produced = 0;
    memcpy(specs, pending, sizeof(float) * 2 * (size_t)F);
    for (int t0 = 0; t0 < total; t0 += B) {
        const int nb = total - t0 < B ? total - t0 : B;
        for (int j = 0; j < nb; j++) {
            float *spec = specs + (size_t)(j + 1) * 2 * F, *x = feats + (size_t)j * F;
            if (t0 + j < n) {
                analyse(m, samples + (size_t)(t0 + j) * hop, spec, x, re, im);
            } else { /* the end's zero frame: its spectrum is never synthesised */
                memset(x, 0, sizeof(float) * (size_t)F);
                memset(spec, 0, sizeof(float) * 2 * (size_t)F);
            }
        }
        float *mp_out = maps ? maps + (size_t)produced * m->n_maps * m->map_groups : NULL;
        const int got = tim_step(mp, state, counters, work, feats, nb, min_gain, log_mag, mp_out);
        const int skip = nb - got; /* 1 when the batch began with the stream's frame 0 (no output) */
        for (int j = 0; j < got; j++) {
            /* output j is the frame before input j + skip, whose spectrum is specs[j + skip] */
            synthesise(m, log_mag + (size_t)j * F, specs + (size_t)(j + skip) * 2 * F, frame, re, im);
            float *o = out + (size_t)produced * hop;
            for (int i = 0; i < hop; i++) o[i] = tail[i] + frame[i];
            for (int i = 0; i < ov - hop; i++) tail[i] = tail[hop + i] + frame[hop + i];
            for (int i = ov - hop; i < ov; i++) tail[i] = frame[hop + i];
            produced++;
        }
        if (t0 < n && n <= t0 + nb) /* the last new frame waits for its output (past the end: never read) */
            memcpy(pending, specs + (size_t)(n - t0) * 2 * F, sizeof(float) * 2 * (size_t)F);
        memcpy(specs, specs + (size_t)nb * 2 * F, sizeof(float) * 2 * (size_t)F);
    }
    return produced;
}
