/* cuda_testkit.cuh - what the CUDA tests share (C++, compiled by nvcc): random data, the
 * tolerance check that prints its worst element, bf16 conversions through
 * engine/core/tensor.c's rounding, and the finite-difference check of a backward. */
#ifndef MS_TESTS_CUDA_TESTKIT_CUH
#define MS_TESTS_CUDA_TESTKIT_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <vector>

/* engine/core/tensor.h uses C11 atomics, which C++17 cannot include. */
extern "C" uint16_t ms_bf16_from_f32(float f);
extern "C" float ms_f32_from_bf16(uint16_t h);

typedef std::vector<float> fvec;

static uint64_t kit_rng = 1;
static inline double urand(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (kit_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static inline fvec frand(size_t n, double lo, double hi) {
    fvec x(n);
    for (float &v : x) v = (float)(lo + (hi - lo) * urand());
    return x;
}

/* |got - want| <= atol + rtol |want| everywhere; prints the worst element either way. */
static inline bool close(const char *what, const float *got, const float *want, size_t n,
                         double atol, double rtol) {
    double worst = 0, worst_err = 0;
    size_t at = 0;
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - (double)want[i]);
        const double lim = atol + rtol * fabs((double)want[i]);
        const double ratio = lim > 0 ? e / lim : (e > 0 ? INFINITY : 0.0);
        if (!(e <= lim)) ok = false;
        if (!(ratio <= worst)) worst = ratio, worst_err = e, at = i;
    }
    printf("  %-50s n=%-8zu worst |err| %.3g (%.2f of tolerance)%s\n", what, n, worst_err, worst,
           ok ? "" : "  FAIL");
    if (!ok) printf("    at %zu: got %.9g want %.9g\n", at, got[at], want[at]);
    return ok;
}
static inline bool close(const char *what, const fvec &got, const fvec &want, double atol,
                         double rtol) {
    return got.size() == want.size() &&
           close(what, got.data(), want.data(), got.size(), atol, rtol);
}

/* One bf16 ulp of the value: a bf16 result against the fp32 one before rounding. */
static const double BF16_RTOL = 1.0 / 128;

/* x rounded to bf16, as H (uint16_t, or the kernels' ms_bf16: any 2-byte bit pattern). */
template <typename H = uint16_t> static std::vector<H> to_bf16(const fvec &x) {
    static_assert(sizeof(H) == 2, "a bf16 is two bytes");
    std::vector<H> h(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const uint16_t b = ms_bf16_from_f32(x[i]);
        memcpy(&h[i], &b, 2);
    }
    return h;
}

template <typename H> static fvec widen(const std::vector<H> &h) {
    fvec x(h.size());
    for (size_t i = 0; i < h.size(); i++) {
        uint16_t b;
        memcpy(&b, &h[i], 2);
        x[i] = ms_f32_from_bf16(b);
    }
    return x;
}

/* Central differences of a double-summed loss over `samples` random coordinates of x,
 * against the analytic gradient `an` of the same coordinates: |fd - an| <= tol * scale,
 * scale the largest |an| of the tensor. The finite difference of a float function carries
 * roundoff of about eps |L| / h and truncation of order h^2; each tol is a few times the error
 * measured with the kernels as they are (printed), so a term wrong by a percent fails. */
static inline bool fd_check(const char *what, fvec &x, const fvec &an,
                            const std::function<double()> &loss, double h, double tol,
                            int samples) {
    double scale = 1e-30, worst = 0;
    for (float g : an) scale = std::max(scale, (double)fabsf(g));
    bool ok = true;
    for (int s = 0; s < samples; s++) {
        const size_t k = (size_t)(urand() * (double)x.size());
        const float x0 = x[k];
        x[k] = x0 + (float)h;
        const double lp = loss();
        x[k] = x0 - (float)h;
        const double lm = loss();
        x[k] = x0;
        const double fd = (lp - lm) / (2 * h), e = fabs(fd - an[k]) / scale;
        if (!(e <= tol)) {
            ok = false;
            printf("    %s[%zu]: finite difference %.7g, backward %.7g\n", what, k, fd, an[k]);
        }
        worst = std::max(worst, e);
    }
    printf("  %-44s %d samples, worst |fd - grad| / max|grad| %.3g%s\n", what, samples, worst,
           ok ? "" : "  FAIL");
    return ok;
}

static inline double dot_loss(const fvec &w, const fvec &y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); i++) s += (double)w[i] * (double)y[i];
    return s;
}

#endif
