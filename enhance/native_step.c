/* The model's incremental step in plain C: one 16 ms frame in, one enhanced log-magnitude frame out.
 *
 * The same computation as models/static_step.py (pre-encoder convs with their caches, standard and TIM blocks
 * with per-block key/value rings, the output stage with the attenuation floor), written for one frame at a time
 * with no per-operation overhead: every matrix-vector product streams its weights once, row by row ("axpy" form,
 * y += x[i] * W[i, :], which compilers vectorise without reassociating sums), and everything else is a few
 * thousand flops per frame. enhance/native_backend.py compiles this file, lays out the weights and the state in the
 * order read below, and checks the result against PyTorch (tests/test_native.py).
 *
 * Weights (float32, one array, in this order; W is [n_in][n_out], i.e. PyTorch's Linear weight transposed):
 *   conv i (i < n_conv):  W [k][C_in][C_out] (frame-major windows), bias, LayerNorm gain, LayerNorm bias
 *   block j:              per-group joint map [G][dm][s + 3 dm] (s = 1 with competition: the score first, then
 *                         Q, K, V) + bias [G][s + 3 dm]; O [G][dm][dm] + bias; norm1 gain, bias [d];
 *                         TIM only: inter-mechanism Q/K/V [G][dm][3 iw] + bias, O [G][iw][dm] + bias, norm gain,
 *                         bias [d]; FFN in [G][dm][ff] + bias, FFN out [G][ff][dm] + bias, norm gain, bias [d]
 *                         (a standard block is G = 1 without competition or inter-mechanism attention)
 *   head:                 W [d][F] + bias [F]
 * State of one channel (floats): per conv its last k - 1 = 2 input frames [2][C_in]; per block the key and value
 * rings, keys [H][Dh][context] (transposed) and values [H][context][Dh]. Counters (int64): [0] frame 0 received, [1] frames output so far.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONV 8
#define MAX_LAYERS 64
#define CFG_LAYER 8 /* ints per block in the config */

typedef _Float16 half_t;

typedef struct {
    const float *w, *b;
    const half_t *h; /* the weights in float16 (half mode), or NULL */
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
    int64_t k_off, v_off; /* offsets of the rings in the state */
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
    int64_t state_floats, work_floats, weight_floats;
    half_t *half; /* half mode: every matrix in float16, read as float32 (biases and norms stay float32) */
} Model;

/* y = b + x W, W [n_in][n_out] row-major; four rows per pass so y is loaded and stored a quarter as often. */
static void gemv(float *restrict y, const float *restrict x, const float *restrict w, const float *restrict b,
                 int n_in, int n_out) {
    memcpy(y, b, sizeof(float) * (size_t)n_out);
    int i = 0;
    for (; i + 4 <= n_in; i += 4) {
        const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
        const float *restrict w0 = w + (size_t)i * n_out;
        const float *restrict w1 = w0 + n_out;
        const float *restrict w2 = w1 + n_out;
        const float *restrict w3 = w2 + n_out;
        for (int o = 0; o < n_out; o++) y[o] += a0 * w0[o] + a1 * w1[o] + a2 * w2[o] + a3 * w3[o];
    }
    for (; i < n_in; i++) {
        const float a = x[i];
        const float *restrict w0 = w + (size_t)i * n_out;
        for (int o = 0; o < n_out; o++) y[o] += a * w0[o];
    }
}

/* gemv with float16 weights: half the bytes to read, converted to float32 as they are loaded (F16C / AVX-512
 * conversions where the compiler targets them; compilers do not vectorise the conversion loop by themselves) */
