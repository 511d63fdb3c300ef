/* conv_direct.c - the direct AVX-512 convolution of conv_direct.h. */
#include "engine/kernels/conv_direct.h"

#include "engine/core/parallel.h"

#if defined(__AVX512F__)

#include <immintrin.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

#define DC_VL   16   /* floats per vector */
#define DC_R    8    /* output channels per tile */
#define DC_TAPS 64   /* the most taps (kh * kw) a direct conv takes */
#define DC_Q    3    /* the most taps of one kernel row a weight-gradient tile holds */
#define DC_POS  1024 /* positions per weight-gradient chunk */
#define PH_MAX  64   /* phases of a stride (sh x sw) the phase kernels take */

/* The lanes of a 16-wide load from column xs of a row of w floats that lie in the row. */
static inline __mmask16 dc_lanes(int64_t xs, int64_t w) {
    const int64_t lo = xs < 0 ? -xs : 0, hi = w - xs < DC_VL ? w - xs : DC_VL;
    if (hi <= lo) return 0;
    return (__mmask16)((((uint32_t)1 << hi) - 1u) & ~(((uint32_t)1 << lo) - 1u));
}

/* p + off floats as an address only: a masked load reads none of its masked lanes, which may
 * lie before or after the buffer. */
static inline const float *dc_at(const float *p, int64_t off) {
    return (const float *)((uintptr_t)p + (uintptr_t)(off * (int64_t)sizeof(float)));
}

bool ms_k_conv_direct_ok(const ms_k_conv *g) {
    return g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 && g->ow % DC_VL == 0 &&
           g->cout_g % DC_R == 0 && g->kh * g->kw <= DC_TAPS && g->oh * g->ow > 0;
}

/* The stride-1 input gradient's condition. */
static bool dc_dx_ok(const ms_k_conv *g) {
    return ms_k_conv_direct_ok(g) && g->w % DC_VL == 0 && g->cin_g % DC_R == 0 && g->ph < g->kh &&
           g->pw < g->kw;
}

static bool dl_ok(const ms_k_conv *g);
static int64_t dl_chunk(const ms_k_conv *g);
static int64_t dl_image_floats(const ms_k_conv *g);
static int64_t dl_scratch_floats(const ms_k_conv *g);
static bool fl_ok(const ms_k_conv *g);
static int64_t fl_wk_floats(const ms_k_conv *g);
static int64_t fl_image_floats(const ms_k_conv *g);
static bool xl_ok(const ms_k_conv *g);
static int64_t xl_scratch_floats(const ms_k_conv *g);

static bool ph_ok(const ms_k_conv *g);
static bool fp_ok(const ms_k_conv *g);

bool ms_k_conv_direct_dx_ok(const ms_k_conv *g) {
    return dc_dx_ok(g) || ph_ok(g) || xl_ok(g);
}

int64_t ms_k_conv_direct_scratch_floats(const ms_k_conv *g) {
    const int64_t wk =
        ms_k_conv_direct_ok(g) ? g->groups * g->cout_g * g->cin_g * g->kh * g->kw : 0;
    const int64_t dl = dl_ok(g) ? dl_scratch_floats(g) : 0;
    const int64_t fl = fl_ok(g) ? fl_wk_floats(g) + dl_chunk(g) * fl_image_floats(g) : 0;
    const int64_t xl = xl_ok(g) ? xl_scratch_floats(g) : 0;
    /* the phases' packed weights (input gradient, forward): every tap once */
    const int64_t ph = ph_ok(g) || fp_ok(g) ? g->groups * g->cout_g * g->cin_g * g->kh * g->kw : 0;
    const int64_t most = wk > dl ? wk : dl, most2 = fl > xl ? fl : xl;
    const int64_t most3 = most > most2 ? most : most2;
    return most3 > ph ? most3 : ph;
}

/* --- forward and input gradient: out[8 planes] += the conv of src ---------------------------- */

/* One block of 8 output planes of one image: src [c][h][w] convolved (stride 1, padding ph, pw)
 * into out [8][oh][ow] by wk [c * kh * kw][8]. */
typedef struct dc_block {
    const float *src, *wk;
    float *out;
    int64_t c, h, w, oh, ow, kh, kw, ph, pw;
    /* set: out written whole, as bias[r] (or 0, bias NULL) plus the sum; else out += the sum */
    bool set;
    bool relu; /* then max(out, 0): the forward's fused ReLU (only where set) */
    const float *bias;
} dc_block;

/* A tile's last step: out[r][v0 + p] = (out, or the bias) + acc, then the ReLU if asked. */
static inline __attribute__((always_inline)) void dc_store(const dc_block *d, int64_t v0, int np,
                                                           __m512 acc[][DC_R]) {
    const int64_t ohw = d->oh * d->ow;
    /* a mask, not a branch: a branch here makes the compiler keep acc in memory */
    const __mmask16 relu = d->relu ? 0xFFFF : 0;
    __m512 base[DC_R];
    for (int r = 0; r < DC_R; r++)
        base[r] = d->bias ? _mm512_set1_ps(d->bias[r]) : _mm512_setzero_ps();
    for (int p = 0; p < np; p++)
        for (int r = 0; r < DC_R; r++) {
            float *o = d->out + r * ohw + (v0 + p) * DC_VL;
            if (!d->set) base[r] = _mm512_loadu_ps(o);
            __m512 v = _mm512_add_ps(base[r], acc[p][r]);
            v = _mm512_mask_max_ps(v, relu, v, _mm512_setzero_ps()); /* NaN -> 0, as relu's */
            _mm512_storeu_ps(o, v);
        }
}

/* Output vectors v0 .. v0 + np - 1 (np 1 or 2) of the block's 8 planes, summed over channels
 * and taps in registers, then added to out (or, with set, to the bias and stored: no pass to
 * fill out first and no read of it). */
static inline __attribute__((always_inline)) void dc_tile(const dc_block *d, int64_t v0, int np) {
    const int64_t taps = d->kh * d->kw, vrow = d->ow / DC_VL, hw = d->h * d->w;
    __m512 acc[2][DC_R];
    int64_t y[2], x0[2];
    for (int p = 0; p < np; p++) {
        y[p] = (v0 + p) / vrow, x0[p] = (v0 + p) % vrow * DC_VL;
        for (int r = 0; r < DC_R; r++) acc[p][r] = _mm512_setzero_ps();
    }
    for (int64_t t = 0; t < taps; t++) {
        const int64_t ky = t / d->kw, kx = t % d->kw;
        __mmask16 m[2] = {0, 0};
        int64_t off[2] = {0, 0};
        for (int p = 0; p < np; p++) {
            const int64_t ys = y[p] + ky - d->ph, xs = x0[p] + kx - d->pw;
            if (ys < 0 || ys >= d->h) continue;
            m[p] = dc_lanes(xs, d->w), off[p] = ys * d->w + xs;
        }
        if (!(m[0] | m[1])) continue; /* every row in the padding */
        const float *s = d->src, *wt = d->wk + t * DC_R;
        for (int64_t c = 0; c < d->c; c++, s += hw, wt += taps * DC_R) {
            __m512 b[2];
            for (int p = 0; p < np; p++) b[p] = _mm512_maskz_loadu_ps(m[p], dc_at(s, off[p]));
            for (int r = 0; r < DC_R; r++) {
                const __m512 wr = _mm512_set1_ps(wt[r]);
                for (int p = 0; p < np; p++) acc[p][r] = _mm512_fmadd_ps(wr, b[p], acc[p][r]);
            }
        }
    }
    dc_store(d, v0, np, acc);
}

/* dc_tile for three taps a row, padding 1 either side, output rows as wide as the input's (a
 * multiple of 16): per kernel row and channel, each vector's row is read once where the row's
 * 16-float blocks lie, and its left and right neighbours' columns are made by shifting in the
 * registers (valignd) instead of loads one float off, which straddle two cache lines. */
