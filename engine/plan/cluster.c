/* cluster.c - cluster descriptions: JSON in and out, presets, the rate and collective models.
 * The cpu-local measurement lives in calibrate.c, its cache (key, quiet check) in
 * calib_cache.c. */
#include "engine/plan/cluster.h"
#include "engine/plan/calib_cache.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/core/device.h"
#include "engine/core/xalloc.h"
#include "engine/io/fileio.h"
#include "engine/io/json_text.h"

#ifndef MS_CLUSTER_DIR
#define MS_CLUSTER_DIR "configs/clusters"
#endif

#define CLUSTER_MAX_BYTES (1u << 20)

const char *ms_plan_dtype_name(ms_plan_dtype d) {
    return d == MS_PLAN_BF16 ? "bf16" : "fp32";
}

ms_status ms_plan_dtype_parse(const char *text, ms_plan_dtype *out, ms_error *err) {
    if (text && !strcmp(text, "fp32")) {
        *out = MS_PLAN_FP32;
        return MS_OK;
    }
    if (text && !strcmp(text, "bf16")) {
        *out = MS_PLAN_BF16;
        return MS_OK;
    }
    return ms_fail(err, MS_ERR_INVALID, "unknown dtype '%s'; use bf16 or fp32", text ? text : "");
}

static const char *const oprate_names[MS_OPRATE_COUNT] = {
    "stream",    "layernorm", "gelu",  "bias",  "softmax", "cross_entropy",
    "embedding", "dropout",   "adamw", "sumsq", "memset"};

const char *ms_oprate_name(ms_oprate r) {
    return r < MS_OPRATE_COUNT ? oprate_names[r] : "?";
}

/* in_step's keys, by class (cluster.h) */
static const char *const in_step_names[MS_CLUSTER_IN_STEP] = {"gemm", "attention", "other"};

static const char *const algo_names[] = {"auto", "ring", "tree", "direct"};
static const char *const order_names[] = {"by-host", "round-robin"};

/* --- JSON in ------------------------------------------------------------------------------- */

typedef struct jctx {
    const char *name;
    ms_error *err;
} jctx;

/* A number at obj.key (path names obj for messages); absent -> def (or an error when
 * required). Must lie in [lo, hi]. */
static ms_status jnum(jctx *j, const cJSON *obj, const char *path, const char *key, bool required,
                      double lo, double hi, double def, double *out) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return ms_fail(j->err, MS_ERR_INVALID, "%s: missing required key %s.%s", j->name, path,
                           key);
        *out = def;
        return MS_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi) {
        char got[64];
        ms_json_describe(v, got, sizeof got);
        return ms_fail(j->err, MS_ERR_INVALID, "%s: %s.%s: expected a number in [%g, %g], got %s",
                       j->name, path, key, lo, hi, got);
    }
    *out = v->valuedouble;
    return MS_OK;
}

static ms_status jstr(jctx *j, const cJSON *obj, const char *path, const char *key, char *out,
                      size_t cap, const char *def) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v || cJSON_IsNull(v)) {
        snprintf(out, cap, "%s", def);
        return MS_OK;
    }
    if (!cJSON_IsString(v))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: %s.%s: expected a string", j->name, path, key);
    snprintf(out, cap, "%s", v->valuestring);
    return MS_OK;
}

static ms_status jbool(jctx *j, const cJSON *obj, const char *path, const char *key, bool def,
                       bool *out) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return MS_OK;
    }
    if (!cJSON_IsBool(v))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: %s.%s: expected true or false", j->name, path,
                       key);
    *out = cJSON_IsTrue(v);
    return MS_OK;
}

static ms_status jlink(jctx *j, const cJSON *root, const char *key, bool required, ms_link *out) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, key);
    char path[48];
    snprintf(path, sizeof path, "$.%s", key);
    if (!o && required)
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: missing required key $.%s (an object {\"bw_gbps\": ..., "
                       "\"latency_us\": ..., \"efficiency\": ...})",
                       j->name, key);
    if (o && !cJSON_IsObject(o))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: %s: expected an object", j->name, path);
    double bw, lat, eff;
    MS_CHECK(jnum(j, o, path, "bw_gbps", required, 1e-6, 1e6, 10, &bw));
    MS_CHECK(jnum(j, o, path, "latency_us", false, 0, 1e6, 5, &lat));
    MS_CHECK(jnum(j, o, path, "efficiency", false, 0.01, 1, 0.8, &eff));
    *out = (ms_link){.bw = bw * 1e9, .latency = lat * 1e-6, .efficiency = eff};
    return MS_OK;
}

static ms_status jorder(jctx *j, const cJSON *obj, ms_rank_order *out) {
    char text[16];
    MS_CHECK(jstr(j, obj, "$", "rank_order", text, sizeof text, order_names[MS_RANKS_BY_HOST]));
    for (int k = 0; k < 2; k++)
        if (!strcmp(text, order_names[k])) {
            *out = (ms_rank_order)k;
            return MS_OK;
        }
    return ms_fail(j->err, MS_ERR_INVALID,
                   "%s: $.rank_order: '%s' is not one of by-host, round-robin", j->name, text);
}

/* "in_step": {"gemm": [[bytes, factor], [bytes, factor]], ...}: two points, ascending bytes */
static ms_status in_step_points(jctx *j, const cJSON *f, int k, ms_in_step *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(f, in_step_names[k]);
    if (!a) return MS_OK;
    bool ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *pt = cJSON_GetArrayItem(a, i);
        ok = cJSON_IsArray(pt) && cJSON_GetArraySize(pt) == 2 &&
             cJSON_IsNumber(cJSON_GetArrayItem(pt, 0)) && cJSON_IsNumber(cJSON_GetArrayItem(pt, 1));
        if (!ok) break;
        out->bytes[i] = cJSON_GetArrayItem(pt, 0)->valuedouble;
        out->factor[i] = cJSON_GetArrayItem(pt, 1)->valuedouble;
        ok = out->bytes[i] > 0 && out->factor[i] >= 0.1 && out->factor[i] <= 10;
    }
    if (!ok || out->bytes[0] > out->bytes[1]) {
        memset(out, 0, sizeof *out);
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: $.in_step.%s: expected [[bytes, factor], [bytes, factor]] with "
                       "bytes > 0 ascending and factors from 0.1 to 10",
                       j->name, in_step_names[k]);
    }
    return MS_OK;
}

