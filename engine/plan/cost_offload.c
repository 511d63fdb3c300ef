/* cost_offload.c - the planner's price of ZeRO-Offload (the strategy's offload,
 * engine/train/offload.h).
 *
 * Memory: the optimizer shard's Adam moments (8 bytes an element) and its fp32 masters (4,
 * under bf16 the device's only fp32 copy) leave the device for the host. The host holds
 * masters, moments and the staged gradients (4 + 8 + 4 bytes an element; under bf16 2 for the
 * gradients and 2 for the masters' bf16 rounding) and must fit the devices' share of host
 * memory.
 * Time: the device AdamW leaves the step; the gradient shard crosses the device-host link
 * once down and the updated shard once up (fp32, or under bf16 its rounding: 2 bytes; the
 * link's bandwidth, one direction each); the host AdamW streams its 28 bytes an element
 * (gradient, master, m and v read; master, m and v written), under bf16 6 more for the
 * rounding, at the host's memory bandwidth. With the overlap each gradient goes down as
 * soon as backward (its last micro-batch) finished it: the backward hides the copies but for
 * the last layer's share (the first layer's gradients, final last). The host updates of step
 * s then run while step s+1 loads its data and runs its forward, parameter by parameter in the
 * order of first use: the forward hides up to its own length of them, never the first layer's
 * share, which the forward waits for before it can start. Without clipping (no_clip) nothing
 * global stands before an update, so each also starts right after its gradient's copy: what
 * is left of the backward hides them first. The parameters' copies up stay on the critical
 * path (right before their first use).
 *
 * Host figures per device: the cluster's host_* fields; when absent the machine's own memory
 * for cpu-local (the host is the device), else PCIe Gen4 x16 (25 GB/s achieved of 32), 50 GB/s
 * of host memory bandwidth and 256 GB of host memory per device (a DGX A100's 2 TB and two
 * EPYC 7742 sockets over 8 GPUs). See docs/planner.md.
 */
#include "engine/plan/cost.h"
#include "engine/plan/workload.h"

void ms_plan_host_side(const ms_cluster *c, int devices, double *link_bw, double *mem_bw,
                       double *mem_bytes) {
    /* cpu-local: device and host are one memory, shared by the thread ranks */
    double share = c->cpu && devices > 0 ? devices : 1;
    *link_bw = c->host_link_bw > 0 ? c->host_link_bw : c->cpu ? c->mem_bw / share : 25e9;
    *mem_bw = c->host_mem_bw > 0 ? c->host_mem_bw : c->cpu ? c->mem_bw / share : 50e9;
    *mem_bytes = c->host_mem_bytes > 0 ? c->host_mem_bytes : c->cpu ? c->mem_bytes / share : 256e9;
}

/* min(a, b), never below 0 */
static double min_pos(double a, double b) {
    double m = a < b ? a : b;
    return m > 0 ? m : 0;
}

void ms_plan_offload_memory(const ms_strategy *s, ms_plan_workload *w) {
    (void)s; /* no optimizer state stays on the device, bf16's masters included */
    w->mem_optim = 0;
}

void ms_plan_offload_price(const ms_plan_problem *pb, const ms_strategy *s, ms_plan_workload *w,
                           const ms_plan_scales *sc, ms_plan_estimate *out) {
    const ms_cluster *c = pb->cluster;
    bool bf16 = s->precision == MS_PRECISION_BF16;
    double n = w->opt_elems, grad_b = bf16 ? 2 : 4, up_b = bf16 ? 2 : 4;
    double link, host_bw, host_bytes;
    ms_plan_host_side(c, pb->devices, &link, &host_bw, &host_bytes);
    ms_plan_offload_memory(s, w);
    out->mem_host = n * (4 + 8 + grad_b + (bf16 ? 2 : 0));
    out->mem_host_cap = host_bytes * c->usable_memory_fraction;
    /* time: the device's AdamW out (priced as cost.c prices it), the host's in */
    double device_adamw =
        ms_cluster_elementwise_time(c, MS_OPRATE_ADAMW, 12 * n, 28 * n, pb->devices) *
        sc->compute[MS_PC_OPTIMIZER];
    out->offload_copy_s = n * (grad_b + up_b) / link;
    out->offload_host_s = (28 + (bf16 ? 6 : 0)) * n / host_bw * sc->compute[MS_PC_OPTIMIZER];
    /* the forward is about half the backward (one GEMM per weight against two) */
    double forward = w->bwd_mb_s / 2 + c->step_overhead;
    double layers = w->layers_per_stage > 0 ? w->layers_per_stage : 1;
    double down = n * grad_b / link, host = out->offload_host_s, first = host / layers;
    double hidden_down = min_pos(down - down / layers, w->bwd_mb_s);
    double hidden_bwd = pb->no_clip ? min_pos(host - first, w->bwd_mb_s - hidden_down) : 0;
    double hidden_fwd = min_pos(host - first - hidden_bwd, forward);
    out->offload_hidden_s = hidden_down + hidden_bwd + hidden_fwd;
    double exposed = out->offload_copy_s + host - out->offload_hidden_s;
    out->compute_s[MS_PC_OPTIMIZER] += exposed - device_adamw;
    out->step_s += exposed - device_adamw;
}