static inline __attribute__((always_inline)) void dc_tile3(const dc_block *d, int64_t v0, int np,
                                                           int row_blocks) {
    const int64_t vrow = d->w / DC_VL, hw = d->h * d->w, taps = d->kh * 3;
    __m512 acc[2][DC_R];
    int64_t y[2], x0[2];
    for (int p = 0; p < np; p++) {
        y[p] = (v0 + p) / vrow, x0[p] = (v0 + p) % vrow * DC_VL;
        for (int r = 0; r < DC_R; r++) acc[p][r] = _mm512_setzero_ps();
    }
    for (int64_t ky = 0; ky < d->kh; ky++) {
        /* per vector: the row's lanes (all or none), the blocks before and after it */
        __mmask16 m[2] = {0, 0}, mp[2] = {0, 0}, mn[2] = {0, 0};
        int64_t off[2] = {0, 0};
        for (int p = 0; p < np; p++) {
            const int64_t ys = y[p] + ky - d->ph;
            if (ys < 0 || ys >= d->h) continue;
            m[p] = 0xFFFF, off[p] = ys * d->w + x0[p];
            mp[p] = x0[p] > 0 ? 0xFFFF : 0, mn[p] = x0[p] + DC_VL < d->w ? 0xFFFF : 0;
        }
        if (!(m[0] | m[1])) continue; /* every row in the padding */
        const float *s = d->src, *wt = d->wk + ky * 3 * DC_R;
        for (int64_t c = 0; c < d->c; c++, s += hw, wt += taps * DC_R) {
            __m512 b[3][2];
            __m512 cur[2];
            for (int p = 0; p < np; p++) cur[p] = _mm512_maskz_loadu_ps(m[p], dc_at(s, off[p]));
            for (int p = 0; p < np; p++) {
                /* Rows of one block, or a tile that is one row of two: the neighbours are the
                 * padding or the tile's own blocks, nothing more to load (a masked-off load
                 * still costs a load). */
                __m512 prv, nxt;
                if (row_blocks == 1)
                    prv = nxt = _mm512_setzero_ps();
                else if (row_blocks == 2)
                    prv = p ? cur[0] : _mm512_setzero_ps(), nxt = p ? _mm512_setzero_ps() : cur[1];
                else
                    prv = _mm512_maskz_loadu_ps(mp[p], dc_at(s, off[p] - DC_VL)),
                    nxt = _mm512_maskz_loadu_ps(mn[p], dc_at(s, off[p] + DC_VL));
                b[0][p] = _mm512_castsi512_ps(
                    _mm512_alignr_epi32(_mm512_castps_si512(cur[p]), _mm512_castps_si512(prv), 15));
                b[1][p] = cur[p];
                b[2][p] = _mm512_castsi512_ps(
                    _mm512_alignr_epi32(_mm512_castps_si512(nxt), _mm512_castps_si512(cur[p]), 1));
            }
            for (int kx = 0; kx < 3; kx++)
                for (int r = 0; r < DC_R; r++) {
                    const __m512 wr = _mm512_set1_ps(wt[kx * DC_R + r]);
                    for (int p = 0; p < np; p++)
                        acc[p][r] = _mm512_fmadd_ps(wr, b[kx][p], acc[p][r]);
                }
        }
    }
    dc_store(d, v0, np, acc);
}

static void dc_block_run(const dc_block *d) {
    const int64_t nvec = d->oh * d->ow / DC_VL;
    int64_t v = 0;
    if (d->kw == 3 && d->pw == 1 && d->ow == d->w && d->w % DC_VL == 0) {
        /* a kernel apiece for rows of one and of two blocks (every pair of vectors a row) */
        if (d->w == DC_VL) {
            for (; v + 2 <= nvec; v += 2) dc_tile3(d, v, 2, 1);
            if (v < nvec) dc_tile3(d, v, 1, 1);
        } else if (d->w == 2 * DC_VL) {
            for (; v + 2 <= nvec; v += 2) dc_tile3(d, v, 2, 2);
        } else {
            for (; v + 2 <= nvec; v += 2) dc_tile3(d, v, 2, 0);
            if (v < nvec) dc_tile3(d, v, 1, 0);
        }
        return;
    }
    for (; v + 2 <= nvec; v += 2) dc_tile(d, v, 2);
    if (v < nvec) dc_tile(d, v, 1);
}

/* A whole call: per image and group, src (src_c channels) into out (out_c channels, blocks of
 * 8), with the strides between images and groups of each. */
typedef struct dc_job {
    dc_block proto; /* sizes and set; src, out, wk and bias are the call's bases */
    int64_t groups, out_c, src_img, src_grp, out_img, out_grp;
} dc_job;

static void dc_range(void *arg, int64_t lo, int64_t hi) {
    const dc_job *j = arg;
    const dc_block *p = &j->proto;
    const int64_t k = p->c * p->kh * p->kw, ohw = p->oh * p->ow;
    for (int64_t i = lo; i < hi; i++)
        for (int64_t grp = 0; grp < j->groups; grp++)
            for (int64_t ob = 0; ob < j->out_c / DC_R; ob++) {
                dc_block d = *p;
                d.src = p->src + i * j->src_img + grp * j->src_grp;
                d.out = p->out + i * j->out_img + grp * j->out_grp + ob * DC_R * ohw;
                d.wk = p->wk + (grp * j->out_c + ob * DC_R) * k;
                d.bias = p->bias ? p->bias + grp * j->out_c + ob * DC_R : NULL;
                dc_block_run(&d);
            }
}

/* dst[b] = src[2 b] for b < n; src holds avail floats. 16 at a time: two loads, the even
 * lanes picked. */
static void every_other(float *dst, const float *src, int64_t n, int64_t avail) {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int64_t b = 0; b < n; b += DC_VL) {
        const int64_t left = avail - 2 * b;
        const __mmask16 m0 = dc_lanes(0, left), m1 = dc_lanes(DC_VL, left);
        const __m512 v =
            _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m0, src + 2 * b), even,
                                   _mm512_maskz_loadu_ps(m1, dc_at(src, 2 * b + DC_VL)));
        _mm512_mask_storeu_ps(dst + b, dc_lanes(0, n - b), v);
    }
}

/* dst[2 b] += a[b], dst[2 b + 1] += b_[b] for b < n (n a multiple of 16): the two phases of a
 * row of stride 2, interleaved; a NULL phase adds nothing. */
static void interleave_add(float *dst, const float *a, const float *b_, int64_t n) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int64_t b = 0; b < n; b += DC_VL) {
        const __m512 va = a ? _mm512_loadu_ps(a + b) : _mm512_setzero_ps();
        const __m512 vb = b_ ? _mm512_loadu_ps(b_ + b) : _mm512_setzero_ps();
        float *d = dst + 2 * b;
        _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), _mm512_permutex2var_ps(va, lo, vb)));
        _mm512_storeu_ps(d + DC_VL, _mm512_add_ps(_mm512_loadu_ps(d + DC_VL),
                                                  _mm512_permutex2var_ps(va, hi, vb)));
    }
}

/* --- strided forward by phases ------------------------------------------------------------- */

/* A stride-(sh, sw) conv reads x at sh oy + ky - ph: with ky - ph = sh q + ry (0 <= ry < sh),
 * that is row oy + q of x's phase ry (its rows ry, ry + sh, ...). So the forward is a sum over
 * the phases (ry, rx) of stride-1 convs of each phase of x by the taps that reach it, all
 * added into the same output: one copy of x, split into its phases, and the stride-1 tile
 * (dc_tile). */
typedef struct fp_phase {
    int64_t ry, rx;
    int64_t nty, ntx, ky_lo, kx_lo; /* its taps: ky = ky_lo + sh t */
    int64_t qy0, qx0;               /* the phase row its first tap reads, less oy */
    int64_t h, w;                   /* the phase's rows and columns */
    int64_t x_at, wk_at;            /* its copy of x in the image's buffer, its packed weight */
} fp_phase;

static bool fp_ok(const ms_k_conv *g) {
    return (g->sh > 1 || g->sw > 1) && g->sh * g->sw <= PH_MAX && g->dh == 1 && g->dw == 1 &&
           g->ow % DC_VL == 0 && g->cout_g % DC_R == 0 && g->kh * g->kw <= DC_TAPS &&
           g->oh * g->ow > 0 && g->h * g->w > 0;
}

/* The taps along a dim that meet phase r of a stride s with padding pad, forward or backward
 * (both read x at s * o + tap - pad): tap = (r + pad) mod s, + s, ... below k; their count and
 * the lowest. r + pad - tap is then a multiple of s for each. */
static int64_t phase_taps(int64_t r, int64_t pad, int64_t s, int64_t k, int64_t *lo) {
    *lo = (r + pad) % s;
    return *lo < k ? (k - 1 - *lo) / s + 1 : 0;
}

static void fp_taps(int64_t r, int64_t pad, int64_t s, int64_t k, int64_t *n, int64_t *lo,
                    int64_t *q0) {
    *n = phase_taps(r, pad, s, k, lo);
    *q0 = (*lo - pad - r) / s; /* the phase row the lowest tap reads, less the output row */
}

/* The phases with taps, and their packed weights in wk (each tap once):
 * wk[at + (o / 8 * cin_g * taps' + c * taps' + t) * 8 + o % 8] = w[o][c][ky(t)][kx(t)]. */
