/* metrics.c - a snapshot as Prometheus text (exposition format 0.0.4): one # HELP and one
 * # TYPE line per metric, then its samples; label values escaped (\\ \" \n); a final newline.
 * Every metric is a gauge: window figures describe the last analysed steps, not a running
 * total. The names are listed in docs/api.md ("Metrics").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "web/web_internal.h"

static void header(ms_strbuf *b, const char *name, const char *help) {
    ms_strbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

static void value(ms_strbuf *b, double v) {
    if (isnan(v))
        ms_strbuf_put(b, " NaN\n", 5);
    else if (isinf(v))
        ms_strbuf_printf(b, " %sInf\n", v > 0 ? "+" : "-");
    else
        ms_strbuf_printf(b, " %.17g\n", v);
}

/* name{k1="v1",k2="v2"} value; labels: NULL-terminated key, value pairs. */
static void sample(ms_strbuf *b, const char *name, double v, const char *const *labels) {
    ms_strbuf_put(b, name, strlen(name));
    if (labels && labels[0]) {
        ms_strbuf_put(b, "{", 1);
        for (int i = 0; labels[i]; i += 2) {
            ms_strbuf_printf(b, "%s%s=\"", i ? "," : "", labels[i]);
            for (const char *p = labels[i + 1]; *p; p++) {
                if (*p == '\\')
                    ms_strbuf_put(b, "\\\\", 2);
                else if (*p == '"')
                    ms_strbuf_put(b, "\\\"", 2);
                else if (*p == '\n')
                    ms_strbuf_put(b, "\\n", 2);
                else
                    ms_strbuf_put(b, p, 1);
            }
            ms_strbuf_put(b, "\"", 1);
        }
        ms_strbuf_put(b, "}", 1);
    }
    value(b, v);
}

static double sum(const double *v, size_t n) {
    double s = 0;
    for (size_t i = 0; v && i < n; i++) s += v[i];
    return s;
}

/* A gauge per rank read from an array of structs: a double, or a uint64_t when u64. */
static void per_rank_as(ms_strbuf *b, const char *name, const char *help, int n, const void *base,
                        size_t stride, size_t off, bool u64) {
    header(b, name, help);
    for (int r = 0; r < n; r++) {
        char rk[16];
        snprintf(rk, sizeof rk, "%d", r);
        const char *lab[] = {"rank", rk, NULL};
        const char *at = (const char *)base + (size_t)r * stride + off;
        double v;
        uint64_t x;
        if (u64)
            memcpy(&x, at, sizeof x), v = (double)x;
        else
            memcpy(&v, at, sizeof v);
        sample(b, name, v, lab);
    }
}

static void per_rank(ms_strbuf *b, const char *name, const char *help, int n, const void *base,
                     size_t stride, size_t off) {
    per_rank_as(b, name, help, n, base, stride, off, false);
}

/* The job, its latest step and the achieved FLOP rate. */
static void job_metrics(ms_strbuf *b, const ms_snapshot *s) {
    const ms_live_step *last = s->n_history > 0 ? &s->history[s->n_history - 1] : NULL;
    header(b, "meshscope_info", "The job this dashboard describes (always 1).");
    {
        const char *lab[] = {"model",    s->info.model, "backend", s->info.backend,
                             "strategy", s->strategy,   NULL};
        sample(b, "meshscope_info", 1, lab);
    }
    header(b, "meshscope_snapshot_version", "Version of the snapshot these figures come from.");
    sample(b, "meshscope_snapshot_version", (double)s->version, NULL);
    header(b, "meshscope_live", "1 while training runs live, 0 for a trace file.");
    sample(b, "meshscope_live", s->info.live, NULL);
    header(b, "meshscope_finished", "1 once the job has ended.");
    sample(b, "meshscope_finished", s->finished, NULL);
    header(b, "meshscope_ranks", "Ranks in the job.");
    sample(b, "meshscope_ranks", s->info.nranks, NULL);
    header(b, "meshscope_step", "Latest completed training step (-1 before the first).");
    sample(b, "meshscope_step", (double)s->step, NULL);
    if (last) {
        header(b, "meshscope_step_seconds", "Wall time of the latest step on rank 0.");
        sample(b, "meshscope_step_seconds", last->step_s, NULL);
        header(b, "meshscope_tokens_per_second", "Global tokens per second of the latest step.");
        sample(b, "meshscope_tokens_per_second", last->tokens_per_s, NULL);
        header(b, "meshscope_loss", "Training loss of the latest step.");
        sample(b, "meshscope_loss", last->loss, NULL);
        header(b, "meshscope_learning_rate", "Learning rate of the latest step.");
        sample(b, "meshscope_learning_rate", last->lr, NULL);
        header(b, "meshscope_grad_norm", "Gradient norm of the latest step.");
        sample(b, "meshscope_grad_norm", last->grad_norm, NULL);
    }
    header(b, "meshscope_achieved_flops_per_second",
           "Operator FLOPs of the last analysed step over all ranks, per second of its wall time.");
    sample(b, "meshscope_achieved_flops_per_second", s->achieved_flops_per_s, NULL);
}