static ms_status parse_measurements(jctx *j, const cJSON *root, ms_cluster *c) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "gemm_table");
    if (g && !cJSON_IsArray(g))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $.gemm_table: expected an array", j->name);
    for (const cJSON *e = g ? g->child : NULL; e && c->n_gemm < MS_CLUSTER_MAX_GEMM; e = e->next) {
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 4)
            return ms_fail(j->err, MS_ERR_INVALID,
                           "%s: $.gemm_table[%d]: expected [m, n, k, gflops]", j->name, c->n_gemm);
        double v[4];
        for (int i = 0; i < 4; i++) {
            const cJSON *x = cJSON_GetArrayItem(e, i);
            v[i] = cJSON_IsNumber(x) ? x->valuedouble : -1;
            if (!(v[i] > 0))
                return ms_fail(j->err, MS_ERR_INVALID,
                               "%s: $.gemm_table[%d][%d]: expected a positive number", j->name,
                               c->n_gemm, i);
        }
        c->gemm[c->n_gemm++] =
            (ms_gemm_point){(int64_t)v[0], (int64_t)v[1], (int64_t)v[2], v[3] * 1e9};
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "attention_table");
    if (a && !cJSON_IsArray(a))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $.attention_table: expected an array", j->name);
    for (const cJSON *e = a ? a->child : NULL; e && c->n_attn < MS_CLUSTER_MAX_ATTN; e = e->next) {
        double v[4];
        bool ok = cJSON_IsArray(e) && cJSON_GetArraySize(e) == 4;
        for (int i = 0; ok && i < 4; i++) {
            const cJSON *x = cJSON_GetArrayItem(e, i);
            v[i] = cJSON_IsNumber(x) ? x->valuedouble : -1;
            ok = v[i] > 0;
        }
        if (!ok)
            return ms_fail(j->err, MS_ERR_INVALID,
                           "%s: $.attention_table[%d]: expected [t, hs, fwd_us, bwd_us] with "
                           "positive numbers",
                           j->name, c->n_attn);
        c->attn[c->n_attn++] =
            (ms_attn_point){(int64_t)v[0], (int64_t)v[1], v[2] * 1e-6, v[3] * 1e-6};
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "op_rates_gbps");
    if (r && !cJSON_IsObject(r))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $.op_rates_gbps: expected an object", j->name);
    for (int k = 0; r && k < MS_OPRATE_COUNT; k++) {
        double v;
        MS_CHECK(jnum(j, r, "$.op_rates_gbps", oprate_names[k], false, 1e-6, 1e6, 0, &v));
        c->oprate[k] = v * 1e9;
    }
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(root, "collectives");
    if (cl && !cJSON_IsArray(cl))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $.collectives: expected an array", j->name);
    for (const cJSON *e = cl ? cl->child : NULL; e && c->n_coll < MS_CLUSTER_MAX_COLL;
         e = e->next) {
        char path[48], kind[32];
        snprintf(path, sizeof path, "$.collectives[%d]", c->n_coll);
        if (!cJSON_IsObject(e))
            return ms_fail(j->err, MS_ERR_INVALID, "%s: %s: expected an object", j->name, path);
        double ranks, group, alpha, bw;
        MS_CHECK(jnum(j, e, path, "ranks", true, 1, 4096, 0, &ranks));
        MS_CHECK(jnum(j, e, path, "group", true, 1, 4096, 0, &group));
        MS_CHECK(jstr(j, e, path, "kind", kind, sizeof kind, ""));
        MS_CHECK(jnum(j, e, path, "alpha_us", true, 0, 1e9, 0, &alpha));
        MS_CHECK(jnum(j, e, path, "busbw_gbps", true, 1e-9, 1e6, 0, &bw));
        ms_coll_point pt = {0};
        int kk = -1;
        for (int q = 0; q < MS_COLL_KIND_COUNT; q++)
            if (!strcmp(kind, ms_coll_name((ms_coll_kind)q))) kk = q;
        if (kk < 0)
            return ms_fail(j->err, MS_ERR_INVALID,
                           "%s: %s.kind: unknown collective '%s' (all_reduce, all_gather, "
                           "reduce_scatter, all_to_all)",
                           j->name, path, kind);
        pt.ranks = (int)ranks;
        pt.group = (int)group;
        pt.kind = (uint8_t)kk;
        pt.alpha = alpha * 1e-6;
        pt.busbw = bw * 1e9;
        c->coll[c->n_coll++] = pt;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "in_step");
    if (f && !cJSON_IsObject(f))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $.in_step: expected an object", j->name);
    for (int k = 0; f && k < MS_CLUSTER_IN_STEP; k++)
        MS_CHECK(in_step_points(j, f, k, &c->in_step[k]));
    const cJSON *sy = cJSON_GetObjectItemCaseSensitive(root, "sync");
    if (sy && !cJSON_IsArray(sy))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $.sync: expected an array", j->name);
    for (const cJSON *e = sy ? sy->child : NULL; e && c->n_sync < MS_CLUSTER_MAX_SYNC;
         e = e->next) {
        char path[48];
        snprintf(path, sizeof path, "$.sync[%d]", c->n_sync);
        double ranks, call, phase, byte;
        MS_CHECK(jnum(j, e, path, "ranks", true, 1, 4096, 0, &ranks));
        MS_CHECK(jnum(j, e, path, "per_call_us", true, 0, 1e9, 0, &call));
        MS_CHECK(jnum(j, e, path, "per_byte_ns", false, 0, 1e9, 0, &byte));
        MS_CHECK(jnum(j, e, path, "per_phase_us", true, 0, 1e9, 0, &phase));
        double compute;
        MS_CHECK(jnum(j, e, path, "compute", false, 0.1, 10, 1, &compute));
        c->sync[c->n_sync++] = (ms_sync_point){.ranks = (int)ranks,
                                               .per_call = call * 1e-6,
                                               .per_byte = byte * 1e-9,
                                               .per_phase = phase * 1e-6,
                                               .compute = compute};
    }
    return MS_OK;
}

/* "gemm_tiles": [[rows, cols], ...], the output tiles cuBLAS's tensor-core kernels pick
 * among; [[256, 128], [128, 128]] by default. */
