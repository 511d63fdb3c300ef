/* cmd_plan.c - `meshscope plan`: the ranked strategies for a model on a cluster.
 *
 *   meshscope plan --model CONFIG --cluster PRESET|FILE --devices N --global-batch B --seq T
 *                  [--dtype bf16|fp32] [--evaluate "tp=8,pp=2,dp=32"] [--top K] [--json]
 *                  [--executable-only] [--recalibrate] [--topology FILE] [--placements auto]
 *
 * A program that brings its own model (meshscope_main_with_model) plans that model: no
 * --model or --seq (its batch is in rows), every strategy priced from its compiled program.
 *
 * The search and the cost model are engine/plan; this file parses flags, resolves the
 * cluster (cpu-local is measured once and cached), and prints a table or JSON. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "engine/model/config.h"
#include "engine/plan/auto_place.h"
#include "engine/plan/cluster.h"
#include "engine/plan/search.h"
#include "job/job.h"

#include "cli/options.h"

/* Bad input: one line naming the problem and the fix; exit status 2. */
static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "meshscope plan: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

static const char *human_s(double s, char *buf, size_t len) {
    if (s >= 1)
        snprintf(buf, len, "%.2f s", s);
    else
        snprintf(buf, len, "%.1f ms", s * 1e3);
    return buf;
}

static const char *human_b(double b, char *buf, size_t len) {
    if (b >= 1e9)
        snprintf(buf, len, "%.1f GB", b / 1e9);
    else
        snprintf(buf, len, "%.1f MB", b / 1e6);
    return buf;
}

/* Every setting under its name, the micro-batching resolved for the batch (the report's form;
 * the control API takes the short form, ms_strategy_short_json). */
static cJSON *strategy_json(const ms_strategy *s, int batch) {
    ms_strategy r = *s;
    int mb = 0, m = 0;
    if (ms_strategy_micro(s, batch, &mb, &m)) r.micro_batch = mb, r.micro_batches = m;
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const ms_setting *st = &ms_settings[i];
        const double v = ms_setting_value(&r, st);
        switch (st->kind) {
            case MS_SET_KIND_BOOL:
                cJSON_AddBoolToObject(o, st->name, v != 0);
                break;
            case MS_SET_KIND_ENUM:
                cJSON_AddStringToObject(o, st->name, st->words[(int)v]);
                break;
            case MS_SET_KIND_LAYERS: {
                cJSON *a = cJSON_AddArrayToObject(o, st->name);
                for (int k = 0; k < MS_STRATEGY_MAX_STAGES && r.pp_layers[k]; k++)
                    cJSON_AddItemToArray(a, cJSON_CreateNumber(r.pp_layers[k]));
                break;
            }
            default:
                cJSON_AddNumberToObject(o, st->name, v);
        }
    }
    return o;
}

static cJSON *estimate_json(const ms_plan_estimate *e, int batch) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "strategy", strategy_json(&e->s, batch));
    cJSON_AddStringToObject(o, "text", e->text);
    cJSON_AddNumberToObject(o, "step_time_s", e->step_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", e->tokens_per_s);
    cJSON_AddNumberToObject(o, "model_tflops_per_device", e->model_tflops_per_device);
    cJSON_AddNumberToObject(o, "hardware_tflops_per_device", e->hw_tflops_per_device);
    cJSON_AddNumberToObject(o, "memory_bytes_per_device", e->mem_total);
    cJSON_AddNumberToObject(o, "memory_cap_bytes", e->mem_cap);
    cJSON_AddBoolToObject(o, "fits", e->fits);
    cJSON_AddBoolToObject(o, "executable", e->executable);
    if (!e->executable) cJSON_AddStringToObject(o, "not_executable", e->not_executable);
    cJSON_AddStringToObject(o, "workload", e->from_engine ? "engine" : "analytic");
    cJSON *b = cJSON_AddObjectToObject(o, "breakdown_s");
    for (int c = 0; c < MS_PC_COUNT; c++)
        cJSON_AddNumberToObject(b, ms_plan_class_name((ms_plan_class)c), e->compute_s[c]);
    for (int d = 0; d < MS_PLAN_DIM_COUNT; d++) {
        char k[32];
        snprintf(k, sizeof k, "%s_comm", ms_plan_dim_name((ms_plan_dim)d));
        cJSON_AddNumberToObject(b, k, e->comm_s[d]);
    }
    cJSON_AddNumberToObject(b, "bubble", e->bubble_s);
    cJSON_AddNumberToObject(b, "overhead", e->overhead_s);
    cJSON *m = cJSON_AddObjectToObject(o, "memory_bytes");
    cJSON_AddNumberToObject(m, "params", e->mem_params);
    cJSON_AddNumberToObject(m, "grads", e->mem_grads);
    cJSON_AddNumberToObject(m, "optimizer", e->mem_optim);
    cJSON_AddNumberToObject(m, "activations", e->mem_act);
    cJSON_AddNumberToObject(m, "other", e->mem_other);
    if (e->s.offload) {
        /* the host side of offload, apart from the device's memory */
        cJSON_AddNumberToObject(m, "host_optimizer", e->mem_host);
        cJSON_AddNumberToObject(m, "host_cap", e->mem_host_cap);
        cJSON_AddNumberToObject(b, "offload_copies", e->offload_copy_s);
        cJSON_AddNumberToObject(b, "offload_host_adamw", e->offload_host_s);
        cJSON_AddNumberToObject(b, "offload_hidden", e->offload_hidden_s);
    }
    return o;
}