/* The analysed window and the bytes and time its heatmaps sum. */
static void window_metrics(ms_strbuf *b, const ms_analysis *a) {
    const size_t cells = (size_t)a->nranks * a->nranks;
    header(b, "meshscope_window_first_step", "First step of the analysed window.");
    sample(b, "meshscope_window_first_step", (double)a->step_lo, NULL);
    header(b, "meshscope_window_last_step", "Last step of the analysed window.");
    sample(b, "meshscope_window_last_step", (double)a->step_hi, NULL);
    header(b, "meshscope_comm_bytes",
           "Bytes sent between ranks over the window: the sum of the heatmap, for all "
           "traffic (mesh_dim=\"all\") and per mesh dim.");
    {
        const char *lab[] = {"mesh_dim", "all", NULL};
        sample(b, "meshscope_comm_bytes", sum(a->all.bytes, cells), lab);
    }
    for (int d = 0; d < a->n_dims; d++) {
        const char *lab[] = {"mesh_dim", a->dim_names[d], NULL};
        sample(b, "meshscope_comm_bytes", sum(a->per_dim[d].bytes, cells), lab);
    }
    header(b, "meshscope_comm_peer_seconds",
           "Collective time summed over rank pairs over the window (the time heatmap's "
           "sum), for all traffic and per mesh dim.");
    {
        const char *lab[] = {"mesh_dim", "all", NULL};
        sample(b, "meshscope_comm_peer_seconds", sum(a->all.seconds, cells), lab);
    }
    for (int d = 0; d < a->n_dims; d++) {
        const char *lab[] = {"mesh_dim", a->dim_names[d], NULL};
        sample(b, "meshscope_comm_peer_seconds", sum(a->per_dim[d].seconds, cells), lab);
    }
}

/* One sample per collective kind, mesh dim, group size and message size, for each of the
 * four figures. */
static void collective_metrics(ms_strbuf *b, const ms_analysis *a) {

    static const struct {
        const char *name, *help;
    } m[4] = {
        {"meshscope_collective_bytes",
         "Bytes of the collectives of one kind, mesh dim, group size and message size "
         "over the window, summed over ranks (nccl-tests size convention)."},
        {"meshscope_collective_calls", "Collective calls over the window, over ranks."},
        {"meshscope_collective_mean_seconds", "Mean duration of one such collective."},
        {"meshscope_collective_busbw_bytes_per_second",
         "Bus bandwidth of the collective (nccl-tests factors), bytes per second."},
    };
    for (int k = 0; k < 4; k++) {
        header(b, m[k].name, m[k].help);
        for (int i = 0; i < a->n_busbw; i++) {
            const ms_busbw_row *x = &a->busbw[i];
            char gs[16], mb[24];
            snprintf(gs, sizeof gs, "%d", x->group_size);
            snprintf(mb, sizeof mb, "%llu", (unsigned long long)x->bytes);
            const char *coll =
                x->coll < MS_COLL_KIND_COUNT ? ms_coll_name((ms_coll_kind)x->coll) : "unknown";
            const char *dim =
                x->mesh_dim >= 0 && x->mesh_dim < a->n_dims ? a->dim_names[x->mesh_dim] : "world";
            const char *lab[] = {"collective",    coll, "mesh_dim", dim, "group_size", gs,
                                 "message_bytes", mb,   NULL};
            double v = k == 0   ? (double)x->bytes * x->count
                       : k == 1 ? x->count
                       : k == 2 ? x->mean_s
                                : x->busbw_gbs * 1e9; /* GB/s (10^9) to base units */
            sample(b, m[k].name, v, lab);
        }
    }
}