static int fp_plan(const ms_k_conv *g, float *wk, const float *w, fp_phase *ph, int64_t *x_floats) {
    const int64_t taps = g->kh * g->kw, k = g->cin_g * taps;
    int n = 0;
    int64_t at = 0, xat = 0;
    for (int64_t ry = 0; ry < g->sh; ry++)
        for (int64_t rx = 0; rx < g->sw; rx++) {
            fp_phase q = {.ry = ry,
                          .rx = rx,
                          .h = (g->h - ry + g->sh - 1) / g->sh,
                          .w = (g->w - rx + g->sw - 1) / g->sw,
                          .wk_at = at};
            fp_taps(ry, g->ph, g->sh, g->kh, &q.nty, &q.ky_lo, &q.qy0);
            fp_taps(rx, g->pw, g->sw, g->kw, &q.ntx, &q.kx_lo, &q.qx0);
            const int64_t tp = q.nty * q.ntx, kp = g->cin_g * tp;
            if (tp == 0 || q.h * q.w == 0) continue;
            q.x_at = xat;
            xat += g->groups * g->cin_g * q.h * q.w;
            for (int64_t o = 0; o < g->groups * g->cout_g; o++)
                for (int64_t c = 0; c < g->cin_g; c++)
                    for (int64_t t = 0; t < tp; t++) {
                        const int64_t ky = q.ky_lo + g->sh * (t / q.ntx),
                                      kx = q.kx_lo + g->sw * (t % q.ntx);
                        wk[at + (o / DC_R * kp + c * tp + t) * DC_R + o % DC_R] =
                            w[o * k + c * taps + ky * g->kw + kx];
                    }
            at += g->groups * g->cout_g * kp;
            ph[n++] = q;
        }
    *x_floats = xat;
    return n;
}

typedef struct fp_job {
    const ms_k_conv *g;
    float *out;
    const float *wk, *x;
    fp_phase ph[PH_MAX];
    int n;
    int64_t x_floats; /* one image's phases */
} fp_job;

static void fp_range(void *arg, int64_t lo, int64_t hi) {
    const fp_job *j = arg;
    const ms_k_conv *g = j->g;
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    float *xp = xmalloc(sizeof(float) * (size_t)j->x_floats);
    for (int64_t i = lo; i < hi; i++) {
        const float *x = j->x + (g->c0 + i * g->c_x) * hw;
        for (int f = 0; f < j->n; f++) { /* the image's phases, every group */
            const fp_phase *q = &j->ph[f];
            for (int64_t c = 0; c < g->groups * g->cin_g; c++)
                for (int64_t a = 0; a < q->h; a++) {
                    const float *row = x + c * hw + (q->ry + g->sh * a) * g->w + q->rx;
                    float *dst = xp + q->x_at + (c * q->h + a) * q->w;
                    if (g->sw == 2)
                        every_other(dst, row, q->w, g->w - q->rx);
                    else
                        for (int64_t b = 0; b < q->w; b++) dst[b] = row[g->sw * b];
                }
        }
        for (int64_t grp = 0; grp < g->groups; grp++)
            for (int f = 0; f < j->n; f++) {
                const fp_phase *q = &j->ph[f];
                const int64_t tp = q->nty * q->ntx, kp = g->cin_g * tp;
                for (int64_t ob = 0; ob < g->cout_g / DC_R; ob++) {
                    dc_block d = {.src = xp + q->x_at + grp * g->cin_g * q->h * q->w,
                                  .wk =
                                      j->wk + q->wk_at + (grp * g->cout_g / DC_R + ob) * kp * DC_R,
                                  .out = j->out + ms_k_conv_out_at(g, i, grp) + ob * DC_R * ohw,
                                  .c = g->cin_g,
                                  .h = q->h,
                                  .w = q->w,
                                  .oh = g->oh,
                                  .ow = g->ow,
                                  .kh = q->nty,
                                  .kw = q->ntx,
                                  .ph = -q->qy0,
                                  .pw = -q->qx0};
                    dc_block_run(&d);
                }
            }
    }
    free(xp);
}

static void fp_run(const ms_k_conv *g, float *out, float *wk, const float *x, const float *w) {
    fp_job *j = xmalloc(sizeof *j);
    *j = (fp_job){.g = g, .out = out, .wk = wk, .x = x};
    j->n = fp_plan(g, wk, w, j->ph, &j->x_floats);
    if (j->n > 0) ms_parallel_for(g->n, 1, fp_range, j);
    free(j);
}

static void fl_run(const ms_k_conv *g, float *out, float *wk, const float *x, const float *w);

void ms_k_conv_direct_forward(const ms_k_conv *g, float *out, float *wk, const float *x,
                              const float *w, const float *bias) {
    if (!ms_k_conv_direct_ok(g)) {
        ms_k_conv_fill(g, out, bias);
        if (fp_ok(g))
            fp_run(g, out, wk, x, w);
        else
            fl_run(g, out, wk, x, w);
        if (g->relu) ms_k_conv_relu(g, out);
        return;
    }
    const int64_t k = g->cin_g * g->kh * g->kw, hw = g->h * g->w, ohw = g->oh * g->ow;
    /* wk[grp][ob][k][r] = w[grp][ob * 8 + r][k] */
    for (int64_t o = 0; o < g->groups * g->cout_g; o++)
        for (int64_t q = 0; q < k; q++) wk[(o / DC_R * k + q) * DC_R + o % DC_R] = w[o * k + q];
    dc_job j = {.proto = {.src = x + g->c0 * hw,
                          .wk = wk,
                          .out = out,
                          .set = true,
                          .relu = g->relu,
                          .bias = bias,
                          .c = g->cin_g,
                          .h = g->h,
                          .w = g->w,
                          .oh = g->oh,
                          .ow = g->ow,
                          .kh = g->kh,
                          .kw = g->kw,
                          .ph = g->ph,
                          .pw = g->pw},
                .groups = g->groups,
                .out_c = g->cout_g,
                .src_img = g->c_x * hw,
                .src_grp = g->cin_g * hw,
                .out_img = g->groups * g->cout_g * ohw,
                .out_grp = g->cout_g * ohw};
    ms_parallel_for(g->n, 1, dc_range, &j);
}

/* --- strided input gradient by phases ------------------------------------------------------ */

/* The input positions of one phase (py, px) of the stride, py + sh a and px + sw b, are reached
 * only by the taps ky = py + ph (mod sh), kx = px + pw (mod sw), each a fixed shift of dout:
 *   dx[ci][py + sh a][px + sw b] += sum over co and those taps of
 *                                   w[co][ci][ky][kx] dout[co][a + (py + ph - ky) / sh][...]
 * so each phase is a stride-1 conv of dout by its own taps: the stride-1 tile (dc_tile) at
 * full speed, written densely, then added into dx's phase. Every dx element is summed over
 * the same channels and taps in one fixed order, whatever the threads. */
typedef struct ph_phase {
    int64_t py, px;
    int64_t nty, ntx; /* its taps: ky = ky_hi - sh t (t < nty), kx = kx_hi - sw t */
    int64_t ky_hi, kx_hi;
    int64_t dy0, dx0; /* the shift of dout its first tap reads */
    int64_t oh;       /* rows of dx in the phase (its width: w / sw) */
    int64_t wk_at;    /* its packed weight in the scratch */
} ph_phase;

static bool ph_ok(const ms_k_conv *g) {
    return (g->sh > 1 || g->sw > 1) && g->sh * g->sw <= PH_MAX && g->dh == 1 && g->dw == 1 &&
           g->cin_g % DC_R == 0 && g->w % g->sw == 0 && g->w / g->sw % DC_VL == 0 &&
           g->kh * g->kw <= DC_TAPS && g->oh * g->ow > 0 && g->h * g->w > 0;
}

/* The taps of one phase along a dim: count, the highest tap, the shift it reads. */
static void ph_taps(int64_t p, int64_t pad, int64_t s, int64_t k, int64_t *n, int64_t *hi,
                    int64_t *d0) {
    int64_t lo;
    *n = phase_taps(p, pad, s, k, &lo);
    *hi = lo + (*n - 1) * s;
    *d0 = (p + pad - *hi) / s;
}

/* The phases that have taps, and their packed weights in wk:
 * wk[at + ((grp * cin_g / 8 + cb) * cout_g + co) * taps' * 8 + t * 8 + r] = w[grp][co][cb * 8
 * + r][ky(t)][kx(t)]. */
static int ph_plan(const ms_k_conv *g, float *wk, const float *w, ph_phase *ph) {
    const int64_t taps = g->kh * g->kw, k = g->cin_g * taps;
    int n = 0;
    int64_t at = 0;
    for (int64_t py = 0; py < g->sh; py++)
        for (int64_t px = 0; px < g->sw; px++) {
            ph_phase q = {.py = py, .px = px, .oh = (g->h - py + g->sh - 1) / g->sh, .wk_at = at};
            ph_taps(py, g->ph, g->sh, g->kh, &q.nty, &q.ky_hi, &q.dy0);
            ph_taps(px, g->pw, g->sw, g->kw, &q.ntx, &q.kx_hi, &q.dx0);
            const int64_t tp = q.nty * q.ntx;
            if (tp == 0 || q.oh == 0) continue;
            for (int64_t grp = 0; grp < g->groups; grp++)
                for (int64_t co = 0; co < g->cout_g; co++)
                    for (int64_t ci = 0; ci < g->cin_g; ci++)
                        for (int64_t t = 0; t < tp; t++) {
                            const int64_t ky = q.ky_hi - g->sh * (t / q.ntx),
                                          kx = q.kx_hi - g->sw * (t % q.ntx);
                            wk[at +
                               (((grp * g->cin_g + ci) / DC_R * g->cout_g + co) * tp + t) * DC_R +
                               ci % DC_R] =
                                w[ms_k_conv_w_at(g, grp) + co * k + ci * taps + ky * g->kw + kx];
                        }
            at += g->groups * g->cout_g * g->cin_g * tp;
            ph[n++] = q;
        }
    return n;
}