static void gemv16(float *restrict y, const float *restrict x, const half_t *restrict w, const float *restrict b,
                   int n_in, int n_out) {
    memcpy(y, b, sizeof(float) * (size_t)n_out);
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 4 <= n_in; i += 4) { /* four rows per pass, as in gemv */
        const __m512 a0 = _mm512_set1_ps(x[i]), a1 = _mm512_set1_ps(x[i + 1]);
        const __m512 a2 = _mm512_set1_ps(x[i + 2]), a3 = _mm512_set1_ps(x[i + 3]);
        const half_t *w0 = w + (size_t)i * n_out, *w1 = w0 + n_out, *w2 = w1 + n_out, *w3 = w2 + n_out;
        int o = 0;
        for (; o + 16 <= n_out; o += 16) {
            __m512 acc = _mm512_loadu_ps(y + o);
            acc = _mm512_fmadd_ps(a0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w0 + o))), acc);
            acc = _mm512_fmadd_ps(a1, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w1 + o))), acc);
            acc = _mm512_fmadd_ps(a2, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w2 + o))), acc);
            acc = _mm512_fmadd_ps(a3, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w3 + o))), acc);
            _mm512_storeu_ps(y + o, acc);
        }
        for (; o < n_out; o++)
            y[o] += x[i] * (float)w0[o] + x[i + 1] * (float)w1[o] + x[i + 2] * (float)w2[o] +
                    x[i + 3] * (float)w3[o];
    }
