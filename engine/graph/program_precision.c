/* program_precision.c - the compiled program's number formats: which buffers are bf16 under
 * mixed precision, and how kernels written for fp32 run on them.
 *
 * Under bf16 a value is bf16 when it depends on a parameter (the parameters' use copies, the
 * activations and their gradients); values computed from the inputs alone (token ids and
 * anything reshaped from them), integer outputs (indices), the loss, a pipeline chunk's
 * output and kept values stay fp32. A kernel instruction widens its bf16 operands into the
 * program's staging area, runs the fp32 kernel there (so every kernel accumulates in fp32),
 * and rounds what it wrote back once: the bf16 buffers hold exactly what a bf16 kernel with
 * fp32 accumulation would store. The staging area is sized for the largest instruction that
 * stages (below: not those on bf16 kernels of their own) and reused by all.
 *
 * Staging costs two or three extra passes over memory per op, more than an elementwise op
 * itself on a GPU. So an op may declare bf16 kernels on a device (ms_op_def.runs_bf16_on:
 * the optional *_bf16 slots of kernels/backend.h - CUDA's matmul, LayerNorm, attention, GELU,
 * the bias and add ops, dropout, cross-entropy, the embedding; the fenced device has them all
 * to check this path on the host); the instruction then hands it the bf16 buffers as they are.
 * Their contract is this file's: read bf16, compute in fp32 exactly as that device's fp32 kernel
 * does, round each output once (an accumulated gradient: widen, add, round once), which is
 * what staging stores, so the result is bit for bit the same (tests/test_cuda_host_bf16.cu, and the
 * fenced training cases of tests/test_device_fenced.c against the staged CPU run). Saved
 * statistics are not operands and stay fp32. Such instructions need no staging, so on those
 * devices the area shrinks to what the ops still staged need (gpt-bench bf16, batch 8 x 128:
 * 16.0 MiB on the CPU, 8 KiB on the fenced device and CUDA - the loss's mean, as every GPT-2
 * op has bf16 kernels there; the embedding's backward, which staged the table's whole
 * gradient, took 2.5 MiB); a shapes-only program sizes it for the table
 * ms_compile_opts.kernels_like names, so the planner prices a GPU's. */
#include <string.h>

#include "engine/graph/program_impl.h"
#include "engine/kernels/kernels.h"

/* Whether node k's output o holds values no bf16 rounding may touch. */
static bool exact_output(const ms_program *p, int k, int o) {
    const ms_op_def *def = ms_op_get(p->g->n[k].op);
    return def->grad_inputs == 0 || (def->int_outputs >> o & 1);
}

void prog_assign_dtypes(ms_program *p) {
    const ms_graph *g = p->g;
    p->vdtype = xcalloc((size_t)g->nv + 1, sizeof *p->vdtype);
    for (int v = 0; v < g->nv; v++)
        p->vdtype[v] = p->bf16 && g->v[v].kind == GV_PARAM ? MS_BF16 : MS_F32;
    if (!p->bf16) return;
    for (int k = 0; k < g->nn; k++) { /* nodes are in topological order */
        const gnode *nd = &g->n[k];
        bool from_params = false;
        for (int i = 0; i < nd->n_in; i++) from_params |= p->vdtype[nd->in[i]] == MS_BF16;
        for (int o = 0; o < nd->n_out; o++) {
            int v = nd->out[o];
            bool exact = exact_output(p, k, o) || v == g->loss || v == g->output || g->v[v].keep ||
                         g->v[v].assigned;
            p->vdtype[v] = from_params && !exact ? MS_BF16 : MS_F32;
        }
    }
}

ms_dtype prog_value_dtype(const ms_program *p, int v) {
    return (ms_dtype)p->vdtype[v];
}

/* --- one instruction's bf16 operands ------------------------------------------------------- */

typedef struct staged {
    int buf;
    bool read, write;
} staged;

typedef struct stage_set {
    staged s[2 * (MS_OP_MAX_IN + MS_OP_MAX_OUT)];
    int n;
} stage_set;

static void stage_add(const ms_program *p, stage_set *set, int b, bool read, bool write) {
    if (b < 0 || p->bufs[b].dtype != MS_BF16) return;
    for (int i = 0; i < set->n; i++)
        if (set->s[i].buf == b) {
            set->s[i].read |= read;
            set->s[i].write |= write;
            return;
        }
    set->s[set->n++] = (staged){b, read, write};
}

/* A forward reads its inputs and overwrites its outputs; a backward reads everything and
 * accumulates into its input gradients. */