/* What `plan` prints: the search's figures and its candidates, as JSON or as a table. */
typedef struct plan_report {
    const char *model;
    const ms_model_config *cfg; /* NULL: a program's own model */
    bool both_precisions;       /* a program's own model, --dtype not given: fp32 and bf16 */
    const ms_cluster *cl;
    ms_plan_dtype dt;
    int devices, batch, seq;
} plan_report;

static cJSON *auto_plan_json(const ms_auto_plan *ap, int batch);

static void print_plan_json(const plan_report *p, const ms_plan_result *res,
                            const ms_auto_plan *ap) {
    const ms_cluster *cl = p->cl;
    const ms_plan_dtype dt = p->dt;
    const int devices = p->devices, batch = p->batch, seq = p->seq;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "search_ms", res->search_ms);
    cJSON_AddNumberToObject(r, "evaluated", (double)res->evaluated);
    cJSON_AddNumberToObject(r, "pruned_memory", (double)res->pruned_memory);
    cJSON_AddStringToObject(r, "cluster", cl->name);
    cJSON_AddStringToObject(r, "dtype", p->both_precisions ? "fp32,bf16" : ms_plan_dtype_name(dt));
    cJSON_AddNumberToObject(r, "devices", devices);
    cJSON_AddNumberToObject(r, "global_batch", batch);
    cJSON_AddNumberToObject(r, "seq", seq);
    cJSON_AddNumberToObject(r, "model_flops_per_step",
                            p->cfg             ? ms_plan_model_flops(p->cfg, batch, seq)
                            : res->n_cands > 0 ? res->cands[0].model_flops
                                               : 0);
    cJSON *a = cJSON_AddArrayToObject(r, "candidates");
    for (int i = 0; i < res->n_cands; i++)
        cJSON_AddItemToArray(a, estimate_json(&res->cands[i], batch));
    cJSON_AddStringToObject(r, "reason", res->reason);
    if (ap) cJSON_AddItemToObject(r, "auto_placements", auto_plan_json(ap, batch));
    char *s = cJSON_Print(r);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(r);
}

static void print_plan_table(const plan_report *p, const ms_plan_result *res) {
    const ms_cluster *cl = p->cl;
    const ms_plan_dtype dt = p->dt;
    const char *model = p->model;
    const int devices = p->devices, batch = p->batch, seq = p->seq;
    if (p->cfg)
        printf("plan: %s on %d x %s (%s), global batch %d x %d tokens, %s\n", model, devices,
               cl->name, cl->device, batch, seq, ms_plan_dtype_name(dt));
    else
        printf("plan: %s on %d x %s (%s), global batch %d rows, priced from its compiled program\n",
               model, devices, cl->name, cl->device, batch);
    printf("searched %ld strategies in %.0f ms; %ld over the memory limit\n\n", res->evaluated,
           res->search_ms, res->pruned_memory);
    printf(" #  %-56s %10s %12s %8s %8s %10s %5s %4s\n", "strategy", "step",
           p->cfg ? "tokens/s" : "rows/s", "TF/s mdl", "TF/s hw", "mem/dev", "fits", "exec");
    for (int i = 0; i < res->n_cands; i++) {
        const ms_plan_estimate *e = &res->cands[i];
        char st[32], mem[32];
        printf("%2d  %-56s %10s %12.0f %8.3g %8.3g %10s %5s %4s\n", i + 1, e->text,
               human_s(e->step_s, st, sizeof st), e->tokens_per_s, e->model_tflops_per_device,
               e->hw_tflops_per_device, human_b(e->mem_total, mem, sizeof mem),
               e->fits ? "yes" : "NO", e->executable ? "yes" : "no");
        if (e->s.offload) {
            char h[32], cp[32], ha[32], hid[32];
            printf(
                "    offload: host %s per device; copies %s, host AdamW %s (%s of both hidden by "
                "the backward and the next forward)\n",
                human_b(e->mem_host, h, sizeof h), human_s(e->offload_copy_s, cp, sizeof cp),
                human_s(e->offload_host_s, ha, sizeof ha),
                human_s(e->offload_hidden_s, hid, sizeof hid));
        }
    }
    printf("\nwhy: %s\n", res->reason);
}