static ms_status gemm_tiles(jctx *j, const cJSON *root, ms_cluster *c) {
    static const int def[2][2] = {{256, 128}, {128, 128}};
    c->n_gemm_tiles = 2;
    memcpy(c->gemm_tiles, def, sizeof def);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "gemm_tiles");
    if (!t) return MS_OK;
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : 0;
    bool ok = n >= 1 && n <= MS_CLUSTER_MAX_TILES;
    for (int i = 0; ok && i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(t, i);
        const cJSON *a = cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 ? e->child : NULL;
        const cJSON *b = a ? a->next : NULL;
        ok = a && cJSON_IsNumber(a) && cJSON_IsNumber(b) && a->valuedouble >= 1 &&
             b->valuedouble >= 1 && a->valuedouble <= 4096 && b->valuedouble <= 4096;
        if (ok)
            c->gemm_tiles[i][0] = (int)a->valuedouble, c->gemm_tiles[i][1] = (int)b->valuedouble;
    }
    if (!ok)
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: $.gemm_tiles: expected 1 to %d tiles [rows, cols], each side in "
                       "1..4096, such as [[256, 128], [128, 128]]",
                       j->name, MS_CLUSTER_MAX_TILES);
    c->n_gemm_tiles = n;
    return MS_OK;
}

static ms_status parse_root(jctx *j, const cJSON *root, ms_cluster *c) {
    if (!cJSON_IsObject(root))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $: expected an object", j->name);
    double v;
    MS_CHECK(jstr(j, root, "$", "name", c->name, sizeof c->name, j->name));
    MS_CHECK(jstr(j, root, "$", "device", c->device, sizeof c->device, ""));
    MS_CHECK(jstr(j, root, "$", "backend", c->backend, sizeof c->backend, "nccl"));
    MS_CHECK(jbool(j, root, "$", "cpu", false, &c->cpu));
    MS_CHECK(jnum(j, root, "$", "devices_per_node", true, 1, 1 << 20, 0, &v));
    c->devices_per_node = (int)v;
    MS_CHECK(jnum(j, root, "$", "nodes", false, 0, 1 << 20, 0, &v));
    c->nodes = (int)v;
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(root, "peak_tflops");
    if (!cJSON_IsObject(pk))
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: $.peak_tflops: expected an object {\"fp32\": ..., \"bf16\": ...}",
                       j->name);
    const cJSON *ge = cJSON_GetObjectItemCaseSensitive(root, "gemm_efficiency");
    for (int d = 0; d < MS_PLAN_DTYPE_COUNT; d++) {
        const char *dn = ms_plan_dtype_name((ms_plan_dtype)d);
        MS_CHECK(jnum(j, pk, "$.peak_tflops", dn, true, 1e-6, 1e6, 0, &v));
        c->peak_flops[d] = v * 1e12;
        MS_CHECK(jnum(j, ge, "$.gemm_efficiency", dn, false, 0.01, 1, 0.7, &v));
        c->gemm_efficiency[d] = v;
    }
    MS_CHECK(jnum(j, root, "$", "gemm_half_dim", false, 0, 1e6, 0, &c->gemm_half_dim));
    MS_CHECK(jnum(j, root, "$", "sms", false, 0, 1 << 20, 0, &v));
    c->sms = (int)v;
    MS_CHECK(gemm_tiles(j, root, c));
    const cJSON *sb = cJSON_GetObjectItemCaseSensitive(root, "attention_score_bytes");
    if (sb && !cJSON_IsObject(sb))
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: $.attention_score_bytes: expected an object {\"forward\": ..., "
                       "\"backward\": ...}",
                       j->name);
    MS_CHECK(
        jnum(j, sb, "$.attention_score_bytes", "forward", false, 0, 1e3, 0, &c->score_bytes[0]));
    MS_CHECK(
        jnum(j, sb, "$.attention_score_bytes", "backward", false, 0, 1e3, 0, &c->score_bytes[1]));
    MS_CHECK(jnum(j, root, "$", "vector_tflops", false, 1e-6, 1e6, c->peak_flops[0] / 1e12, &v));
    c->vector_flops = v * 1e12;
    MS_CHECK(jnum(j, root, "$", "memory_gb", true, 1e-6, 1e9, 0, &v));
    c->mem_bytes = v * 1e9;
    MS_CHECK(jnum(j, root, "$", "usable_memory_fraction", false, 0.05, 1, 0.9,
                  &c->usable_memory_fraction));
    MS_CHECK(jnum(j, root, "$", "memory_bw_gbps", true, 1e-6, 1e6, 0, &v));
    c->mem_bw = v * 1e9;
    MS_CHECK(jnum(j, root, "$", "memory_efficiency", false, 0.01, 1, 0.8, &c->mem_efficiency));
    MS_CHECK(jnum(j, root, "$", "host_link_gbps", false, 0, 1e6, 0, &v));
    c->host_link_bw = v * 1e9;
    MS_CHECK(jnum(j, root, "$", "host_memory_bw_gbps", false, 0, 1e6, 0, &v));
    c->host_mem_bw = v * 1e9;
    MS_CHECK(jnum(j, root, "$", "host_memory_gb", false, 0, 1e9, 0, &v));
    c->host_mem_bytes = v * 1e9;
    MS_CHECK(jnum(j, root, "$", "kernel_overhead_us", false, 0, 1e6, 0, &v));
    c->kernel_overhead = v * 1e-6;
    MS_CHECK(jnum(j, root, "$", "step_overhead_ms", false, 0, 1e9, 0, &v));
    c->step_overhead = v * 1e-3;
    MS_CHECK(jlink(j, root, "intra_node", !c->cpu, &c->intra));
    MS_CHECK(jlink(j, root, "inter_node", !c->cpu, &c->inter));
    MS_CHECK(jorder(j, root, &c->rank_order));
    char algo[16];
    MS_CHECK(jstr(j, root, "$", "collective_algorithm", algo, sizeof algo, "auto"));
    int a = -1;
    for (int k = 0; k < 4; k++)
        if (!strcmp(algo, algo_names[k])) a = k;
    if (a < 0)
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: $.collective_algorithm: '%s' is not one of auto, ring, tree, direct",
                       j->name, algo);
    c->algo = (ms_coll_algo)a;
    MS_CHECK(jnum(j, root, "$", "dp_overlap", false, 0, 1, 0, &c->dp_overlap));
    MS_CHECK(jbool(j, root, "$", "flash_attention", false, &c->flash_attention));
    MS_CHECK(jbool(j, root, "$", "causal_skip", false, &c->causal_skip));
    MS_CHECK(
        jbool(j, root, "$", "zero3_recompute_regathers", false, &c->zero3_recompute_regathers));
    MS_CHECK(jnum(j, root, "$", "cores", false, 0, 1 << 20, 0, &v));
    c->cores = (int)v;
    if (c->cpu && c->cores < 1)
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: $.cores: a cpu cluster needs its core count (a positive integer)",
                       j->name);
    MS_CHECK(jstr(j, root, "$", "cpu_model", c->cpu_model, sizeof c->cpu_model, ""));
    MS_CHECK(jstr(j, root, "$", "calibrated_at", c->calibrated_at, sizeof c->calibrated_at, ""));
    MS_CHECK(jstr(j, root, "$", "calibration", c->calibration, sizeof c->calibration, ""));
    MS_CHECK(
        jstr(j, root, "$", "calibration_key", c->calibration_key, sizeof c->calibration_key, ""));
    MS_CHECK(jnum(j, root, "$", "busy_cores_before", false, 0, 1 << 20, -1, &c->busy_before));
    MS_CHECK(jnum(j, root, "$", "busy_cores_after", false, 0, 1 << 20, -1, &c->busy_after));
    MS_CHECK(jnum(j, root, "$", "busy_limit_cores", false, 0, 1 << 20, -1, &c->busy_limit));
    MS_CHECK(jnum(j, root, "$", "blas_speedup_2", false, 0.1, 10, 1, &c->blas_speedup_2));
    MS_CHECK(jstr(j, root, "$", "notes", c->notes, sizeof c->notes, ""));
    return parse_measurements(j, root, c);
}

