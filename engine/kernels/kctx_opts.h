/* kctx_opts.h - what a kernel context is created with (backend.h's ms_kctx_create_with), in a
 * header of its own so that C++ (the CUDA tests) can include it: backend.h, with its C11
 * atomics, cannot be.
 */
#ifndef MS_KCTX_OPTS_H
#define MS_KCTX_OPTS_H

/* How a context runs attention where its table has two ways to (CUDA: a bf16 call that fits
 * the tensor-core flash kernels runs them, the rest the row kernels, whose arithmetic is the
 * CPU kernel's). Chosen when the context is created and fixed for its life; to compare the
 * two, make a context for each. The CPU and fenced tables have one way and ignore it. */
typedef enum ms_kattention {
    MS_KATTENTION_DEFAULT, /* MS_CUDA_ATTENTION, read at creation: "rows" is ROWS, else FASTEST */
    MS_KATTENTION_FASTEST, /* the flash kernels wherever a call fits them and the device has them */
    MS_KATTENTION_ROWS,    /* the row kernels always */
} ms_kattention;

typedef struct ms_kctx_opts {
    ms_kattention attention;
} ms_kctx_opts;

#endif