/* --placements auto: the layout searched per tp degree, as JSON. */
static cJSON *auto_plan_json(const ms_auto_plan *ap, int batch) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "search_ms", ap->search_ms);
    cJSON *rows = cJSON_AddArrayToObject(o, "tp_degrees");
    for (int i = 0; i < ap->n; i++) {
        const ms_auto_plan_row *r = &ap->rows[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "tp", r->s.tp);
        cJSON_AddItemToObject(j, "strategy", strategy_json(&r->s, batch));
        cJSON_AddStringToObject(j, "text", r->hand.text);
        cJSON_AddNumberToObject(j, "own_layout_step_s", r->hand.step_s);
        cJSON_AddNumberToObject(j, "own_layout_memory_bytes_per_device", r->hand.mem_total);
        cJSON_AddBoolToObject(j, "own_layout_fits", r->hand.fits);
        cJSON_AddNumberToObject(j, "own_layout_collective_bytes",
                                ms_plan_estimate_coll_bytes(&r->hand));
        if (r->have_auto) {
            char *rules = malloc(16384);
            ms_auto_place_rules_str(&r->layout.rules, rules, 16384);
            cJSON_AddItemToObject(j, "placements", cJSON_Parse(rules));
            free(rules);
            cJSON_AddNumberToObject(j, "searched_step_s", r->layout.best.step_s);
            cJSON_AddNumberToObject(j, "searched_collective_bytes", r->layout.coll_bytes);
            cJSON_AddNumberToObject(j, "searched_memory_bytes_per_device",
                                    r->layout.best.mem_total);
            cJSON_AddNumberToObject(j, "layouts_priced", r->layout.compiles);
            cJSON_AddNumberToObject(j, "layout_search_ms", r->layout.search_ms);
        } else {
            cJSON_AddStringToObject(j, "error", r->why);
            cJSON_AddNumberToObject(j, "layouts_priced", r->layout.compiles);
            cJSON_AddNumberToObject(j, "layout_search_ms", r->layout.search_ms);
        }
        cJSON_AddItemToArray(rows, j);
    }
    cJSON_AddNumberToObject(o, "best_tp", ap->rows[ap->best].s.tp);
    cJSON_AddStringToObject(o, "best_layout", ap->best_is_auto ? "searched" : "own");
    return o;
}

static void print_auto_plan(const ms_auto_plan *ap) {
    printf("\nautomatic placements, searched with the mesh: each tp degree's best strategy above, "
           "its layout searched;\nboth layouts priced from compiled programs\n");
    printf(" tp  %-52s %10s %10s %22s %s\n", "strategy", "own", "searched", "collectives/dev/step",
           "search");
    for (int i = 0; i < ap->n; i++) {
        const ms_auto_plan_row *r = &ap->rows[i];
        char a[40], b[32], c[32], d[32];
        if (r->hand.step_s > 0) {
            human_s(r->hand.step_s, a, sizeof a);
            if (!r->hand.fits) strcat(a, "*"); /* over the device's memory */
        }
        if (!r->have_auto) {
            printf("%3d  %-52s %10s %10s  %s\n", r->s.tp, r->hand.text,
                   r->hand.step_s > 0 ? a : "-", r->s.tp > 1 ? "none" : "-", r->why);
            continue;
        }
        char bytes[80];
        snprintf(bytes, sizeof bytes, "%s -> %s",
                 human_b(ms_plan_estimate_coll_bytes(&r->hand), c, sizeof c),
                 human_b(r->layout.coll_bytes, d, sizeof d));
        printf("%3d  %-52s %10s %10s %22s %d layouts, %.0f ms\n", r->s.tp, r->hand.text, a,
               human_s(r->layout.best.step_s, b, sizeof b), bytes, r->layout.compiles,
               r->layout.search_ms);
    }
    for (int i = 0; i < ap->n; i++)
        if (!ap->rows[i].hand.fits) {
            printf("* over the device's memory, priced from its compiled program\n");
            break;
        }
    const ms_auto_plan_row *w = &ap->rows[ap->best];
    char st[32];
    if (ap->best_is_auto) {
        char *rules = malloc(16384);
        ms_auto_place_rules_str(&w->layout.rules, rules, 16384);
        printf("best: %s with the searched layout, %s per step: %s\n", w->hand.text,
               human_s(w->layout.best.step_s, st, sizeof st), rules);
        free(rules);
    } else {
        printf("best: %s with its own layout, %s per step\n", w->hand.text,
               human_s(w->hand.step_s, st, sizeof st));
    }
    printf("searched %d tp degree%s in %.0f ms\n", ap->tp_searched, ap->tp_searched == 1 ? "" : "s",
           ap->search_ms);
}