typedef ms_status (*json_parser)(jctx *j, const cJSON *root, ms_cluster *c);

/* Parses json into a copy of *c; *c changes only when everything parsed. */
static ms_status parse_into(const char *json, size_t len, const char *name, json_parser parse,
                            ms_cluster *c, ms_error *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return ms_fail(err, MS_ERR_INVALID, "%s: malformed JSON near byte %zu", name,
                       end ? (size_t)(end - json) : 0);
    ms_cluster *next = xmalloc(sizeof *next);
    *next = *c;
    jctx j = {.name = name, .err = err};
    ms_status st = parse(&j, root, next);
    cJSON_Delete(root);
    if (st == MS_OK) *c = *next;
    free(next);
    return st;
}

static ms_status load_into(const char *path, json_parser parse, ms_cluster *c, ms_error *err) {
    uint8_t *buf;
    size_t len;
    MS_CHECK(ms_read_file(path, CLUSTER_MAX_BYTES, &buf, &len, err));
    const char *base = strrchr(path, '/');
    ms_status st = parse_into((const char *)buf, len, base ? base + 1 : path, parse, c, err);
    free(buf);
    return st;
}

ms_status ms_cluster_from_json(const char *json, size_t len, const char *name, ms_cluster *out,
                               ms_error *err) {
    ms_cluster *c = xcalloc(1, sizeof *c);
    ms_status st = parse_into(json, len, name, parse_root, c, err);
    if (st == MS_OK) *out = *c;
    free(c);
    return st;
}

ms_status ms_cluster_load(const char *path, ms_cluster *out, ms_error *err) {
    ms_cluster *c = xcalloc(1, sizeof *c);
    ms_status st = load_into(path, parse_root, c, err);
    if (st == MS_OK) *out = *c;
    free(c);
    return st;
}

static ms_status parse_topology(jctx *j, const cJSON *root, ms_cluster *c) {
    if (!cJSON_IsObject(root))
        return ms_fail(j->err, MS_ERR_INVALID, "%s: $: expected an object", j->name);
    double hosts, per_host;
    MS_CHECK(jnum(j, root, "$", "hosts", true, 1, 1 << 20, 0, &hosts));
    MS_CHECK(jnum(j, root, "$", "ranks_per_host", true, 1, 1 << 20, 0, &per_host));
    MS_CHECK(jorder(j, root, &c->rank_order));
    if (!cJSON_GetObjectItemCaseSensitive(root, "inter_node"))
        return ms_fail(j->err, MS_ERR_INVALID,
                       "%s: missing required key $.inter_node (the link between hosts: "
                       "{\"bw_gbps\": ..., \"latency_us\": ...})",
                       j->name);
    MS_CHECK(jlink(j, root, "inter_node", true, &c->inter));
    if (cJSON_GetObjectItemCaseSensitive(root, "intra_node"))
        MS_CHECK(jlink(j, root, "intra_node", true, &c->intra));
    c->nodes = (int)hosts;
    c->devices_per_node = (int)per_host;
    return MS_OK;
}

ms_status ms_cluster_apply_topology(ms_cluster *c, const char *json, size_t len, const char *name,
                                    ms_error *err) {
    return parse_into(json, len, name, parse_topology, c, err);
}

ms_status ms_cluster_load_topology(const char *path, ms_cluster *c, ms_error *err) {
    return load_into(path, parse_topology, c, err);
}

/* --- JSON out ------------------------------------------------------------------------------ */

static void jlink_out(cJSON *root, const char *key, const ms_link *l) {
    cJSON *o = cJSON_AddObjectToObject(root, key);
    cJSON_AddNumberToObject(o, "bw_gbps", l->bw / 1e9);
    cJSON_AddNumberToObject(o, "latency_us", l->latency * 1e6);
    cJSON_AddNumberToObject(o, "efficiency", l->efficiency);
}

