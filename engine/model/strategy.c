/* strategy.c - data, tensor and sequence parallelism as annotations. */
#include "engine/model/strategy.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

bool ms_glob_match(const char *p, const char *s) {
    if (*p == '\0') return *s == '\0';
    if (*p == '*') return ms_glob_match(p + 1, s) || (*s && ms_glob_match(p, s + 1));
    return *s && *p == *s && ms_glob_match(p + 1, s + 1);
}

ms_status ms_strategy_check_degrees(int dp, int tp, int cp, int world, int *ranks, ms_error *err) {
    if (ranks) *ranks = 0;
    if (dp < 1 || tp < 1 || cp < 1)
        return ms_fail(err, MS_ERR_INVALID, "strategy: degrees must be >= 1 (dp %d, tp %d, cp %d)",
                       dp, tp, cp);
    /* dp * tp cannot overflow 64 bits, and cp only multiplies a product within the limit. */
    long long n = (long long)dp * tp;
    if (n <= MS_MESH_MAX_RANKS) n *= cp;
    if (n > MS_MESH_MAX_RANKS)
        return ms_fail(err, MS_ERR_INVALID,
                       "strategy: dp %d x tp %d x cp %d needs more than %d ranks; pick degrees "
                       "whose product is at most %d",
                       dp, tp, cp, MS_MESH_MAX_RANKS, MS_MESH_MAX_RANKS);
    if (world > 0 && n != world)
        return ms_fail(err, MS_ERR_INVALID,
                       "strategy: dp %d x tp %d x cp %d needs %lld ranks but the job runs on %d; "
                       "choose degrees whose product is %d",
                       dp, tp, cp, n, world, world);
    if (ranks) *ranks = (int)n;
    return MS_OK;
}

ms_status ms_strategy_init(ms_strategy *s, int dp, int tp, int cp, bool sp, ms_error *err) {
    memset(s, 0, sizeof *s);
    MS_CHECK(ms_strategy_check_degrees(dp, tp, cp, 0, NULL, err));
    if (sp && tp < 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "strategy: sequence parallelism (--sp) shards over the "
                       "tensor-parallel group; use it with --tp 2 or more");
    s->dp = dp, s->tp = tp, s->cp = cp, s->sp = sp;
    if (cp > 1)
        snprintf(s->text, sizeof s->text, "dp%d x tp%d%s x cp%d", dp, tp, sp ? " +sp" : "", cp);
    else
        snprintf(s->text, sizeof s->text, "dp%d x tp%d%s", dp, tp, sp ? " +sp" : "");
    return MS_OK;
}

int ms_strategy_ranks(const ms_strategy *s) {
    return s->dp * s->tp * s->cp;
}

ms_status ms_strategy_mesh(const ms_strategy *s, ms_mesh *out, ms_error *err) {
    const int shape[3] = {s->dp, s->tp, s->cp};
    const char *names[3] = {"dp", "tp", "cp"};
    return ms_mesh_init(out, s->cp > 1 ? 3 : 2, shape, names, NULL, err);
}

ms_status ms_strategy_check_model(const ms_strategy *s, int n_head, int n_embd, ms_error *err) {
    (void)n_embd;
    if (n_head % s->tp)
        return ms_fail(err, MS_ERR_INVALID,
                       "strategy: tensor-parallel degree %d does not divide "
                       "the %d attention heads; pick a tp that divides n_head",
                       s->tp, n_head);
    return MS_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_stream(const char *name) {
    return ends_with(name, ".res1") || ends_with(name, ".res2") || !strcmp(name, "embed") ||
           ends_with(name, ".attn.c_proj") || ends_with(name, ".mlp.c_proj");
}

/* tp placement of a named value under the Megatron layout; false = no opinion. */
static bool megatron(const ms_strategy *s, const char *name, int ndim, ms_placement *tp) {
    struct {
        const char *suffix;
        int dim;
    } shards[] = {
        {"attn.c_attn.weight", 2}, {"attn.c_attn.bias", 1},       {"attn.c_proj.weight", 0},
        {"mlp.c_fc.weight", 1},    {"mlp.c_fc.bias", 0},          {"mlp.c_proj.weight", 0},
        {"wte.weight", 0},         {"word_embeddings.weight", 0},
    };
    for (size_t i = 0; i < sizeof shards / sizeof *shards; i++)
        if (ends_with(name, shards[i].suffix)) {
            *tp = ms_pl_shard(shards[i].dim);
            return true;
        }
    /* The residual stream and the row-parallel outputs that join it: replicated (their
     * partial sums all-reduced), or sequence-sharded with sp (reduce-scattered). */
    if (is_stream(name)) {
        *tp = s->sp && ndim >= 2 ? ms_pl_shard(1) : ms_pl_replicate();
        return true;
    }
    return false;
}

bool ms_strategy_shard(void *user, const char *name, const ms_shape *shape, int mesh_ndim,
                       ms_placements *pl) {
    const ms_strategy *s = user;
    for (int r = 0; r < s->n_rules; r++)
        if (ms_glob_match(s->rules[r].pattern, name) && s->rules[r].pl.n == mesh_ndim) {
            *pl = s->rules[r].pl;
            return true;
        }
    if (mesh_ndim != (s->cp > 1 ? 3 : 2)) return false;
    bool any = false;
    ms_placement dp = ms_pl_replicate(), tp = ms_pl_replicate(), cp = ms_pl_replicate();
    bool is_input =
        !strcmp(name, "input_ids") || !strcmp(name, "targets") || !strcmp(name, "position_ids");
    bool is_residual = is_stream(name);
    if ((is_input || is_residual) && s->dp > 1 && shape->ndim >= 1) {
        dp = ms_pl_shard(0);
        any = true;
    }
    if (s->tp > 1 && megatron(s, name, shape->ndim, &tp)) any = true;
    if ((is_input || is_residual) && s->cp > 1 && shape->ndim >= 2) {
        cp = ms_pl_shard(1);
        any = true;
    }
    if (!any) return false;
    pl->n = mesh_ndim;
    pl->p[0] = dp;
    pl->p[1] = tp;
    if (mesh_ndim == 3) pl->p[2] = cp;
    ms_placements_default_order(pl);
    return true;
}

static ms_status json_degree(const cJSON *mesh, const char *key, const char *name, int *out,
                             ms_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(mesh, key);
    *out = 1;
    if (!v) return MS_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != (int)v->valuedouble ||
        v->valuedouble > 4096)
        return ms_fail(err, MS_ERR_INVALID, "%s: $.mesh.%s: expected a positive integer", name,
                       key);
    *out = (int)v->valuedouble;
    return MS_OK;
}