typedef struct ph_job {
    const ms_k_conv *g;
    float *dx;
    const float *wk, *dout;
    ph_phase ph[PH_MAX];
    int n;
} ph_job;

static void ph_range(void *arg, int64_t lo, int64_t hi) {
    const ph_job *j = arg;
    const ms_k_conv *g = j->g;
    const int64_t hw = g->h * g->w, pw = g->w / g->sw;
    int64_t at[PH_MAX], total = 0; /* each phase's planes in buf */
    int of[PH_MAX];                /* the phase at (py, px), or -1 */
    for (int f = 0; f < g->sh * g->sw; f++) of[f] = -1;
    for (int f = 0; f < j->n; f++) {
        at[f] = total;
        total += g->cin_g * j->ph[f].oh * pw;
        of[j->ph[f].py * g->sw + j->ph[f].px] = f;
    }
    float *buf = xmalloc(sizeof(float) * (size_t)total);
    for (int64_t i = lo; i < hi; i++)
        for (int64_t grp = 0; grp < g->groups; grp++) {
            const float *dy = j->dout + ms_k_conv_out_at(g, i, grp);
            float *dx = j->dx + (g->c0 + i * g->c_x + grp * g->cin_g) * hw;
            memset(buf, 0, sizeof(float) * (size_t)total);
            for (int f = 0; f < j->n; f++) {
                const ph_phase *q = &j->ph[f];
                const int64_t plane = q->oh * pw, tp = q->nty * q->ntx;
                for (int64_t cb = 0; cb < g->cin_g / DC_R; cb++) {
                    dc_block d = {.src = dy,
                                  .wk = j->wk + q->wk_at +
                                        ((grp * g->cin_g / DC_R + cb) * g->cout_g) * tp * DC_R,
                                  .out = buf + at[f] + cb * DC_R * plane,
                                  .c = g->cout_g,
                                  .h = g->oh,
                                  .w = g->ow,
                                  .oh = q->oh,
                                  .ow = pw,
                                  .kh = q->nty,
                                  .kw = q->ntx,
                                  .ph = -q->dy0,
                                  .pw = -q->dx0};
                    dc_block_run(&d);
                }
            }
            /* into dx: a stride of 2 across interleaves its two phases a row at a time */
            for (int64_t py = 0; py < g->sh; py++) {
                const int64_t rows = (g->h - py + g->sh - 1) / g->sh;
                for (int64_t px = 0; px < g->sw; px += g->sw == 2 ? 2 : 1) {
                    const int f0 = of[py * g->sw + px], f1 = g->sw == 2 ? of[py * g->sw + 1] : -1;
                    if (f0 < 0 && f1 < 0) continue;
                    for (int64_t ci = 0; ci < g->cin_g; ci++)
                        for (int64_t a = 0; a < rows; a++) {
                            float *row = dx + ci * hw + (py + g->sh * a) * g->w + px;
                            const int64_t r = (ci * rows + a) * pw;
                            const float *s0 = f0 >= 0 ? buf + at[f0] + r : NULL;
                            if (g->sw == 2) {
                                interleave_add(row, s0, f1 >= 0 ? buf + at[f1] + r : NULL, pw);
                                continue;
                            }
                            for (int64_t b = 0; b < pw; b++) row[g->sw * b] += s0[b];
                        }
                }
            }
        }
    free(buf);
}

static void ph_run(const ms_k_conv *g, float *dx, float *wk, const float *dout, const float *w) {
    ph_job *j = xmalloc(sizeof *j);
    *j = (ph_job){.g = g, .dx = dx, .wk = wk, .dout = dout};
    j->n = ph_plan(g, wk, w, j->ph);
    ms_parallel_for(g->n, 1, ph_range, j);
    free(j);
}

static void xl_run(const ms_k_conv *g, float *dx, float *wk, const float *dout, const float *w);

void ms_k_conv_direct_dx(const ms_k_conv *g, float *dx, float *wk, const float *dout,
                         const float *w, bool fresh) {
    /* Written whole only where the groups cover every channel of dx */
    const bool set = fresh && dc_dx_ok(g) && g->c0 == 0 && g->groups * g->cin_g == g->c_x;
    if (fresh && !set) ms_k_conv_zero(dx, g->n * g->c_x * g->h * g->w);
    if (!dc_dx_ok(g)) {
        if (ph_ok(g))
            ph_run(g, dx, wk, dout, w);
        else
            xl_run(g, dx, wk, dout, w);
        return;
    }
    const int64_t taps = g->kh * g->kw, k = g->cin_g * taps, hw = g->h * g->w;
    const int64_t ohw = g->oh * g->ow, kt = g->cout_g * taps;
    /* dx is the stride-1 conv of dout, padded kh - 1 - ph, by the weight flipped in both dims
     * with its channels swapped: wk[grp][cb][co * taps + t'][r] = w[grp][co][cb * 8 + r][taps - 1
     * - t']. */
    for (int64_t grp = 0; grp < g->groups; grp++)
        for (int64_t co = 0; co < g->cout_g; co++)
            for (int64_t ci = 0; ci < g->cin_g; ci++)
                for (int64_t t = 0; t < taps; t++)
                    wk[(grp * g->cin_g + ci / DC_R * DC_R) * kt +
                       (co * taps + taps - 1 - t) * DC_R + ci % DC_R] =
                        w[ms_k_conv_w_at(g, grp) + co * k + ci * taps + t];
    dc_job j = {.proto = {.src = dout,
                          .wk = wk,
                          .out = dx + g->c0 * hw,
                          .set = set,
                          .c = g->cout_g,
                          .h = g->oh,
                          .w = g->ow,
                          .oh = g->h,
                          .ow = g->w,
                          .kh = g->kh,
                          .kw = g->kw,
                          .ph = g->kh - 1 - g->ph,
                          .pw = g->kw - 1 - g->pw},
                .groups = g->groups,
                .out_c = g->cin_g,
                .src_img = g->groups * g->cout_g * ohw,
                .src_grp = g->cout_g * ohw,
                .out_img = g->c_x * hw,
                .out_grp = g->cin_g * hw};
    ms_parallel_for(g->n, 1, dc_range, &j);
}

/* --- weight gradient ----------------------------------------------------------------------------
 */

typedef struct dw_job {
    const ms_k_conv *g;
    float *dw;
    const float *dout, *x;
    int64_t i0, i1; /* the chunk's images */
    int64_t kxc;    /* chunks of up to DC_Q taps per kernel row */
} dw_job;

/* dw[grp][ob * 8 + r][c][ky][kx0 + q] += dout . x shifted, r < 8, q < nq, over the chunk. */
static inline __attribute__((always_inline)) void
dw_tile(const dw_job *j, int64_t grp, int64_t ob, int64_t c, int64_t ky, int64_t kx0, int nq) {
    const ms_k_conv *g = j->g;
    const int64_t ohw = g->oh * g->ow;
    __m512 acc[DC_R][DC_Q];
    for (int r = 0; r < DC_R; r++)
        for (int q = 0; q < nq; q++) acc[r][q] = _mm512_setzero_ps();
    /* The lanes of each tap's load in the row's first, inner and last vectors. */
    __mmask16 mf[DC_Q], mi[DC_Q], ml[DC_Q];
    for (int q = 0; q < nq; q++) {
        mf[q] = dc_lanes(kx0 + q - g->pw, g->w), mi[q] = 0xffff;
        ml[q] = dc_lanes(g->ow - DC_VL + kx0 + q - g->pw, g->w);
    }
    for (int64_t i = j->i0; i < j->i1; i++) {
        const float *dy = j->dout + ms_k_conv_out_at(g, i, grp) + ob * DC_R * ohw;
        const float *xc = j->x + ms_k_conv_x_at(g, i, grp) + c * g->h * g->w;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const int64_t ys = oy + ky - g->ph;
            if (ys < 0 || ys >= g->h) continue;
            const float *row = xc + ys * g->w, *dyr = dy + oy * g->ow;
            for (int64_t ox = 0; ox < g->ow; ox += DC_VL) {
                const int64_t xs = ox + kx0 - g->pw;
                const __mmask16 *m = ox == 0 ? mf : ox + DC_VL == g->ow ? ml : mi;
                __m512 xv[DC_Q];
                for (int q = 0; q < nq; q++)
                    xv[q] = _mm512_maskz_loadu_ps(m[q], dc_at(row, xs + q));
                for (int r = 0; r < DC_R; r++) {
                    __m512 d = _mm512_loadu_ps(dyr + r * ohw + ox);
                    __asm__("" : "+v"(d)); /* one load, not one folded into each FMA */
                    for (int q = 0; q < nq; q++) acc[r][q] = _mm512_fmadd_ps(d, xv[q], acc[r][q]);
                }
            }
        }
    }
    const int64_t k = g->cin_g * g->kh * g->kw;
    float *o = j->dw + ms_k_conv_w_at(g, grp) + ob * DC_R * k + (c * g->kh + ky) * g->kw + kx0;
    for (int r = 0; r < DC_R; r++)
        for (int q = 0; q < nq; q++) o[r * k + q] += _mm512_reduce_add_ps(acc[r][q]);
}

