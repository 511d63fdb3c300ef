/* op_cases.h - the operator cases every operator test runs: each is an op, its attributes
 * and small global input shapes. test_rules runs them under every input placement against
 * one rank, test_op_grads checks their backward against finite differences. Each family of
 * operators keeps its rows in its own file under tests/op_cases/ (see op_cases.c). */
#ifndef MT_OP_CASES_H
#define MT_OP_CASES_H

#include "engine/core/tensor.h"
#include "engine/ops/op.h"

typedef enum { IN_FLOAT, IN_IDS, IN_TARGETS, IN_POSITIVE } in_kind;

typedef struct op_case {
    const char *name;
    int op;
    ms_op_attrs a;
    int n_in, n_out;
    ms_shape in[3];
    in_kind kind[3];
    int vocab; /* for ids/targets: values in [0, vocab) (targets: one is -1, ignored) */
} op_case;

#define S1(a)                                                                                      \
    {                                                                                              \
        1, {                                                                                       \
            a                                                                                      \
        }                                                                                          \
    }
#define S2(a, b)                                                                                   \
    {                                                                                              \
        2, {                                                                                       \
            a, b                                                                                   \
        }                                                                                          \
    }
#define S3(a, b, c)                                                                                \
    {                                                                                              \
        3, {                                                                                       \
            a, b, c                                                                                \
        }                                                                                          \
    }
#define S4(a, b, c, d)                                                                             \
    {                                                                                              \
        4, {                                                                                       \
            a, b, c, d                                                                             \
        }                                                                                          \
    }

extern const op_case ms_op_cases[];
extern const int ms_n_op_cases;

/* Input i of case c, deterministic: floats uniform in [-1, 1) (IN_POSITIVE: [0.5, 1.5)),
 * ids and targets integer-valued in [0, vocab). */
void mt_op_case_fill(const op_case *c, int i, ms_tensor *t);

/* A call on one rank holding every tensor whole, with the host's kernels: the caller attaches
 * the inputs, outputs, saved buffers and gradients. */
ms_op_call mt_op_call_whole(const ms_op_attrs *a, int n_in, const ms_shape *gin, int n_out,
                            const ms_shape *gout);

#endif