/* Compute, communication and their overlap per rank. */
static void overlap_metrics(ms_strbuf *b, const ms_analysis *a) {
    const size_t st = sizeof(ms_rank_overlap);
    per_rank(b, "meshscope_overlap_ratio",
             "Share of communication time overlapped by compute (HTA definition).", a->nranks,
             a->overlap, st, offsetof(ms_rank_overlap, overlap_ratio));
    per_rank(b, "meshscope_comm_seconds", "Communication time over the window.", a->nranks,
             a->overlap, st, offsetof(ms_rank_overlap, comm_s));
    per_rank(b, "meshscope_compute_seconds", "Compute time over the window.", a->nranks, a->overlap,
             st, offsetof(ms_rank_overlap, compute_s));
    per_rank(b, "meshscope_exposed_comm_seconds",
             "Communication time not overlapped by compute over the window.", a->nranks, a->overlap,
             st, offsetof(ms_rank_overlap, exposed_comm_s));
}

/* Device memory per rank, the training state by kind, and offload's host memory. */
static void memory_metrics(ms_strbuf *b, const ms_snapshot *s) {
    const int n = s->info.nranks;
    per_rank_as(b, "meshscope_memory_in_use_bytes", "Device memory in use on the rank.", n, s->mem,
                sizeof *s->mem, offsetof(ms_live_mem, in_use), true);
    per_rank_as(b, "meshscope_memory_peak_bytes", "Peak device memory on the rank.", n, s->mem,
                sizeof *s->mem, offsetof(ms_live_mem, peak), true);
    header(b, "meshscope_memory_state_bytes",
           "What the training state holds on the rank, by kind.");
    for (int r = 0; r < n; r++) {
        const ms_live_mem *m = &s->mem[r];
        const char *kinds[4] = {"params", "grads", "optimizer", "activations"};
        const double v[4] = {(double)m->params, (double)m->grads, (double)m->optim,
                             (double)m->acts};
        char rk[16];
        snprintf(rk, sizeof rk, "%d", r);
        for (int k = 0; k < 4; k++) {
            const char *lab[] = {"rank", rk, "kind", kinds[k], NULL};
            sample(b, "meshscope_memory_state_bytes", v[k], lab);
        }
    }
    per_rank_as(b, "meshscope_memory_host_optimizer_bytes",
                "Offload: the optimizer's host memory on the rank (masters, moments, staged "
                "gradients), apart from the device's.",
                n, s->mem, sizeof *s->mem, offsetof(ms_live_mem, host_optim), true);
}

char *ms_web_metrics_text(const ms_snapshot *s, size_t *len) {
    ms_strbuf b = {0};
    const ms_analysis *a = &s->analysis;
    job_metrics(&b, s);
    if (a->nranks > 0) {
        window_metrics(&b, a);
        if (a->n_busbw > 0) collective_metrics(&b, a);
        overlap_metrics(&b, a);
    }
    if (s->mem && s->info.nranks > 0) memory_metrics(&b, s);
    header(&b, "meshscope_suggestions", "Strategy suggestions by state.");
    for (int k = 0; k < MS_SUGG_STATE_COUNT; k++) {
        int n = 0;
        for (int i = 0; i < s->n_suggestions; i++) n += s->suggestions[i].state == k;
        const char *lab[] = {"state", ms_suggestion_state_name((ms_suggestion_state)k), NULL};
        sample(&b, "meshscope_suggestions", n, lab);
    }
    *len = b.len;
    return b.p;
}