/* Tiles [lo, hi) in (grp, ob, c, ky, kx chunk) order. */
static void dw_range(void *arg, int64_t lo, int64_t hi) {
    const dw_job *j = arg;
    const ms_k_conv *g = j->g;
    for (int64_t t = lo; t < hi; t++) {
        int64_t rest = t;
        const int64_t kc = rest % j->kxc;
        rest /= j->kxc;
        const int64_t ky = rest % g->kh;
        rest /= g->kh;
        const int64_t c = rest % g->cin_g;
        rest /= g->cin_g;
        const int64_t ob = rest % (g->cout_g / DC_R), grp = rest / (g->cout_g / DC_R);
        const int64_t kx0 = kc * DC_Q, nq = g->kw - kx0 < DC_Q ? g->kw - kx0 : DC_Q;
        if (nq == 3)
            dw_tile(j, grp, ob, c, ky, kx0, 3);
        else if (nq == 2)
            dw_tile(j, grp, ob, c, ky, kx0, 2);
        else
            dw_tile(j, grp, ob, c, ky, kx0, 1);
    }
}

/* --- weight gradient, output channels in the lanes -----------------------------------------------
 *
 * Per chunk of images: dout transposed to [position][cout_g] (dt) and x copied with its padding
 * as zeros (xp, rows of ow + kw - 1), so a tap of any position is a plain read. A tile of 16 or
 * 32 output channels (one or two vectors) by up to DL_T taps of one input channel keeps its
 * sums in registers over the chunk's positions: per position, one or two loads of dout and one
 * broadcast of x per tap, no horizontal sum. Each dw element is one tile's, its positions summed
 * in one order whatever the tiling or the thread count. */

#define DL_VC  16   /* output channels per vector */
#define DL_T   9    /* the most taps a lanes tile holds */
#define DL_POS 2048 /* positions per chunk */

/* 1x1 kernels stay out: one broadcast per dout load leaves the loads the bound, slower than
 * the GEMM (measured at stride 2). */
static bool dl_ok(const ms_k_conv *g) {
    return g->cout_g % DL_VC == 0 && g->dh == 1 && g->dw == 1 && g->oh * g->ow > 0 &&
           g->kh * g->kw > 1;
}

bool ms_k_conv_direct_dw_ok(const ms_k_conv *g) {
    return dl_ok(g) || ms_k_conv_direct_ok(g);
}

static int64_t dl_chunk(const ms_k_conv *g) {
    const int64_t ohw = g->oh * g->ow;
    return ohw >= DL_POS ? 1 : DL_POS / ohw;
}

/* Slots: the chunks are split into this many contiguous runs, each run's sum kept apart and the
 * runs added in order at the end. One parallel region per conv instead of two per chunk (each
 * wakes the workers: tens of microseconds on a VM, against a chunk's ~0.2 ms of work), and a
 * function of the shape alone, so the sums do not depend on the thread count. */
#define DL_SLOTS      8
#define DL_SLOT_BYTES (48 << 20) /* the most scratch the slots may take together */

/* One slot's scratch: a chunk's transposed dout and padded x, then its partial sums of dw and
 * of the bias's gradient. */
static int64_t dl_slot_floats(const ms_k_conv *g) {
    const int64_t cout = g->groups * g->cout_g;
    return dl_chunk(g) * dl_image_floats(g) + cout * g->cin_g * g->kh * g->kw + cout;
}

static int64_t dl_slots(const ms_k_conv *g) {
    const int64_t chunk = dl_chunk(g), chunks = (g->n + chunk - 1) / chunk;
    const int64_t per = dl_slot_floats(g);
    int64_t s = chunks < DL_SLOTS ? chunks : DL_SLOTS;
    while (s > 1 && s * per * (int64_t)sizeof(float) > DL_SLOT_BYTES) s--;
    return s > 0 ? s : 1;
}

static int64_t dl_scratch_floats(const ms_k_conv *g) {
    const int64_t chunk_floats = dl_chunk(g) * dl_image_floats(g);
    const int64_t s = dl_slots(g);
    return s > 1 ? s * dl_slot_floats(g) : chunk_floats;
}

/* Floats of one image's dt and xp (all groups). */
static int64_t dl_image_floats(const ms_k_conv *g) {
    const int64_t hp = (g->oh - 1) * g->sh + g->kh, wp = (g->ow - 1) * g->sw + g->kw;
    return g->groups * (g->oh * g->ow * g->cout_g + g->cin_g * hp * wp);
}

typedef struct dl_job {
    const ms_k_conv *g;
    float *dw, *dt, *xp; /* dt: [chunk][groups][ohw][cout_g]  xp: [chunk][groups][cin_g][hp][wp] */
    float *db;           /* a slot's: the bias's gradient summed as dout is transposed, or NULL */
    const float *dout, *x;
    int64_t i0, i1, hp, wp, nv, cbs, tcs; /* cbs: channel blocks of nv vectors; tcs: tap chunks */
    bool pad_only;                        /* the forward's prep: x alone */
    float *out;                           /* the forward's: out, and wk[grp][c][tap][cout_g] */
    const float *wl;
} dl_job;

/* Prep items [lo, hi): item 2 * (image * groups + grp) + 0 transposes dout, + 1 pads x; with
 * pad_only, item image * groups + grp pads x. */
/* t[p][c] = d[c][p]: rows of c floats from columns of n; 16 x 16 blocks in registers (the
 * standard three rounds of shuffles), the edges one by one. */