char *ms_cluster_to_json(const ms_cluster *c) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "name", c->name);
    cJSON_AddStringToObject(r, "device", c->device);
    cJSON_AddStringToObject(r, "backend", c->backend);
    cJSON_AddBoolToObject(r, "cpu", c->cpu);
    cJSON_AddNumberToObject(r, "devices_per_node", c->devices_per_node);
    cJSON_AddNumberToObject(r, "nodes", c->nodes);
    cJSON *pk = cJSON_AddObjectToObject(r, "peak_tflops");
    cJSON *ge = cJSON_AddObjectToObject(r, "gemm_efficiency");
    for (int d = 0; d < MS_PLAN_DTYPE_COUNT; d++) {
        cJSON_AddNumberToObject(pk, ms_plan_dtype_name((ms_plan_dtype)d), c->peak_flops[d] / 1e12);
        cJSON_AddNumberToObject(ge, ms_plan_dtype_name((ms_plan_dtype)d), c->gemm_efficiency[d]);
    }
    cJSON_AddNumberToObject(r, "gemm_half_dim", c->gemm_half_dim);
    if (c->score_bytes[0] > 0 || c->score_bytes[1] > 0) {
        cJSON *o = cJSON_AddObjectToObject(r, "attention_score_bytes");
        cJSON_AddNumberToObject(o, "forward", c->score_bytes[0]);
        cJSON_AddNumberToObject(o, "backward", c->score_bytes[1]);
    }
    if (c->sms > 0) {
        cJSON_AddNumberToObject(r, "sms", c->sms);
        cJSON *tiles = cJSON_AddArrayToObject(r, "gemm_tiles");
        for (int i = 0; i < c->n_gemm_tiles; i++)
            cJSON_AddItemToArray(tiles, cJSON_CreateIntArray(c->gemm_tiles[i], 2));
    }
    cJSON_AddNumberToObject(r, "vector_tflops", c->vector_flops / 1e12);
    cJSON_AddNumberToObject(r, "memory_gb", c->mem_bytes / 1e9);
    cJSON_AddNumberToObject(r, "usable_memory_fraction", c->usable_memory_fraction);
    cJSON_AddNumberToObject(r, "memory_bw_gbps", c->mem_bw / 1e9);
    cJSON_AddNumberToObject(r, "memory_efficiency", c->mem_efficiency);
    if (c->host_link_bw > 0) cJSON_AddNumberToObject(r, "host_link_gbps", c->host_link_bw / 1e9);
    if (c->host_mem_bw > 0) cJSON_AddNumberToObject(r, "host_memory_bw_gbps", c->host_mem_bw / 1e9);
    if (c->host_mem_bytes > 0)
        cJSON_AddNumberToObject(r, "host_memory_gb", c->host_mem_bytes / 1e9);
    cJSON_AddNumberToObject(r, "kernel_overhead_us", c->kernel_overhead * 1e6);
    cJSON_AddNumberToObject(r, "step_overhead_ms", c->step_overhead * 1e3);
    if (c->intra.bw > 0) jlink_out(r, "intra_node", &c->intra);
    if (c->inter.bw > 0) jlink_out(r, "inter_node", &c->inter);
    cJSON_AddStringToObject(r, "collective_algorithm", algo_names[c->algo]);
    cJSON_AddStringToObject(r, "rank_order", order_names[c->rank_order]);
    cJSON_AddNumberToObject(r, "dp_overlap", c->dp_overlap);
    cJSON_AddBoolToObject(r, "flash_attention", c->flash_attention);
    cJSON_AddBoolToObject(r, "causal_skip", c->causal_skip);
    if (c->zero3_recompute_regathers) cJSON_AddBoolToObject(r, "zero3_recompute_regathers", true);
    if (c->cpu) {
        cJSON_AddNumberToObject(r, "cores", c->cores);
        cJSON_AddStringToObject(r, "cpu_model", c->cpu_model);
        cJSON_AddStringToObject(r, "calibrated_at", c->calibrated_at);
        cJSON_AddStringToObject(r, "calibration", c->calibration);
        if (c->calibration_key[0])
            cJSON_AddStringToObject(r, "calibration_key", c->calibration_key);
        if (c->busy_before >= 0) cJSON_AddNumberToObject(r, "busy_cores_before", c->busy_before);
        if (c->busy_after >= 0) cJSON_AddNumberToObject(r, "busy_cores_after", c->busy_after);
        if (c->busy_limit >= 0) cJSON_AddNumberToObject(r, "busy_limit_cores", c->busy_limit);
        cJSON_AddNumberToObject(r, "blas_speedup_2", c->blas_speedup_2);
    }
    if (c->n_gemm) {
        cJSON *g = cJSON_AddArrayToObject(r, "gemm_table");
        for (int i = 0; i < c->n_gemm; i++) {
            const double v[4] = {(double)c->gemm[i].m, (double)c->gemm[i].n, (double)c->gemm[i].k,
                                 c->gemm[i].flops_per_s / 1e9};
            cJSON_AddItemToArray(g, cJSON_CreateDoubleArray(v, 4));
        }
    }
    if (c->n_attn) {
        cJSON *a = cJSON_AddArrayToObject(r, "attention_table");
        for (int i = 0; i < c->n_attn; i++) {
            const double v[4] = {(double)c->attn[i].t, (double)c->attn[i].hs,
                                 c->attn[i].fwd_s * 1e6, c->attn[i].bwd_s * 1e6};
            cJSON_AddItemToArray(a, cJSON_CreateDoubleArray(v, 4));
        }
    }
    bool any = false;
    for (int k = 0; k < MS_OPRATE_COUNT; k++) any |= c->oprate[k] > 0;
    if (any) {
        cJSON *o = cJSON_AddObjectToObject(r, "op_rates_gbps");
        for (int k = 0; k < MS_OPRATE_COUNT; k++)
            if (c->oprate[k] > 0) cJSON_AddNumberToObject(o, oprate_names[k], c->oprate[k] / 1e9);
    }
    if (c->n_coll) {
        cJSON *l = cJSON_AddArrayToObject(r, "collectives");
        for (int i = 0; i < c->n_coll; i++) {
            const ms_coll_point *p = &c->coll[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "ranks", p->ranks);
            cJSON_AddNumberToObject(e, "group", p->group);
            cJSON_AddStringToObject(e, "kind", ms_coll_name((ms_coll_kind)p->kind));
            cJSON_AddNumberToObject(e, "alpha_us", p->alpha * 1e6);
            cJSON_AddNumberToObject(e, "busbw_gbps", p->busbw / 1e9);
            cJSON_AddItemToArray(l, e);
        }
    }
    if (c->in_step[0].factor[0] > 0) {
        cJSON *o = cJSON_AddObjectToObject(r, "in_step");
        for (int k = 0; k < MS_CLUSTER_IN_STEP; k++) {
            cJSON *pts = cJSON_AddArrayToObject(o, in_step_names[k]);
            for (int i = 0; i < 2; i++) {
                const double v[2] = {c->in_step[k].bytes[i], c->in_step[k].factor[i]};
                cJSON_AddItemToArray(pts, cJSON_CreateDoubleArray(v, 2));
            }
        }
    }
    if (c->n_sync) {
        cJSON *l = cJSON_AddArrayToObject(r, "sync");
        for (int i = 0; i < c->n_sync; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "ranks", c->sync[i].ranks);
            cJSON_AddNumberToObject(e, "per_call_us", c->sync[i].per_call * 1e6);
            cJSON_AddNumberToObject(e, "per_byte_ns", c->sync[i].per_byte * 1e9);
            cJSON_AddNumberToObject(e, "per_phase_us", c->sync[i].per_phase * 1e6);
            if (c->sync[i].compute > 0) cJSON_AddNumberToObject(e, "compute", c->sync[i].compute);
            cJSON_AddItemToArray(l, e);
        }
    }
    if (c->notes[0]) cJSON_AddStringToObject(r, "notes", c->notes);
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}