#endif
    for (; i < n_in; i++) {
        const float a = x[i];
        const half_t *restrict w0 = w + (size_t)i * n_out;
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

/* each group's slice x[g] (n_in) -> y[g] (n_out) */
static void group_linear(const GroupLinear *m, const float *x, float *y) {
    if (m->h) {
        for (int g = 0; g < m->groups; g++)
            gemv16(y + (size_t)g * m->n_out, x + (size_t)g * m->n_in, m->h + (size_t)g * m->n_in * m->n_out,
                   m->b + (size_t)g * m->n_out, m->n_in, m->n_out);
        return;
    }
    for (int g = 0; g < m->groups; g++)
        gemv(y + (size_t)g * m->n_out, x + (size_t)g * m->n_in, m->w + (size_t)g * m->n_in * m->n_out,
             m->b + (size_t)g * m->n_out, m->n_in, m->n_out);
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
 * vectorise a loop of it (libm's expf is a call per element: a third of a frame's time in the attention) */
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

/* Config ints: n_bins, n_conv, kernel, C_out[n_conv], d, n_layers, context, residual, then per block
 * CFG_LAYER ints: tim, groups, heads, d_ff (summed over groups), competition, inter_heads, inter_dim, 0.
 * Floats: conv slope, LayerNorm eps, then one LeakyReLU slope per block. weights: NULL to size only (the
 * sizes are then read with tim_sizes). half: keep the matrices in float16 (a copy; not the float32 result). All
 * competition blocks have the same number of groups. Returns NULL on a config this file does not cover. */
void *tim_model_new(const int32_t *ci, const float *cf, const float *weights, int half) {
    Model *m = calloc(1, sizeof(Model));
    if (!m) return NULL;
    int p = 0;
    m->n_bins = ci[p++];
    m->n_conv = ci[p++];
    m->kernel = ci[p++];
    if (m->n_conv < 1 || m->n_conv > MAX_CONV || m->kernel != 3) goto fail;
    const float *cur = weights;
    int64_t total = 0, state = 0;
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
    int64_t pre = 0, work = 0; /* the pre-encoder's windows and outputs, one after the other */
    for (int i = 0; i < m->n_conv; i++) pre += (int64_t)m->kernel * m->ch_in[i] + m->ch_out[i];
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
        b->k_off = state;
        b->v_off = state + (int64_t)m->context * d;
        state += 2 * (int64_t)m->context * d;
        if (b->competition) {
            m->n_maps++;
            m->map_groups = G;
        }
        /* block_step's work: joint q/k/v (+ scores), attention out, update, scores over the ring, then the
         * inter-mechanism q/k/v and outputs or the FFN's inner layer */
        int64_t inner = 4 * (int64_t)G * iw > b->d_ff ? 4 * (int64_t)G * iw : b->d_ff;
        int64_t need = (int64_t)G * (s + 3 * dm) + 2 * (int64_t)d + m->context + 1 + inner;
        if (need > work) work = need;
    }
    m->head = take_linear(&cur, &total, 1, m->d, m->n_bins);
    m->state_floats = state;
    m->work_floats = (int64_t)m->d + m->n_bins + (pre > work ? pre : work);
    m->weight_floats = total;
    if (half && weights) {
        GroupLinear *all[MAX_CONV + 6 * MAX_LAYERS + 1];
        int n_all = 0;
        for (int i = 0; i < m->n_conv; i++) all[n_all++] = &m->conv[i];
        for (int j = 0; j < m->n_layers; j++) {
            Block *b = &m->blocks[j];
            GroupLinear *own[6] = {&b->qkv, &b->o, &b->inter_qkv, &b->inter_o, &b->ffn_in, &b->ffn_out};
            for (int k = 0; k < 6; k++)
                if (own[k]->w) all[n_all++] = own[k];
        }
        all[n_all++] = &m->head;
        int64_t size = 0;
        for (int k = 0; k < n_all; k++) size += (int64_t)all[k]->groups * all[k]->n_in * all[k]->n_out;
        m->half = malloc(sizeof(half_t) * (size_t)size);
        if (!m->half) goto fail;
        half_t *dst = m->half;
        for (int k = 0; k < n_all; k++) {
            const int64_t n = (int64_t)all[k]->groups * all[k]->n_in * all[k]->n_out;
            for (int64_t e = 0; e < n; e++) dst[e] = (half_t)all[k]->w[e];
            all[k]->h = dst;
            dst += n;
        }
    }
    return m;
fail:
    free(m);
    return NULL;
}

void tim_model_free(void *mp) {
    Model *m = mp;
    if (m) free(m->half);
    free(m);
}

/* sizes: the weight array, one channel's state, one call's work space (floats); competition maps per frame and
 * groups per map */
void tim_sizes(const void *mp, int64_t *out) {
    const Model *m = mp;
    out[0] = m->weight_floats;
    out[1] = m->state_floats;
    out[2] = m->work_floats;
    out[3] = m->n_maps;
    out[4] = m->map_groups;
}

/* one block on the hidden state h [d] of frame `done` (frames before it sit in the rings), in place */
static void block_step(const Model *m, const Block *b, float *h, float *state, int64_t done, float *work,
                       float **maps) {
    const int G = b->groups, d = m->d, dm = d / G, s = b->competition ? 1 : 0, H = b->heads, Dh = d / H;
    const int hpg = H / G, C = m->context, row = s + 3 * dm;
    float *qkv = work;                         /* [G][s + 3 dm] */
    float *att = qkv + (size_t)G * row;        /* [d] */
    float *upd = att + d;                      /* [d] */
    float *score = upd + d;                    /* [C + 1] */
    float *tmp = score + C + 1;                /* inter / ffn */
    float comp[64];
    group_linear(&b->qkv, h, qkv);
    if (b->competition) {
        for (int g = 0; g < G; g++) comp[g] = qkv[(size_t)g * row];
        softmax(comp, G);
        memcpy(*maps, comp, sizeof(float) * (size_t)G);
        *maps += G;
    }
    const int n_past = done < C ? (int)done : C, slot = (int)(done % C);
    const float scale = 1.0f / sqrtf((float)Dh);
    float *K = state + b->k_off, *V = state + b->v_off;
    for (int hh = 0; hh < H; hh++) {
        const int g = hh / hpg, off = (hh % hpg) * Dh;
        const float *q0 = qkv + (size_t)g * row + s + off, *kn = q0 + dm, *vn = q0 + 2 * dm;
        float q[256];
        for (int i = 0; i < Dh; i++) q[i] = q0[i] * scale;
        float *Kh = K + (size_t)hh * C * Dh, *Vh = V + (size_t)hh * C * Dh;
        for (int t = 0; t < n_past; t++) score[t] = 0.0f;
        for (int i = 0; i < Dh; i++) { /* keys are stored transposed [Dh][C]: the loop over frames vectorises */
            const float a = q[i], *restrict row = Kh + (size_t)i * C;
            float *restrict sc = score;
            for (int t = 0; t < n_past; t++) sc[t] += a * row[t];
        }
        float acc = 0.0f;
        for (int i = 0; i < Dh; i++) acc += q[i] * kn[i];
        score[n_past] = acc;
        softmax(score, n_past + 1);
        float *y = att + (size_t)hh * Dh;
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
    group_linear(&b->o, att, upd);
    for (int g = 0; g < G; g++) {
        const float c = b->competition ? comp[g] : 1.0f;
        for (int i = 0; i < dm; i++) h[g * dm + i] += c * upd[g * dm + i];
    }
    layer_norm(h, G, dm, &b->norm1, m->eps);
    if (b->tim) {
        const int IH = b->inter_heads, ID = b->inter_dim, iw = IH * ID;
        float *iqkv = tmp, *iy = iqkv + (size_t)G * 3 * iw; /* [G][3 iw], [G][iw] */
        group_linear(&b->inter_qkv, h, iqkv);
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
        group_linear(&b->inter_o, iy, upd);
        for (int i = 0; i < d; i++) h[i] += upd[i];
        layer_norm(h, G, dm, &b->norm_inter, m->eps);
    }
    float *f = tmp; /* [d_ff] */
    group_linear(&b->ffn_in, h, f);
    leaky(f, b->d_ff, b->slope);
    group_linear(&b->ffn_out, f, upd);
    for (int i = 0; i < d; i++) h[i] += upd[i];
    layer_norm(h, G, dm, &b->norm_ffn, m->eps);
}

/* n frames of features feats [n][F] through the step; writes the output frames' log magnitudes [m][F] and,
 * with maps != NULL, their competition scores [m][n_maps][G]; returns m (n, or n - 1 at a stream's first call:
 * frame 0 waits for its lookahead frame). min_gain < 0: no attenuation floor. */
int tim_step(const void *mp, float *state, int64_t *counters, float *work, const float *feats, int n,
             float min_gain, float *out, float *maps) {
    const Model *m = mp;
    const int F = m->n_bins, k = m->kernel;
    int produced = 0;
    float *h = work, *prev = h + m->d, *win = prev + F; /* prev: the input frame t - 1 (residual, floor) */
    for (int t = 0; t < n; t++) {
        const float *x = feats + (size_t)t * F;
        float *cache0 = state + m->conv_off[0];
        if (!counters[0]) { /* frame 0: into conv 0's cache only */
            memmove(cache0, cache0 + F, sizeof(float) * (size_t)(k - 2) * F);
            memcpy(cache0 + (size_t)(k - 2) * F, x, sizeof(float) * (size_t)F);
            counters[0] = 1;
            continue;
        }
        memcpy(prev, cache0 + (size_t)(k - 2) * F, sizeof(float) * (size_t)F);
        const float *in = x;
        float *y = NULL;
        float *buf = win;
        for (int i = 0; i < m->n_conv; i++) {
            const int ci = m->ch_in[i], co = m->ch_out[i];
            float *cache = state + m->conv_off[i];
            float *window = buf, *yo = buf + (size_t)k * ci; /* frames t - 2, t - 1, t; then the output */
            memcpy(window, cache, sizeof(float) * (size_t)(k - 1) * ci);
            memcpy(window + (size_t)(k - 1) * ci, in, sizeof(float) * (size_t)ci);
            group_linear(&m->conv[i], window, yo);
            layer_norm(yo, 1, co, &m->conv_norm[i], m->eps);
            leaky(yo, co, m->conv_slope);
            memcpy(cache, window + ci, sizeof(float) * (size_t)(k - 1) * ci); /* shift the cache */
            in = y = yo;
            buf = yo + co;
        }
        memcpy(h, y, sizeof(float) * (size_t)m->d);
        const int64_t done = counters[1];
        float scratch_maps[64 * MAX_LAYERS];
        float *mc = maps ? maps + (size_t)produced * m->n_maps * m->map_groups : scratch_maps;
        for (int j = 0; j < m->n_layers; j++) /* the pre-encoder's space is free again */
            block_step(m, &m->blocks[j], h, state, done, win, &mc);
        float *o = out + (size_t)produced * F;
        group_linear(&m->head, h, o);
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
        counters[1] = done + 1;
        produced++;
    }
    return produced;
}