static void stage_collect(const ms_program *p, const instr *in, stage_set *set) {
    const gnode *nd = &p->g->n[in->node];
    bool bwd = in->kind == I_BWD;
    set->n = 0;
    for (int i = 0; i < nd->n_in; i++) stage_add(p, set, in->kb.in[i], true, false);
    for (int o = 0; o < nd->n_out; o++) stage_add(p, set, in->kb.out[o], bwd, !bwd);
    for (int o = 0; bwd && o < MS_OP_MAX_OUT; o++) stage_add(p, set, in->dout_buf[o], true, false);
    for (int i = 0; bwd && i < MS_OP_MAX_IN; i++) stage_add(p, set, in->din_buf[i], true, true);
}

static size_t padded(int64_t floats) {
    return ((size_t)floats + 15) / 16 * 16;
}

/* The call's tensor for buffer b: its fp32 view when staged. */
static void point_at_wide(ms_program *p, ms_tensor **slot, int b) {
    if (b >= 0 && p->bufs[b].dtype == MS_BF16) *slot = &p->bufs[b].wide;
}

/* Whether the instruction hands its bf16 buffers to the op as they are: the op has bf16
 * kernels on this device, and every operand is bf16 and a buffer of its own (the staged path
 * shares one fp32 copy between aliases, which per-operand bf16 kernels cannot) - but for the
 * inputs that take no gradient (token ids, targets), which the op reads as integers in fp32. */
static bool runs_unstaged(const ms_program *p, const instr *in, const ms_op_def *def,
                          const stage_set *set) {
    if (!def->runs_bf16_on || !def->runs_bf16_on(p->bf16_kernels)) return false;
    const gnode *nd = &p->g->n[in->node];
    bool bwd = in->kind == I_BWD;
    int operands = 0;
    for (int i = 0; i < nd->n_in; i++) operands += in->kb.in[i] >= 0 && (def->grad_inputs >> i & 1);
    for (int o = 0; o < nd->n_out; o++) operands += in->kb.out[o] >= 0;
    for (int o = 0; bwd && o < MS_OP_MAX_OUT; o++) operands += in->dout_buf[o] >= 0;
    for (int i = 0; bwd && i < MS_OP_MAX_IN; i++) operands += in->din_buf[i] >= 0;
    return operands == set->n;
}

size_t prog_staging_floats(const ms_program *p) {
    if (!p->bf16) return 0;
    size_t most = 0;
    for (int k = 0; k < p->ni; k++) {
        const instr *in = &p->ins[k];
        size_t need = 0;
        if (in->kind == I_FWD || in->kind == I_BWD) {
            stage_set set;
            stage_collect(p, in, &set);
            /* an instruction on bf16 kernels of its own needs no staging */
            if (set.n > 0 && runs_unstaged(p, in, ms_op_get(p->g->n[in->node].op), &set)) continue;
            for (int i = 0; i < set.n; i++) need += padded(p->bufs[set.s[i].buf].numel);
        }
        if (need > most) most = need;
    }
    return most;
}

ms_status prog_run_kernel(ms_program *p, const instr *in, ms_op_call *call, ms_error *err) {
    const ms_op_def *def = ms_op_get(p->g->n[in->node].op);
    bool fwd = in->kind == I_FWD;
    if (!p->bf16) return fwd ? def->forward(call, err) : def->backward(call, err);
    stage_set set;
    stage_collect(p, in, &set);
    if (set.n > 0 && runs_unstaged(p, in, def, &set))
        return fwd ? def->forward(call, err) : def->backward(call, err);
    size_t off = 0;
    for (int i = 0; i < set.n; i++) {
        buf *b = &p->bufs[set.s[i].buf];
        b->wide.storage->data = p->staging + off;
        off += padded(b->numel);
        if (set.s[i].read)
            MS_CHECK(MS_CALL_K(p->kc, bf16_widen, p->staging + off - padded(b->numel),
                               (const uint16_t *)b->ptr, b->numel, err));
    }
    const gnode *nd = &p->g->n[in->node];
    for (int i = 0; i < nd->n_in; i++) {
        point_at_wide(p, (ms_tensor **)&call->in[i], in->kb.in[i]);
        point_at_wide(p, &call->din[i], in->din_buf[i]);
    }
    for (int o = 0; o < nd->n_out; o++) {
        point_at_wide(p, &call->out[o], in->kb.out[o]);
        point_at_wide(p, (ms_tensor **)&call->dout[o], in->dout_buf[o]);
    }
    ms_status st = fwd ? def->forward(call, err) : def->backward(call, err);
    for (int i = 0; st == MS_OK && i < set.n; i++) {
        buf *b = &p->bufs[set.s[i].buf];
        if (set.s[i].write)
            st = MS_CALL_K(p->kc, bf16_round, (uint16_t *)b->ptr, ms_tensor_f32(&b->wide), b->numel,
                           err);
    }
    return st;
}

double prog_reshard_bytes(const ms_program *p, const instr *in) {
    return in->plan ? ms_reshard_plan_bytes(in->plan, ms_dtype_size(p->bufs[in->src].dtype)) : 0;
}