/* --- presets ------------------------------------------------------------------------------- */

const char *ms_cluster_preset_dir(void) {
    return MS_CLUSTER_DIR;
}

ms_status ms_cluster_resolve(const char *what, bool recalibrate, void *log, ms_cluster *out,
                             ms_error *err) {
    if (!what || !*what)
        return ms_fail(
            err, MS_ERR_INVALID,
            "--cluster is required: cpu-local, gpu-local, dgx-a100-80gb, h100, h200 or a JSON "
            "file");
    if (!strcmp(what, "cpu-local")) return ms_calib_resolve(recalibrate, log, out, err);
    if (!strcmp(what, "gpu-local")) {
        char name[256], note[320];
        double mem = 0;
        if (!ms_device_cuda_describe(0, name, sizeof name, &mem))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "gpu-local: no usable CUDA device here; name a preset (h200, h100, "
                           "dgx-a100-80gb) or a cluster JSON file");
        MS_CHECK(
            ms_cluster_for_gpu(name, mem, ms_device_cuda_count(), out, note, sizeof note, err));
        snprintf(out->name, sizeof out->name, "gpu-local");
        if (log && note[0]) fprintf(log, "gpu-local: %s\n", note);
        return MS_OK;
    }
    if (strchr(what, '/') || strstr(what, ".json")) return ms_cluster_load(what, out, err);
    char path[600];
    snprintf(path, sizeof path, "%s/%s.json", ms_cluster_preset_dir(), what);
    if (access(path, R_OK) != 0) {
        /* Relative to the working directory too (a source checkout). */
        snprintf(path, sizeof path, "configs/clusters/%s.json", what);
        if (access(path, R_OK) != 0)
            return ms_fail(
                err, MS_ERR_INVALID,
                "unknown cluster '%s'; use cpu-local, gpu-local, dgx-a100-80gb, h100, h200 (files "
                "in %s) or the path of a cluster JSON file",
                what, ms_cluster_preset_dir());
    }
    return ms_cluster_load(path, out, err);
}

/* A preset device's model token: its second word up to the first '-' ("NVIDIA H200-SXM-141GB
 * (HGX H200)" -> "H200"). */
static void model_token(const char *device, char *out, size_t len) {
    const char *w = strchr(device, ' ');
    w = w ? w + 1 : device;
    size_t n = strcspn(w, "- (");
    snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), w);
}

ms_status ms_cluster_for_gpu(const char *gpu_name, double mem_bytes, int gpus, ms_cluster *out,
                             char *note, size_t note_len, ms_error *err) {
    static const char *const presets[] = {"h200", "h100", "dgx-a100-80gb"};
    if (note_len) note[0] = '\0';
    bool found = false;
    for (size_t i = 0; i < sizeof presets / sizeof *presets && !found; i++) {
        MS_CHECK(ms_cluster_resolve(presets[i], false, NULL, out, err));
        char token[32];
        model_token(out->device, token, sizeof token);
        found = token[0] && strstr(gpu_name, token);
    }
    if (!found) {
        MS_CHECK(ms_cluster_resolve("h100", false, NULL, out, err));
        if (note_len)
            snprintf(note, note_len,
                     "no cluster preset describes '%s'; the advisor prices it at the h100 "
                     "preset's rates with its own %.0f GB",
                     gpu_name, mem_bytes / 1e9);
    }
    snprintf(out->device, sizeof out->device, "%s", gpu_name);
    out->mem_bytes = mem_bytes;
    out->devices_per_node = gpus > 0 ? gpus : 1;
    out->nodes = 1;
    return MS_OK;
}

/* --- rates --------------------------------------------------------------------------------------
 */

double ms_cluster_share(const ms_cluster *c, int ranks) {
    if (!c->cpu || c->cores < 1 || ranks <= c->cores) return 1.0;
    return (double)ranks / c->cores;
}

/* Thread ranks below the core count get cores / ranks BLAS threads (cli/session.c). */
static double blas_boost(const ms_cluster *c, int ranks) {
    if (!c->cpu || ranks < 1 || c->cores / ranks < 2) return 1.0;
    return c->blas_speedup_2 > 0 ? c->blas_speedup_2 : 1.0;
}

/* The sorted distinct values of one coordinate of the GEMM grid. */
static int grid_values(const ms_cluster *c, int which, int64_t *vals) {
    int n = 0;
    for (int i = 0; i < c->n_gemm; i++) {
        int64_t v = which == 0 ? c->gemm[i].m : which == 1 ? c->gemm[i].n : c->gemm[i].k;
        bool seen = false;
        for (int j = 0; j < n; j++) seen |= vals[j] == v;
        if (!seen && n < 16) vals[n++] = v;
    }
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && vals[b - 1] > vals[b]; b--) {
            int64_t t = vals[b];
            vals[b] = vals[b - 1];
            vals[b - 1] = t;
        }
    return n;
}

/* Bracketing grid values of x and the log-space weight of the upper one. */
static void bracket(const int64_t *vals, int n, double x, int *lo, int *hi, double *w) {
    if (x <= (double)vals[0] || n == 1) {
        *lo = *hi = 0;
        *w = 0;
        return;
    }
    if (x >= (double)vals[n - 1]) {
        *lo = *hi = n - 1;
        *w = 0;
        return;
    }
    int i = 0;
    while (i + 1 < n && (double)vals[i + 1] < x) i++;
    *lo = i;
    *hi = i + 1;
    *w = (log(x) - log((double)vals[i])) / (log((double)vals[i + 1]) - log((double)vals[i]));
}

static double gemm_rate_at(const ms_cluster *c, int64_t m, int64_t n, int64_t k) {
    double best = 0, bestd = 1e300;
    for (int i = 0; i < c->n_gemm; i++) {
        const ms_gemm_point *p = &c->gemm[i];
        if (p->m == m && p->n == n && p->k == k) return p->flops_per_s;
        double d =
            fabs(log((double)p->m / m)) + fabs(log((double)p->n / n)) + fabs(log((double)p->k / k));
        if (d < bestd) bestd = d, best = p->flops_per_s;
    }
    return best;
}