static void transpose(float *t, const float *d, int64_t c, int64_t n) {
    int64_t c16 = c / DC_VL * DC_VL, n16 = n / DC_VL * DC_VL;
    for (int64_t c0 = 0; c0 < c16; c0 += DC_VL)
        for (int64_t p0 = 0; p0 < n16; p0 += DC_VL) {
            __m512 r[16], u[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(d + (c0 + i) * n + p0);
            for (int i = 0; i < 16; i += 2) {
                u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
                u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 16; i += 4) {
                r[i] = _mm512_shuffle_ps(u[i], u[i + 2], 0x44);
                r[i + 1] = _mm512_shuffle_ps(u[i], u[i + 2], 0xEE);
                r[i + 2] = _mm512_shuffle_ps(u[i + 1], u[i + 3], 0x44);
                r[i + 3] = _mm512_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; i++) {
                u[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
                u[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
                u[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
                u[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
            }
            for (int i = 0; i < 8; i++) {
                r[i] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0x88);
                r[i + 8] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0xDD);
            }
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(t + (p0 + i) * c + c0, r[i]);
        }
    for (int64_t p = 0; p < n; p++)
        for (int64_t k = p < n16 ? c16 : 0; k < c; k++) t[p * c + k] = d[k * n + p];
}

static void dl_prep(void *arg, int64_t lo, int64_t hi) {
    const dl_job *j = arg;
    const ms_k_conv *g = j->g;
    const int64_t ohw = g->oh * g->ow, plane = j->hp * j->wp;
    for (int64_t it = lo; it < hi; it++) {
        const int64_t ig = j->pad_only ? it : it / 2, ii = ig / g->groups, grp = ig % g->groups;
        const int64_t i = j->i0 + ii;
        if (!j->pad_only && it % 2 == 0) {
            const float *d = j->dout + ms_k_conv_out_at(g, i, grp);
            transpose(j->dt + ig * ohw * g->cout_g, d, g->cout_g, ohw);
            if (j->db) /* the rows just read, still in cache: one pass less over dout */
                for (int64_t c = 0; c < g->cout_g; c++) {
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int64_t p = 0; p < ohw; p++) sum += d[c * ohw + p];
                    j->db[grp * g->cout_g + c] += sum;
                }
            continue;
        }
        const float *xs = j->x + ms_k_conv_x_at(g, i, grp);
        float *o = j->xp + ig * g->cin_g * plane;
        /* the padded copy: rows in the padding zeros, each other row its zeros either side of
         * the input row's columns (the right border: what lies past w) */
        const int64_t left = g->pw < j->wp ? g->pw : j->wp;
        const int64_t cols = g->w < j->wp - left ? g->w : j->wp - left;
        for (int64_t c = 0; c < g->cin_g; c++)
            for (int64_t py = 0; py < j->hp; py++) {
                const int64_t ys = py - g->ph;
                float *row = o + c * plane + py * j->wp;
                if (ys < 0 || ys >= g->h || cols <= 0) {
                    memset(row, 0, sizeof(float) * (size_t)j->wp);
                    continue;
                }
                memset(row, 0, sizeof(float) * (size_t)left);
                memcpy(row + left, xs + (c * g->h + ys) * g->w, sizeof(float) * (size_t)cols);
                memset(row + left + cols, 0, sizeof(float) * (size_t)(j->wp - left - cols));
            }
    }
}

/* dw[grp][cb * nv * 16 + lane][c][t0 + q] += over the chunk, q < nt. */
static inline __attribute__((always_inline)) void dl_tile(const dl_job *j, int64_t grp, int64_t cb,
                                                          int64_t c, int64_t t0, int nv, int nt) {
    const ms_k_conv *g = j->g;
    const int64_t ohw = g->oh * g->ow, co = g->cout_g, plane = j->hp * j->wp;
    __m512 acc[2][DL_T], tot[2][DL_T]; /* one row's sums; the rows' */
    int64_t toff[DL_T];
    for (int q = 0; q < nt; q++) {
        toff[q] = (t0 + q) / g->kw * j->wp + (t0 + q) % g->kw;
        for (int v = 0; v < nv; v++) tot[v][q] = _mm512_setzero_ps();
    }
    for (int64_t ii = 0; ii < j->i1 - j->i0; ii++) {
        const int64_t ig = ii * g->groups + grp;
        const float *d = j->dt + ig * ohw * co + cb * nv * DL_VC;
        const float *xs = j->xp + (ig * g->cin_g + c) * plane;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const float *xr = xs + oy * g->sh * j->wp, *dr = d + oy * g->ow * co;
            for (int q = 0; q < nt; q++)
                for (int v = 0; v < nv; v++) acc[v][q] = _mm512_setzero_ps();
            for (int64_t ox = 0; ox < g->ow; ox++) {
                __m512 dv[2];
                for (int v = 0; v < nv; v++) dv[v] = _mm512_loadu_ps(dr + ox * co + v * DL_VC);
                for (int q = 0; q < nt; q++) {
                    const __m512 b = _mm512_set1_ps(xr[ox * g->sw + toff[q]]);
                    for (int v = 0; v < nv; v++) acc[v][q] = _mm512_fmadd_ps(dv[v], b, acc[v][q]);
                }
            }
            /* Rows summed apart, then added: a float32 sum of thousands of positions in one
             * line would lose digits. */
            for (int q = 0; q < nt; q++)
                for (int v = 0; v < nv; v++) tot[v][q] = _mm512_add_ps(tot[v][q], acc[v][q]);
        }
    }
    const int64_t k = g->cin_g * g->kh * g->kw;
    float *o = j->dw + ms_k_conv_w_at(g, grp) + cb * nv * DL_VC * k + c * g->kh * g->kw + t0;
    for (int v = 0; v < nv; v++)
        for (int q = 0; q < nt; q++) {
            float lane[DL_VC];
            _mm512_storeu_ps(lane, tot[v][q]);
            for (int r = 0; r < DL_VC; r++) o[(v * DL_VC + r) * k + q] += lane[r];
        }
}

#define DL_CASE(nv, nt)                                                                            \
    case nt:                                                                                       \
        dl_tile(j, grp, cb, c, t0, nv, nt);                                                        \
        break

static void dl_tile_nv(const dl_job *j, int64_t grp, int64_t cb, int64_t c, int64_t t0, int nt) {
    if (j->nv == 2) switch (nt) {
            DL_CASE(2, 1);
            DL_CASE(2, 2);
            DL_CASE(2, 3);
            DL_CASE(2, 4);
            DL_CASE(2, 5);
            DL_CASE(2, 6);
            DL_CASE(2, 7);
            DL_CASE(2, 8);
            DL_CASE(2, 9);
        }
    else
        switch (nt) {
            DL_CASE(1, 1);
            DL_CASE(1, 2);
            DL_CASE(1, 3);
            DL_CASE(1, 4);
            DL_CASE(1, 5);
            DL_CASE(1, 6);
            DL_CASE(1, 7);
            DL_CASE(1, 8);
            DL_CASE(1, 9);
        }
}

/* Tiles [lo, hi) in (grp, channel block, c, tap chunk) order. */
static void dl_range(void *arg, int64_t lo, int64_t hi) {
    const dl_job *j = arg;
    const ms_k_conv *g = j->g;
    const int64_t taps = g->kh * g->kw;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t tc = t % j->tcs, c = t / j->tcs % g->cin_g;
        const int64_t cb = t / j->tcs / g->cin_g % j->cbs, grp = t / j->tcs / g->cin_g / j->cbs;
        const int64_t t0 = tc * DL_T, nt = taps - t0 < DL_T ? taps - t0 : DL_T;
        dl_tile_nv(j, grp, cb, c, t0, (int)nt);
    }
}

/* Slot-run items [lo, hi): each slot's chunks, prep and tiles in turn, into the slot's own
 * scratch and partial sum. */
typedef struct dl_slots_job {
    const dl_job *base;
    float *wk; /* [slots][chunk scratch, dw, dbias] */
    int64_t slots, chunks, chunk, slot_floats, dw_floats, tiles;
    bool db; /* the slots sum the bias's gradient too */
} dl_slots_job;

/* Slot s's partial sums: dw's, then (dw_floats on) the bias's, at the end of its scratch. */
static float *dl_slot_part(const dl_slots_job *sj, int64_t s) {
    const ms_k_conv *g = sj->base->g;
    return sj->wk + (s + 1) * sj->slot_floats - sj->dw_floats - g->groups * g->cout_g;
}

static void dl_slot_range(void *arg, int64_t lo, int64_t hi) {
    const dl_slots_job *sj = arg;
    const ms_k_conv *g = sj->base->g;
    for (int64_t s = lo; s < hi; s++) {
        dl_job j = *sj->base;
        float *own = sj->wk + s * sj->slot_floats;
        j.dt = own, j.xp = own + sj->chunk * g->groups * g->oh * g->ow * g->cout_g;
        j.dw = dl_slot_part(sj, s);
        j.db = sj->db ? j.dw + sj->dw_floats : NULL;
        memset(j.dw, 0, sizeof(float) * (size_t)(sj->dw_floats + g->groups * g->cout_g));
        const int64_t c0 = s * sj->chunks / sj->slots, c1 = (s + 1) * sj->chunks / sj->slots;
        for (int64_t c = c0; c < c1; c++) {
            j.i0 = c * sj->chunk;
            j.i1 = j.i0 + sj->chunk < g->n ? j.i0 + sj->chunk : g->n;
            dl_prep(&j, 0, 2 * (j.i1 - j.i0) * g->groups);
            dl_range(&j, 0, sj->tiles);
        }
    }
}

/* dw[e] += the slots' partial sums of e, in slot order. */
static void dl_slot_sum(void *arg, int64_t lo, int64_t hi) {
    const dl_slots_job *sj = arg;
    float *dw = sj->base->dw;
    for (int64_t s = 0; s < sj->slots; s++) {
        const float *part = dl_slot_part(sj, s);
        for (int64_t e = lo; e < hi; e++) dw[e] += part[e];
    }
}

/* dw += the weight gradient; with slots, dbias (when given) += the bias's as well, and true. */
static bool dl_run(const ms_k_conv *g, float *dw, float *wk, const float *dout, const float *x,
                   float *dbias) {
    const int64_t chunk = dl_chunk(g), taps = g->kh * g->kw;
    dl_job j = {.g = g, .dw = dw, .dout = dout, .x = x};
    j.hp = (g->oh - 1) * g->sh + g->kh, j.wp = (g->ow - 1) * g->sw + g->kw,
    j.tcs = (taps + DL_T - 1) / DL_T;
    j.dt = wk, j.xp = wk + chunk * g->groups * g->oh * g->ow * g->cout_g;
    const int64_t slots = dl_slots(g);
    /* Two vectors of channels where that leaves a few tiles per thread (per slot: a slot's
     * tiles run on one thread). */
    const int64_t per2 = g->groups * (g->cout_g / (2 * DL_VC)) * g->cin_g * j.tcs;
    j.nv = g->cout_g % (2 * DL_VC) == 0 && (slots > 1 || per2 >= 4 * ms_parallel_threads()) ? 2 : 1;
    j.cbs = g->cout_g / (j.nv * DL_VC);
    const int64_t tiles = g->groups * j.cbs * g->cin_g * j.tcs;
    if (slots > 1) {
        const int64_t dw_floats = g->groups * g->cout_g * g->cin_g * taps;
        dl_slots_job sj = {.base = &j,
                           .wk = wk,
                           .slots = slots,
                           .chunk = chunk,
                           .chunks = (g->n + chunk - 1) / chunk,
                           .dw_floats = dw_floats,
                           .tiles = tiles,
                           .db = dbias != NULL};
        sj.slot_floats = dl_slot_floats(g);
        ms_parallel_for(slots, 1, dl_slot_range, &sj);
        ms_parallel_for(dw_floats, 1024, dl_slot_sum, &sj);
        const int64_t cout = g->groups * g->cout_g;
        for (int64_t s = 0; dbias && s < slots; s++) /* in slot order, as dw */
            for (int64_t c = 0; c < cout; c++) dbias[c] += dl_slot_part(&sj, s)[dw_floats + c];
        return dbias != NULL;
    }
    for (j.i0 = 0; j.i0 < g->n; j.i0 = j.i1) {
        j.i1 = j.i0 + chunk < g->n ? j.i0 + chunk : g->n;
        ms_parallel_for(2 * (j.i1 - j.i0) * g->groups, 1, dl_prep, &j);
        ms_parallel_for(tiles, 1, dl_range, &j);
    }
    return false;
}