ms_status ms_strategy_from_json(const char *json, size_t len, const char *name, ms_strategy *s,
                                ms_error *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - json) : 0;
        return ms_fail(err, MS_ERR_INVALID, "%s: malformed JSON near byte %zu", name, off);
    }
    ms_status st = MS_OK;
    int dp = 1, tp = 1, cp = 1;
    bool sp = false;
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(root, "mesh");
    if (!cJSON_IsObject(root)) {
        st = ms_fail(err, MS_ERR_INVALID, "%s: $: expected an object", name);
        goto out;
    }
    /* The short form {"dp": 2, "tp": 2, "sp": false} puts the degrees at the top level. */
    bool short_form = !mesh && (cJSON_GetObjectItemCaseSensitive(root, "dp") ||
                                cJSON_GetObjectItemCaseSensitive(root, "tp") ||
                                cJSON_GetObjectItemCaseSensitive(root, "cp"));
    if (short_form) mesh = root;
    if (!cJSON_IsObject(mesh)) {
        st = ms_fail(err, MS_ERR_INVALID,
                     "%s: $.mesh: expected an object like {\"dp\": 2, \"tp\": 2} (or the short "
                     "form {\"dp\": 2, \"tp\": 2, \"sp\": false})",
                     name);
        goto out;
    }
    char safe[MS_SAFE_LEN];
    for (const cJSON *k = mesh->child; k; k = k->next)
        if (strcmp(k->string, "dp") && strcmp(k->string, "tp") && strcmp(k->string, "cp") &&
            !(short_form && !strcmp(k->string, "sp"))) {
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s: $.mesh.%s: unknown mesh dim (supported: dp, tp, cp)", name,
                         ms_safe_str(safe, sizeof safe, k->string));
            goto out;
        }
    MS_CHECK_GOTO(json_degree(mesh, "dp", name, &dp, err), st, out);
    MS_CHECK_GOTO(json_degree(mesh, "tp", name, &tp, err), st, out);
    MS_CHECK_GOTO(json_degree(mesh, "cp", name, &cp, err), st, out);
    const cJSON *jsp = cJSON_GetObjectItemCaseSensitive(root, "sp");
    if (jsp && !cJSON_IsBool(jsp)) {
        st = ms_fail(err, MS_ERR_INVALID, "%s: $.sp: expected true or false", name);
        goto out;
    }
    sp = cJSON_IsTrue(jsp);
    st = ms_strategy_init(s, dp, tp, cp, sp, err);
    if (st != MS_OK) {
        ms_fail_wrap(err, st, "%s", name);
        goto out;
    }
    const cJSON *pls = cJSON_GetObjectItemCaseSensitive(root, "placements");
    if (pls && !cJSON_IsObject(pls)) {
        st = ms_fail(err, MS_ERR_INVALID,
                     "%s: $.placements: expected an object of pattern: "
                     "placements",
                     name);
        goto out;
    }
    for (const cJSON *k = pls ? pls->child : NULL; k; k = k->next) {
        if (s->n_rules == MS_STRATEGY_MAX_RULES) {
            st = ms_fail(err, MS_ERR_INVALID, "%s: $.placements: more than %d patterns", name,
                         MS_STRATEGY_MAX_RULES);
            goto out;
        }
        ms_strategy_rule *r = &s->rules[s->n_rules];
        if (!cJSON_IsString(k) || strlen(k->string) >= sizeof r->pattern) {
            st = ms_fail(err, MS_ERR_INVALID,
                         "%s: $.placements[\"%s\"]: expected a placement "
                         "string like \"[S(0), R]\"",
                         name, ms_safe_str(safe, sizeof safe, k->string));
            goto out;
        }
        ms_error e2 = {0};
        int mdims = cp > 1 ? 3 : 2;
        if (ms_placements_parse(k->valuestring, &r->pl, &e2) != MS_OK || r->pl.n != mdims) {
            st = ms_fail(err, MS_ERR_INVALID, "%s: $.placements[\"%s\"]: %s", name,
                         ms_safe_str(safe, sizeof safe, k->string),
                         e2.msg[0] ? e2.msg : "give one placement per mesh dim (dp, tp[, cp])");
            goto out;
        }
        snprintf(r->pattern, sizeof r->pattern, "%s", k->string);
        s->n_rules++;
    }
out:
    cJSON_Delete(root);
    return st;
}

ms_status ms_strategy_load(const char *path, ms_strategy *s, ms_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ms_fail(err, MS_ERR_IO, "strategy file %s: cannot open", path);
    char *buf = xmalloc(1 << 20);
    size_t n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    if (n == (1 << 20)) {
        free(buf);
        return ms_fail(err, MS_ERR_INVALID, "strategy file %s is larger than 1 MiB", path);
    }
    ms_status st = ms_strategy_from_json(buf, n, path, s, err);
    free(buf);
    return st;
}