static double gemm_rate_cpu(const ms_cluster *c, int64_t m, int64_t n, int64_t k) {
    int64_t gv[3][16];
    int gn[3];
    for (int w = 0; w < 3; w++) gn[w] = grid_values(c, w, gv[w]);
    const double x[3] = {(double)m, (double)n, (double)k};
    int lo[3], hi[3];
    double wt[3];
    for (int w = 0; w < 3; w++) bracket(gv[w], gn[w], x[w], &lo[w], &hi[w], &wt[w]);
    double r = 0;
    for (int corner = 0; corner < 8; corner++) {
        double f = 1;
        int64_t at[3];
        for (int w = 0; w < 3; w++) {
            bool up = corner >> w & 1;
            at[w] = gv[w][up ? hi[w] : lo[w]];
            f *= up ? wt[w] : 1 - wt[w];
        }
        if (f > 0) r += f * gemm_rate_at(c, at[0], at[1], at[2]);
    }
    return r;
}

/* The share of the waves' SM slots a GEMM's work fills: units / (waves x sms), the best over
 * the tiles, either way round (cuBLAS picks its tile per shape; each is taken to run at the
 * same rate). The units are the output tiles; an output of fewer tiles than SMs has its
 * reduction split (split-K, as cuBLAS does for a small output over a long k). 1 without a
 * wave model. */
static double wave_share(const ms_cluster *c, int64_t m, int64_t n, int64_t k) {
    if (c->sms <= 0) return 1;
    double best = 0;
    for (int o = 0; o < 2 * c->n_gemm_tiles; o++) {
        const int *t = c->gemm_tiles[o / 2];
        int64_t tm = t[o % 2], tn = t[1 - o % 2];
        int64_t tiles = ((m + tm - 1) / tm) * ((n + tn - 1) / tn);
        int64_t split = 1;
        if (tiles < c->sms) { /* split-K fills the idle SMs, each part at least 256 deep */
            split = c->sms / tiles;
            if (split > k / 256) split = k / 256 > 1 ? k / 256 : 1;
        }
        int64_t units = tiles * split, waves = (units + c->sms - 1) / c->sms;
        double share = (double)units / (double)(waves * c->sms);
        if (share > best) best = share;
    }
    return best;
}

double ms_cluster_gemm_time(const ms_cluster *c, ms_plan_dtype dt, int64_t m, int64_t n, int64_t k,
                            int ranks) {
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    double flops = 2.0 * (double)m * (double)n * (double)k;
    if (c->cpu && c->n_gemm > 0) {
        double r = gemm_rate_cpu(c, m, n, k) * blas_boost(c, ranks);
        return flops / r * ms_cluster_share(c, ranks) + c->kernel_overhead;
    }
    double d = c->gemm_half_dim;
    double eff = c->gemm_efficiency[dt] / (1 + d / (double)m + d / (double)n + d / (double)k);
    eff *= wave_share(c, m, n, k);
    return flops / (c->peak_flops[dt] * eff) + c->kernel_overhead;
}

double ms_cluster_attention_time(const ms_cluster *c, int64_t bh, int64_t t, int64_t hs,
                                 bool backward, int ranks) {
    if (bh <= 0 || t <= 0) return 0;
    if (!c->n_attn) {
        /* No measurement: two (four backward) causal GEMMs per head at GEMM rates. */
        double pairs = (double)t * (double)(t + 1) / 2;
        double flops = (double)bh * pairs * (backward ? 8 : 4) * (double)hs;
        double per = ms_cluster_gemm_time(c, MS_PLAN_FP32, t, t / 2 + 1, hs, ranks);
        double gf = 2.0 * (double)t * (double)(t / 2 + 1) * (double)hs;
        return per / gf * flops;
    }
    /* Interpolate log(time per head) over log(t) and log(hs), from the nearest points. */
    double lt = log((double)t), lh = log((double)hs);
    double num = 0, den = 0;
    for (int i = 0; i < c->n_attn; i++) {
        const ms_attn_point *p = &c->attn[i];
        double dt = lt - log((double)p->t), dh = lh - log((double)p->hs);
        double d2 = dt * dt + dh * dh;
        double v = backward ? p->bwd_s : p->fwd_s;
        /* time ~ t^2 hs: move the point to (t, hs) along that law, then weight by distance */
        double est = v * ((double)t / p->t) * ((double)t / p->t) * ((double)hs / p->hs);
        if (d2 < 1e-12) {
            num = est;
            den = 1;
            break;
        }
        double wgt = 1 / (d2 * d2);
        num += wgt * est;
        den += wgt;
    }
    return (double)bh * num / den * ms_cluster_share(c, ranks);
}

double ms_cluster_elementwise_time(const ms_cluster *c, ms_oprate cls, double flops, double bytes,
                                   int ranks) {
    if (c->cpu) {
        double r = cls < MS_OPRATE_COUNT && c->oprate[cls] > 0 ? c->oprate[cls]
                   : c->oprate[MS_OPRATE_STREAM] > 0           ? c->oprate[MS_OPRATE_STREAM]
                                                               : c->mem_bw * c->mem_efficiency;
        return bytes / r * ms_cluster_share(c, ranks) + c->kernel_overhead;
    }
    double tc = flops / c->vector_flops, tm = bytes / (c->mem_bw * c->mem_efficiency);
    return (tc > tm ? tc : tm) + c->kernel_overhead;
}

ms_group_place ms_cluster_group(const ms_cluster *c, int n, int stride) {
    ms_group_place g = {.n = n, .per_node = n, .crosses_nodes = false};
    if (n <= 1 || (c->cpu && c->nodes <= 1)) return g;
    if (c->rank_order == MS_RANKS_ROUND_ROBIN && c->nodes > 1) {
        /* member i is rank i * stride, on node (i * stride) % nodes: count member 0's node */
        g.per_node = 0;
        for (int i = 0; i < n; i++) g.per_node += ((long)i * stride) % c->nodes == 0;
    } else {
        int dpn = c->devices_per_node;
        g.per_node = stride >= dpn ? 1 : dpn / stride;
        if (g.per_node > n) g.per_node = n;
    }
    g.crosses_nodes = n > g.per_node;
    return g;
}

/* The measured point for (world, group, kind); the nearest rank count of the same group and
 * kind, else an all-reduce point of the same group. */