/* --- forward of strided convs, output channels in the lanes --------------------------------------
 *
 * The same padded copy of x; a tile of 32 output channels by up to FL_P positions of one output
 * row keeps its sums in registers over every input channel and tap: per tap, two loads of the
 * packed weight and one broadcast of x per position. Each output is one tile's, summed in one
 * order, then added to out (which holds the bias). */

#define FL_P 8 /* the most positions a forward tile holds */

static bool fl_ok(const ms_k_conv *g) {
    return !ms_k_conv_direct_ok(g) && dl_ok(g) && g->cout_g % (2 * DL_VC) == 0;
}

static int64_t fl_wk_floats(const ms_k_conv *g) {
    return g->groups * g->cout_g * g->cin_g * g->kh * g->kw;
}

/* Floats of one image's padded x (all groups). */
static int64_t fl_image_floats(const ms_k_conv *g) {
    const int64_t hp = (g->oh - 1) * g->sh + g->kh, wp = (g->ow - 1) * g->sw + g->kw;
    return g->groups * g->cin_g * hp * wp;
}

static inline __attribute__((always_inline)) void
fl_tile(const dl_job *j, int64_t ii, int64_t grp, int64_t cb, int64_t oy, int64_t ox0, int np) {
    const ms_k_conv *g = j->g;
    const int64_t taps = g->kh * g->kw, plane = j->hp * j->wp, ohw = g->oh * g->ow;
    __m512 acc[2][FL_P];
    for (int p = 0; p < np; p++) acc[0][p] = acc[1][p] = _mm512_setzero_ps();
    const float *xs =
        j->xp + (ii * g->groups + grp) * g->cin_g * plane + oy * g->sh * j->wp + ox0 * g->sw;
    const float *wt = j->wl + grp * g->cin_g * taps * g->cout_g + cb * 2 * DL_VC;
    for (int64_t c = 0; c < g->cin_g; c++)
        for (int64_t ky = 0; ky < g->kh; ky++)
            for (int64_t kx = 0; kx < g->kw; kx++, wt += g->cout_g) {
                const float *xr = xs + c * plane + ky * j->wp + kx;
                const __m512 w0 = _mm512_loadu_ps(wt), w1 = _mm512_loadu_ps(wt + DL_VC);
                for (int p = 0; p < np; p++) {
                    const __m512 b = _mm512_set1_ps(xr[p * g->sw]);
                    acc[0][p] = _mm512_fmadd_ps(w0, b, acc[0][p]);
                    acc[1][p] = _mm512_fmadd_ps(w1, b, acc[1][p]);
                }
            }
    float *o =
        j->out + ms_k_conv_out_at(g, j->i0 + ii, grp) + cb * 2 * DL_VC * ohw + oy * g->ow + ox0;
    for (int v = 0; v < 2; v++)
        for (int p = 0; p < np; p++) {
            float lane[DL_VC];
            _mm512_storeu_ps(lane, acc[v][p]);
            for (int r = 0; r < DL_VC; r++) o[(v * DL_VC + r) * ohw + p] += lane[r];
        }
}

#define FL_CASE(np)                                                                                \
    case np:                                                                                       \
        fl_tile(j, ii, grp, cb, oy, ox0, np);                                                      \
        break

/* Tiles [lo, hi) in (image, grp, channel block, row, position block) order. */
static void fl_range(void *arg, int64_t lo, int64_t hi) {
    const dl_job *j = arg;
    const ms_k_conv *g = j->g;
    const int64_t pbs = (g->ow + FL_P - 1) / FL_P;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t ox0 = t % pbs * FL_P, oy = t / pbs % g->oh, cb = t / pbs / g->oh % j->cbs;
        const int64_t grp = t / pbs / g->oh / j->cbs % g->groups;
        const int64_t ii = t / pbs / g->oh / j->cbs / g->groups;
        switch (g->ow - ox0 < FL_P ? g->ow - ox0 : FL_P) {
            FL_CASE(1);
            FL_CASE(2);
            FL_CASE(3);
            FL_CASE(4);
            FL_CASE(5);
            FL_CASE(6);
            FL_CASE(7);
            FL_CASE(8);
        }
    }
}

static void fl_run(const ms_k_conv *g, float *out, float *wk, const float *x, const float *w) {
    const int64_t chunk = dl_chunk(g), taps = g->kh * g->kw, k = g->cin_g * taps;
    /* wk[grp][c][t][co] = w[grp][co][c][t] */
    for (int64_t grp = 0; grp < g->groups; grp++)
        for (int64_t co = 0; co < g->cout_g; co++)
            for (int64_t q = 0; q < k; q++)
                wk[(grp * k + q) * g->cout_g + co] = w[ms_k_conv_w_at(g, grp) + co * k + q];
    dl_job j = {.g = g, .x = x, .out = out, .wl = wk, .pad_only = true};
    j.hp = (g->oh - 1) * g->sh + g->kh, j.wp = (g->ow - 1) * g->sw + g->kw;
    j.xp = wk + fl_wk_floats(g), j.cbs = g->cout_g / (2 * DL_VC);
    const int64_t per_image = g->groups * j.cbs * g->oh * ((g->ow + FL_P - 1) / FL_P);
    for (j.i0 = 0; j.i0 < g->n; j.i0 = j.i1) {
        j.i1 = j.i0 + chunk < g->n ? j.i0 + chunk : g->n;
        ms_parallel_for((j.i1 - j.i0) * g->groups, 1, dl_prep, &j);
        ms_parallel_for((j.i1 - j.i0) * per_image, 1, fl_range, &j);
    }
}

bool ms_k_conv_direct_forward_ok(const ms_k_conv *g) {
    return ms_k_conv_direct_ok(g) || fp_ok(g) || fl_ok(g);
}

/* --- input gradient of strided convs, input channels in the lanes
 * ---------------------------------
 *
 * dout copied per chunk of images with a border of zeros wide enough that every tap of every
 * input position reads inside it: [co][ohp][owp], (oy, ox) at (oy + ay, ox + ax). A tile of 32
 * input channels by up to FL_P input positions of one row that share their column's phase
 * (ix = r + sw * q) keeps its sums in registers over every output channel and each tap that
 * reaches them (ky = (iy + ph) mod sh + sh * m, likewise kx): per tap two loads of the weight
 * packed [co][tap][c] and one broadcast of dout per position, the positions' dout adjacent.
 * Each dx element is one tile's, summed in one order, then added to dx. */

typedef struct xl_job {
    const ms_k_conv *g;
    float *dx, *dp; /* dp: [chunk][groups][cout_g][ohp][owp] */
    const float *dout, *wl;
    int64_t i0, i1, ay, ax, ohp, owp, cbs, rmax; /* rmax: positions of a row's phase, most */
} xl_job;

static bool xl_ok(const ms_k_conv *g) {
    return !dc_dx_ok(g) && g->cin_g % (2 * DL_VC) == 0 && g->dh == 1 && g->dw == 1 &&
           g->kh * g->kw > 1 && g->oh * g->ow > 0 && g->h * g->w > 0;
}

/* The border: the lowest output row a tap reads is floor((ph - kh + 1) / sh), the highest
 * (h - 1 + ph) / sh. */
static void xl_border(const ms_k_conv *g, int64_t *ay, int64_t *ax, int64_t *ohp, int64_t *owp) {
    const int64_t lo_y = g->ph - g->kh + 1, lo_x = g->pw - g->kw + 1;
    const int64_t my = lo_y < 0 ? (-lo_y + g->sh - 1) / g->sh : 0;
    const int64_t mx = lo_x < 0 ? (-lo_x + g->sw - 1) / g->sw : 0;
    const int64_t hy = (g->h - 1 + g->ph) / g->sh - (g->oh - 1),
                  hx = (g->w - 1 + g->pw) / g->sw - (g->ow - 1);
    *ay = my, *ax = mx;
    *ohp = my + g->oh + (hy > 0 ? hy : 0), *owp = mx + g->ow + (hx > 0 ? hx : 0);
}

static int64_t xl_scratch_floats(const ms_k_conv *g) {
    int64_t ay, ax, ohp, owp;
    xl_border(g, &ay, &ax, &ohp, &owp);
    return g->groups * g->cout_g * g->cin_g * g->kh * g->kw +
           dl_chunk(g) * g->groups * g->cout_g * ohp * owp;
}