/* --cluster (and --topology) into cl, checked against --devices; 0 or bad()'s code. */
static int plan_cluster(const char *cluster, bool recal, const char *topology, int devices,
                        ms_cluster *cl) {
    ms_error err = {0};
    if (ms_cluster_resolve(cluster, recal, stderr, cl, &err) != MS_OK) return bad("%s", err.msg);
    if (topology && ms_cluster_load_topology(topology, cl, &err) != MS_OK)
        return bad("--topology: %s", err.msg);
    long capacity = cl->nodes > 0 ? (long)cl->nodes * cl->devices_per_node : 0;
    if (capacity > 0 && devices > capacity)
        return bad("--devices %d is more than %s has: %ld (%d nodes x %d); use fewer devices or a "
                   "cluster file with more nodes",
                   devices, cl->name, capacity, cl->nodes, cl->devices_per_node);
    return 0;
}

/* The report, with (auto_placements) the layout searched per tp degree; 0 or bad()'s code. */
static int report(const plan_report *rep, const ms_plan_problem *pb, const ms_plan_result *res,
                  bool auto_placements, const ms_plan_fixed *fixed, bool json) {
    ms_auto_plan *ap = NULL;
    if (auto_placements) {
        ms_error err = {0};
        ap = malloc(sizeof *ap);
        if (!ap || ms_plan_auto_joint(pb, fixed, NULL, ap, &err) != MS_OK) {
            free(ap);
            return bad("--placements auto: %s", ap ? err.msg : "out of memory");
        }
    }
    if (json)
        print_plan_json(rep, res, ap);
    else
        print_plan_table(rep, res);
    if (ap && !json) print_auto_plan(ap);
    free(ap);
    return 0;
}