static const ms_coll_point *coll_point(const ms_cluster *c, int world, int group, ms_coll_kind k) {
    const ms_coll_point *best = NULL;
    int bestd = 1 << 30;
    for (int pass = 0; pass < 2 && !best; pass++)
        for (int i = 0; i < c->n_coll; i++) {
            const ms_coll_point *p = &c->coll[i];
            ms_coll_kind want = pass ? MS_COLL_ALL_REDUCE : k;
            if (p->kind != want) continue;
            int d = abs(p->ranks - world) * 16 + abs(p->group - group) * 64;
            if (d < bestd) bestd = d, best = p;
        }
    return best;
}

static const ms_sync_point *sync_point(const ms_cluster *c, int ranks) {
    const ms_sync_point *best = NULL;
    for (int i = 0; i < c->n_sync; i++)
        if (!best || abs(c->sync[i].ranks - ranks) < abs(best->ranks - ranks)) best = &c->sync[i];
    return best;
}

double ms_cluster_sync_call(const ms_cluster *c, int ranks) {
    const ms_sync_point *p = sync_point(c, ranks);
    return p ? p->per_call : 0;
}

double ms_cluster_sync_byte(const ms_cluster *c, int ranks) {
    const ms_sync_point *p = sync_point(c, ranks);
    return p ? p->per_byte : 0;
}

double ms_cluster_sync_phase(const ms_cluster *c, int ranks) {
    const ms_sync_point *p = sync_point(c, ranks);
    return p ? p->per_phase : 0;
}

double ms_cluster_in_step(const ms_cluster *c, int cls, double bytes) {
    if (cls < 0 || cls >= MS_CLUSTER_IN_STEP) return 1;
    const ms_in_step *p = &c->in_step[cls];
    if (p->factor[0] <= 0 || p->factor[1] <= 0) return 1;
    if (bytes <= p->bytes[0] || p->bytes[1] <= p->bytes[0]) return p->factor[0];
    if (bytes >= p->bytes[1]) return p->factor[1];
    double u = log(bytes / p->bytes[0]) / log(p->bytes[1] / p->bytes[0]);
    return p->factor[0] + u * (p->factor[1] - p->factor[0]);
}

double ms_cluster_sync_compute(const ms_cluster *c, int ranks) {
    if (!c->cpu || ranks <= c->cores) return 1;
    const ms_sync_point *p = sync_point(c, ranks);
    return p && p->compute > 0 ? p->compute : 1;
}

static int ceil_log2(int n) {
    int k = 0;
    while ((1 << k) < n) k++;
    return k;
}

/* The alpha-beta time of a collective over links of latency a and bandwidth bw. */
static double link_time(ms_coll_kind kind, int n, double a, double bytes, double bw,
                        ms_coll_algo algo) {
    double dn = n;
    switch (kind) {
        case MS_COLL_ALL_REDUCE: {
            double ring = 2 * (dn - 1) * a + 2 * (dn - 1) / dn * bytes / bw;
            double tree = 2 * ceil_log2(n) * a + 2 * bytes / bw;
            double direct = a + 2 * (dn - 1) / dn * bytes / bw;
            return algo == MS_ALGO_RING     ? ring
                   : algo == MS_ALGO_TREE   ? tree
                   : algo == MS_ALGO_DIRECT ? direct
                                            : (ring < tree ? ring : tree);
        }
        case MS_COLL_ALL_GATHER:
        case MS_COLL_REDUCE_SCATTER:
        case MS_COLL_ALL_TO_ALL:
            return (algo == MS_ALGO_DIRECT ? 1 : dn - 1) * a + (dn - 1) / dn * bytes / bw;
        case MS_COLL_BROADCAST:
            return ceil_log2(n) * a + bytes / bw;
        case MS_COLL_P2P:
            return a + bytes / bw;
        default:
            return a;
    }
}

/* A group that crosses nodes: by default a node's devices_per_node / per_node groups all
 * cross together (a gradient sync, which they enter from other collectives; devices of their
 * own, which run their groups in lockstep), so the link carries all of them and each gets
 * its members' share of it. Ranks that oversubscribe a cpu's cores take turns instead: a
 * group waiting on the link yields its cores, so the others' compute between collectives
 * (gap_s) runs while it waits. The link still carries every group's bytes, so the wait is the
 * shared time less that compute, but never less than the group's own transfer on a free link
 * (measured on namespace hosts, docs/multihost.md). */
static double crossing_time(const ms_cluster *c, ms_coll_kind kind, ms_group_place g, double bytes,
                            int world, double gap_s) {
    ms_coll_algo algo = c->algo == MS_ALGO_DIRECT ? MS_ALGO_RING : c->algo; /* no shared memory */
    double bw = c->inter.bw * c->inter.efficiency * g.per_node;
    double cap = c->intra.bw * c->intra.efficiency; /* never faster than the node's links */
    if (cap > 0 && bw > cap) bw = cap;              /* cap 0: the node's links unknown */
    double shared = link_time(kind, g.n, c->inter.latency, bytes, bw, algo);
    double groups = (double)c->devices_per_node / (g.per_node > 0 ? g.per_node : 1);
    if (gap_s < 0 || ms_cluster_share(c, world) <= 1 || groups <= 1) return shared;
    double whole = bw * groups;
    if (cap > 0 && whole > cap) whole = cap;
    double alone = link_time(kind, g.n, c->inter.latency, bytes, whole, algo);
    return shared - gap_s > alone ? shared - gap_s : alone;
}

double ms_cluster_coll_time(const ms_cluster *c, ms_coll_kind kind, ms_group_place g, double bytes,
                            int world, double gap_s) {
    int n = g.n;
    if (n <= 1 || kind == MS_COLL_SPLIT) return 0;
    if (c->cpu && c->n_coll > 0 && !g.crosses_nodes) {
        ms_coll_kind k =
            kind == MS_COLL_P2P || kind == MS_COLL_BROADCAST ? MS_COLL_ALL_TO_ALL : kind;
        const ms_coll_point *p = coll_point(c, world, n, k);
        if (p) {
            double factor = kind == MS_COLL_P2P || kind == MS_COLL_BROADCAST
                                ? 1.0
                                : ms_coll_busbw_factor(kind, n);
            double sync = gap_s >= 0 ? ms_cluster_sync_call(c, world) +
                                           factor * bytes * ms_cluster_sync_byte(c, world)
                                     : 0;
            return p->alpha + factor * bytes / p->busbw + sync;
        }
    }
    if (g.crosses_nodes) return crossing_time(c, kind, g, bytes, world, gap_s);
    return link_time(kind, n, c->intra.latency, bytes, c->intra.bw * c->intra.efficiency, c->algo);
}