static void xl_prep(void *arg, int64_t lo, int64_t hi) {
    const xl_job *j = arg;
    const ms_k_conv *g = j->g;
    const int64_t plane = j->ohp * j->owp, ohw = g->oh * g->ow;
    for (int64_t ig = lo; ig < hi; ig++) {
        const float *d = j->dout + ms_k_conv_out_at(g, j->i0 + ig / g->groups, ig % g->groups);
        float *o = j->dp + ig * g->cout_g * plane;
        for (int64_t co = 0; co < g->cout_g; co++)
            for (int64_t py = 0; py < j->ohp; py++)
                for (int64_t px = 0; px < j->owp; px++) {
                    const int64_t oy = py - j->ay, ox = px - j->ax;
                    o[co * plane + py * j->owp + px] =
                        oy >= 0 && oy < g->oh && ox >= 0 && ox < g->ow
                            ? d[co * ohw + oy * g->ow + ox]
                            : 0.0f;
                }
    }
}

static inline __attribute__((always_inline)) void xl_tile(const xl_job *j, int64_t ii, int64_t grp,
                                                          int64_t cb, int64_t iy, int64_t r,
                                                          int64_t q0, int np) {
    const ms_k_conv *g = j->g;
    const int64_t taps = g->kh * g->kw, plane = j->ohp * j->owp, ix0 = r + g->sw * q0;
    __m512 acc[2][FL_P];
    for (int p = 0; p < np; p++) acc[0][p] = acc[1][p] = _mm512_setzero_ps();
    const float *dp = j->dp + (ii * g->groups + grp) * g->cout_g * plane;
    const float *wl = j->wl + grp * g->cout_g * taps * g->cin_g + cb * 2 * DL_VC;
    /* The taps that reach the row's phase: where each reads dout and the weight. */
    const int64_t ky0 = (iy + g->ph) % g->sh, kx0 = (ix0 + g->pw) % g->sw;
    int64_t od[DC_TAPS], ow_[DC_TAPS];
    int nt = 0;
    for (int64_t ky = ky0; ky < g->kh; ky += g->sh)
        for (int64_t kx = kx0; kx < g->kw; kx += g->sw, nt++) {
            od[nt] =
                ((iy + g->ph - ky) / g->sh + j->ay) * j->owp + (ix0 + g->pw - kx) / g->sw + j->ax;
            ow_[nt] = (ky * g->kw + kx) * g->cin_g;
        }
    for (int64_t co = 0; co < g->cout_g; co++) {
        const float *dc = dp + co * plane, *wc = wl + co * taps * g->cin_g;
        for (int t = 0; t < nt; t++) {
            const float *dr = dc + od[t], *wt = wc + ow_[t];
            const __m512 w0 = _mm512_loadu_ps(wt), w1 = _mm512_loadu_ps(wt + DL_VC);
            for (int p = 0; p < np; p++) {
                const __m512 b = _mm512_set1_ps(dr[p]);
                acc[0][p] = _mm512_fmadd_ps(w0, b, acc[0][p]);
                acc[1][p] = _mm512_fmadd_ps(w1, b, acc[1][p]);
            }
        }
    }
    const int64_t hw = g->h * g->w;
    float *o = j->dx + ms_k_conv_x_at(g, j->i0 + ii, grp) + cb * 2 * DL_VC * hw + iy * g->w + ix0;
    for (int v = 0; v < 2; v++)
        for (int p = 0; p < np; p++) {
            float lane[DL_VC];
            _mm512_storeu_ps(lane, acc[v][p]);
            for (int c = 0; c < DL_VC; c++) o[(v * DL_VC + c) * hw + p * g->sw] += lane[c];
        }
}

#define XL_CASE(np)                                                                                \
    case np:                                                                                       \
        xl_tile(j, ii, grp, cb, iy, r, q0, np);                                                    \
        break

/* Tiles [lo, hi) in (image, grp, channel block, row, phase, position block) order. */
static void xl_range(void *arg, int64_t lo, int64_t hi) {
    const xl_job *j = arg;
    const ms_k_conv *g = j->g;
    const int64_t pbs = (j->rmax + FL_P - 1) / FL_P;
    for (int64_t t = lo; t < hi; t++) {
        int64_t rest = t;
        const int64_t q0 = rest % pbs * FL_P;
        rest /= pbs;
        const int64_t r = rest % g->sw;
        rest /= g->sw;
        const int64_t iy = rest % g->h;
        rest /= g->h;
        const int64_t cb = rest % j->cbs;
        rest /= j->cbs;
        const int64_t grp = rest % g->groups, ii = rest / g->groups;
        const int64_t nr = (g->w - r + g->sw - 1) / g->sw, left = nr - q0;
        if (left <= 0) continue;
        switch (left < FL_P ? left : FL_P) {
            XL_CASE(1);
            XL_CASE(2);
            XL_CASE(3);
            XL_CASE(4);
            XL_CASE(5);
            XL_CASE(6);
            XL_CASE(7);
            XL_CASE(8);
        }
    }
}

static void xl_run(const ms_k_conv *g, float *dx, float *wk, const float *dout, const float *w) {
    const int64_t chunk = dl_chunk(g), taps = g->kh * g->kw, k = g->cin_g * taps;
    xl_job j = {.g = g, .dx = dx, .dout = dout, .wl = wk};
    /* wk[grp][co][t][c] = w[grp][co][c][t] */
    for (int64_t grp = 0; grp < g->groups; grp++)
        for (int64_t co = 0; co < g->cout_g; co++)
            for (int64_t c = 0; c < g->cin_g; c++)
                for (int64_t t = 0; t < taps; t++)
                    wk[((grp * g->cout_g + co) * taps + t) * g->cin_g + c] =
                        w[ms_k_conv_w_at(g, grp) + co * k + c * taps + t];
    xl_border(g, &j.ay, &j.ax, &j.ohp, &j.owp);
    j.dp = wk + g->groups * g->cout_g * k, j.cbs = g->cin_g / (2 * DL_VC);
    j.rmax = (g->w + g->sw - 1) / g->sw;
    const int64_t per_image = g->groups * j.cbs * g->h * g->sw * ((j.rmax + FL_P - 1) / FL_P);
    for (j.i0 = 0; j.i0 < g->n; j.i0 = j.i1) {
        j.i1 = j.i0 + chunk < g->n ? j.i0 + chunk : g->n;
        ms_parallel_for((j.i1 - j.i0) * g->groups, 1, xl_prep, &j);
        ms_parallel_for((j.i1 - j.i0) * per_image, 1, xl_range, &j);
    }
}

bool ms_k_conv_direct_dw(const ms_k_conv *g, float *dw, float *wk, const float *dout,
                         const float *x, float *dbias) {
    if (dl_ok(g)) return dl_run(g, dw, wk, dout, x, dbias);
    const int64_t ohw = g->oh * g->ow, chunk = ohw >= DC_POS ? 1 : DC_POS / ohw;
    dw_job j = {.g = g, .dw = dw, .dout = dout, .x = x, .kxc = (g->kw + DC_Q - 1) / DC_Q};
    const int64_t tiles = g->groups * (g->cout_g / DC_R) * g->cin_g * g->kh * j.kxc;
    for (j.i0 = 0; j.i0 < g->n; j.i0 = j.i1) {
        j.i1 = j.i0 + chunk < g->n ? j.i0 + chunk : g->n;
        ms_parallel_for(tiles, 1, dw_range, &j);
    }
    return false;
}

#else /* no AVX-512: conv.c runs its GEMMs */

bool ms_k_conv_direct_ok(const ms_k_conv *g) {
    (void)g;
    return false;
}
bool ms_k_conv_direct_dx_ok(const ms_k_conv *g) {
    (void)g;
    return false;
}
bool ms_k_conv_direct_dw_ok(const ms_k_conv *g) {
    (void)g;
    return false;
}
bool ms_k_conv_direct_forward_ok(const ms_k_conv *g) {
    (void)g;
    return false;
}
int64_t ms_k_conv_direct_scratch_floats(const ms_k_conv *g) {
    (void)g;
    return 0;
}
void ms_k_conv_direct_forward(const ms_k_conv *g, float *out, float *wk, const float *x,
                              const float *w, const float *bias) {
    (void)g, (void)out, (void)wk, (void)x, (void)w, (void)bias;
}
void ms_k_conv_direct_dx(const ms_k_conv *g, float *dx, float *wk, const float *dout,
                         const float *w, bool fresh) {
    (void)g, (void)dx, (void)wk, (void)dout, (void)w, (void)fresh;
}
bool ms_k_conv_direct_dw(const ms_k_conv *g, float *dw, float *wk, const float *dout,
                         const float *x, float *dbias) {
    (void)g, (void)dw, (void)wk, (void)dout, (void)x, (void)dbias;
    return false;
}

#endif