int ms_cmd_plan(int argc, char **argv) {
    const char *model = NULL, *cluster = NULL, *evaluate = NULL, *topology = NULL;
    int devices = 0, batch = 0, seq = 0, top = 5, dtype = -1, placements = -1; /* -1: not given */
    bool json = false, recal = false, exe_only = false;
    static const char *const dtype_names[] = {"bf16", "fp32", NULL};
    static const char *const placement_words[] = {"auto", NULL};
    const ms_option opts[] = {
        MS_TEXT("model", "CONFIG", &model,
                "the model's config JSON (required, unless the program brings its own model)"),
        MS_TEXT("cluster", "C", &cluster,
                "cpu-local (measured, cached), gpu-local (this machine's GPUs), dgx-a100-80gb, "
                "h100, h200 or a cluster JSON file"),
        MS_INT("devices", "N", &devices, 1, 1 << 20, "devices or thread ranks (required)"),
        MS_INT("global-batch", "B", &batch, 1, 1 << 24, "sequences per step (required)"),
        MS_INT("seq", "T", &seq, 1, 1 << 24,
               "tokens per sequence (required for --model; a program's own model counts rows)"),
        MS_ENUM("dtype", &dtype, dtype_names,
                "number format (default bf16 on GPUs, fp32 on cpu-local)"),
        MS_TEXT("evaluate", "K=V,..", &evaluate,
                "fix settings by name, search the rest: dp, tp, pp, cp, sp, zero, recompute, "
                "micro_batches, head_replicated, bucket_mb, offload, ... (docs/configs.md)"),
        MS_INT("top", "K", &top, 1, 1000, "how many strategies to show (default 5)"),
        MS_FLAG("executable-only", &exe_only, "only strategies this engine runs"),
        MS_FLAG("json", &json, "JSON instead of a table"),
        MS_FLAG("recalibrate", &recal, "measure cpu-local again"),
        MS_TEXT("topology", "FILE", &topology,
                "hosts, ranks per host, rank order and links (tests/cluster/netns.sh writes one)"),
        MS_ENUM("placements", &placements, placement_words,
                "auto: also search each tp degree's layout (which tensors split, and how) with "
                "its best strategy, priced from compiled programs"),
    };
    const ms_opts_cmd cmd = {
        .name = "plan",
        .synopsis = "--model CONFIG --cluster PRESET|FILE --devices N --global-batch B --seq T "
                    "[options]",
        .about = "Ranks parallel strategies (dp x tp x pp x cp, sp, ZeRO 0-3, recompute, "
                 "micro-batches)\nby predicted step time, with memory per device and throughput. "
                 "--evaluate \"tp=8,pp=2,dp=32\"\nfixes some settings, each by its name "
                 "(docs/configs.md lists them: micro_batches, head_replicated, bucket_mb, ...).",
        MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, NULL, 0, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    rc = 0;
    const ms_model_def *own = job_model();
    if (own && model)
        return bad("this program brings its own model (%s); --model is for the meshscope "
                   "binary's configs",
                   own->name);
    if (!own && !model) return bad("--model CONFIG.json is required");
    if (!cluster)
        return bad("--cluster is required: cpu-local, gpu-local, dgx-a100-80gb, h100, h200 or a "
                   "JSON file");
    if (!devices) return bad("--devices N is required (how many devices or thread ranks)");
    if (!batch) return bad("--global-batch B is required (sequences per step)");
    if (own) seq = 1; /* its rows are the unit */
    if (!seq) return bad("--seq T is required (tokens per sequence)");
    ms_error err = {0};
    ms_model_config cfg = {0};
    if (!own && ms_config_load(model, &cfg, &err) != MS_OK) return bad("%s", err.msg);
    if (!own && seq > cfg.n_positions)
        return bad("--seq %d exceeds the model's n_positions %d; use a shorter sequence", seq,
                   cfg.n_positions);
    ms_plan_fixed fixed;
    if (evaluate && ms_plan_fixed_parse(evaluate, &fixed, &err) != MS_OK) return bad("%s", err.msg);
    ms_cluster *cl = calloc(1, sizeof *cl);
    if (!cl) return bad("out of memory");
    ms_plan_result res = {0};
    ms_plan_memo *memo = NULL;
    if ((rc = plan_cluster(cluster, recal, topology, devices, cl)) != 0) goto out;
    ms_plan_dtype dt = cl->cpu ? MS_PLAN_FP32 : MS_PLAN_BF16;
    if (dtype >= 0 && ms_plan_dtype_parse(dtype_names[dtype], &dt, &err) != MS_OK) {
        rc = bad("--dtype: %s", err.msg);
        goto out;
    }
    memo = ms_plan_memo_create();
    ms_plan_problem pb = {.model = cfg,
                          .devices = devices,
                          .global_batch = batch,
                          .seq = seq,
                          .dtype = dt,
                          .cluster = cl,
                          .engine_workloads = cl->cpu,
                          .memo = memo,
                          .def = own};
    if (own && dtype >= 0) { /* a program's own model: both precisions searched unless given */
        if (!evaluate) ms_plan_fixed_none(&fixed);
        fixed.s.precision = dt == MS_PLAN_BF16 ? MS_PRECISION_BF16 : MS_PRECISION_FP32;
        fixed.mask |= 1u << MS_SET_precision;
    }
    ms_plan_search_opts so = {.fixed = evaluate || (own && dtype >= 0) ? &fixed : NULL,
                              .keep = top,
                              .executable_only = exe_only};
    if (ms_plan_search(&pb, &so, &res, &err) != MS_OK) {
        rc = bad("%s", err.msg);
        goto out;
    }
    plan_report rep = {.model = own ? own->name : model,
                       .cfg = own ? NULL : &cfg,
                       .both_precisions = own && dtype < 0,
                       .cl = cl,
                       .dt = dt,
                       .devices = devices,
                       .batch = batch,
                       .seq = seq};
    rc = report(&rep, &pb, &res, placements == 0, evaluate ? &fixed : NULL, json);
out:
    ms_plan_result_free(&res);
    ms_plan_memo_destroy(memo);
    free(cl);
    return rc;
}
