/* program.h - reading a compiled program: its kernels and its reshards, in step order.
 *
 * What the planner and the tests read instead of the program's internals. A
 * program is a flat list of instructions; two kinds are visible here:
 *
 *   kernels   one operator's local forward or backward, with the placements it runs in,
 *             this rank's local shapes and the op's cost for them
 *   reshards  one value (or gradient) moving between placements, with the reshard plan
 *             the executor runs
 *
 * Both are read by index (0 .. count-1, in step order) into caller-owned views; pointers in
 * a view borrow from the program or its graph and live as long as the program.
 *
 * ms_program_compile_shapes compiles for a mesh coordinate without a rank context or
 * communicators: the same completion, autograd, partition and memory plan as
 * ms_program_compile, but no buffers are allocated and no parameter is initialised. Such a
 * program can be read (this header, ms_program_stats_get, ms_program_explain,
 * ms_program_param with empty data) but not run.
 */
#ifndef MS_PROGRAM_H
#define MS_PROGRAM_H

#include "engine/dist/reshard.h"
#include "engine/graph/graph.h"

/* Where an instruction sits in the step. */
typedef enum ms_program_phase {
    MS_PROG_FORWARD,    /* forward kernels and the reshards around them */
    MS_PROG_LOSS,       /* the loss made replicated, for reporting */
    MS_PROG_BACKWARD,   /* backward kernels, the gradient reshards between them (and ZeRO 3's
                         * gathers of the parameters they read) */
    MS_PROG_GRAD_SYNC,  /* gradients into their placements (dp all-reduce, ZeRO reduce-scatter) */
    MS_PROG_PARAM_SYNC, /* after the optimizer: ZeRO 1 and 2 gather the updated shards */
    MS_PROG_RECOMPUTE,  /* a recompute region's forward kernels and reshards, run again right
                         * before its backward (ms_compile_opts.recompute) */
    MS_PROG_PHASE_COUNT
} ms_program_phase;

/* "forward", "loss", "backward", "grad sync", "param sync", "recompute". */
const char *ms_program_phase_name(ms_program_phase ph);

/* Compiles g for the rank at `coords` of `mesh` (NULL: coordinate 0 in every dim, the rank
 * holding the largest shards) with nothing but shapes. The program copies the mesh and owns
 * its reshard plans; it borrows g, which must outlive it (compilation records the
 * annotations of opts->shard in g, as ms_program_compile does). On failure *out is NULL. */
ms_status ms_program_compile_shapes(ms_graph *g, const ms_mesh *mesh, const int *coords,
                                    const ms_compile_opts *opts, ms_program **out, ms_error *err);

/* One operator's kernel as the step runs it. Placements and shapes are the forward's for
 * both phases: a backward kernel reads the same inputs and its gradients come in the duals. */
typedef struct ms_kernel_info {
    int node;                 /* graph node (ms_graph_op order) */
    const char *name;         /* the node's name */
    int op;                   /* ms_op_kind, or a registered op's id */
    const ms_op_attrs *attrs; /* the node's attributes */
    ms_program_phase phase;   /* MS_PROG_FORWARD, MS_PROG_BACKWARD or MS_PROG_RECOMPUTE */
    int n_in, n_out;
    int in[MS_OP_MAX_IN], out[MS_OP_MAX_OUT]; /* graph values */
    /* inputs as the kernel reads them (after their reshards), outputs as it writes them
     * (before theirs) */
    ms_placements in_pl[MS_OP_MAX_IN], out_pl[MS_OP_MAX_OUT];
    ms_shape in_local[MS_OP_MAX_IN], out_local[MS_OP_MAX_OUT]; /* this rank's shapes */
    bool grad_in[MS_OP_MAX_IN]; /* backward: writes input i's gradient */
    /* backward: writes input i's gradient whole, the program having left it unzeroed (the
     * kernel writes first: ms_op_def.fresh_ok) */
    bool fresh_in[MS_OP_MAX_IN];
    double flops, bytes; /* the op's cost function on these shapes; 0 without one */
} ms_kernel_info;

int ms_program_num_kernels(const ms_program *p);
/* MS_ERR_INVALID when i is out of range. */
ms_status ms_program_kernel(const ms_program *p, int i, ms_kernel_info *out);

/* One reshard as the step runs it. */
typedef struct ms_reshard_info {
    int value;        /* graph value (for gradients, the value whose gradient moves) */
    const char *name; /* its name */
    ms_program_phase phase;
    ms_shape gshape; /* the value's global shape */
    ms_placements from, to;
    const ms_reshard_plan *plan; /* the steps the executor runs, with their bytes */
    double coll_bytes;           /* this rank's collective bytes: the plan's steps summed */
    bool param_gather;           /* ZeRO 3: a parameter gathered for one use (not a gradient) */
    ms_dtype dtype;              /* the elements it moves: MS_BF16 under bf16 precision */
    int bucket; /* the gradient bucket that reduces it, one call for all its members (its plan
                 * says what each member moves); -1: a call of its own */
} ms_reshard_info;

int ms_program_num_reshards(const ms_program *p);

/* ZeRO's placement of pl over mesh dim `dim`: that dim's R becomes S(0), nested innermost; pl
 * itself when the dim does not replicate (nothing to shard) or the tensor is a scalar. */
ms_placements ms_program_zero_pl(const ms_placements *pl, int dim, int tensor_ndim);
/* MS_ERR_INVALID when i is out of range. */
ms_status ms_program_reshard(const ms_program *p, int i, ms_reshard_info *out);

#endif
