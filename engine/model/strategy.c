/* strategy.c - the strategy value: defaults, name, short JSON, the parser, and data, tensor,
 * sequence and context parallelism as annotations. */
#include "engine/model/strategy.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/io/fileio.h"
#include "engine/io/json_text.h"

static const char *const recompute_names[] = {"none", "full", "selective"};
static const char *const precision_names[] = {"fp32", "bf16"};
static const char *const schedule_names[] = {"1f1b", "gpipe", "interleaved", "zb-h1"};
_Static_assert(sizeof recompute_names / sizeof *recompute_names == MS_RECOMPUTE_COUNT,
               "one name per recompute mode");
_Static_assert(sizeof precision_names / sizeof *precision_names == MS_PRECISION_COUNT,
               "one name per precision");
_Static_assert(sizeof schedule_names / sizeof *schedule_names == MS_SCHEDULE_COUNT,
               "one name per schedule");

const char *ms_recompute_name(ms_recompute r) {
    return r < MS_RECOMPUTE_COUNT ? recompute_names[r] : "?";
}
const char *ms_precision_name(ms_precision p) {
    return p < MS_PRECISION_COUNT ? precision_names[p] : "?";
}
const char *ms_schedule_name(ms_schedule s) {
    return s < MS_SCHEDULE_COUNT ? schedule_names[s] : "?";
}

bool ms_glob_match(const char *p, const char *s) {
    if (*p == '\0') return *s == '\0';
    if (*p == '*') return ms_glob_match(p + 1, s) || (*s && ms_glob_match(p, s + 1));
    return *s && *p == *s && ms_glob_match(p + 1, s + 1);
}

/* --- the value ------------------------------------------------------------------------------- */

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

void ms_strategy_defaults(ms_strategy *s) {
    memset(s, 0, sizeof *s);
    s->dp = s->tp = s->pp = s->cp = 1;
    s->micro_batches = 1;
    s->virtual_stages = 1;
    s->recompute = MS_RECOMPUTE_NONE;
    s->precision = MS_PRECISION_FP32;
    s->schedule = MS_SCHEDULE_1F1B;
}

ms_status ms_strategy_init(ms_strategy *s, int dp, int tp, int cp, bool sp, ms_error *err) {
    ms_strategy_defaults(s);
    const int deg[3] = {dp, tp, cp};
    for (int i = 0; i < 3; i++)
        if (deg[i] < 1 || deg[i] > MS_STRATEGY_MAX_DEGREE)
            return ms_fail(err, MS_ERR_INVALID,
                           "strategy: degrees must be in 1..%d (dp %d, tp %d, cp %d)",
                           MS_STRATEGY_MAX_DEGREE, dp, tp, cp);
    s->dp = dp, s->tp = tp, s->cp = cp, s->sp = sp;
    if (ms_strategy_ranks(s) < 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "strategy: dp %d x tp %d x cp %d needs more than %d ranks; pick smaller "
                       "degrees",
                       dp, tp, cp, MS_STRATEGY_MAX_RANKS);
    return MS_OK;
}

int ms_strategy_ranks(const ms_strategy *s) {
    const int32_t deg[4] = {s->dp, s->tp, s->pp, s->cp};
    int64_t n = 1;
    for (int i = 0; i < 4; i++) {
        if (deg[i] < 1 || deg[i] > MS_STRATEGY_MAX_DEGREE) return -1;
        n *= deg[i]; /* at most 2^24 x 2^16 before the check below: no overflow */
        if (n > MS_STRATEGY_MAX_RANKS) return -1;
    }
    return (int)n;
}

bool ms_strategy_micro(const ms_strategy *s, int batch, int *size, int *count) {
    if (s->dp < 1 || batch < 1 || batch % s->dp) return false;
    int per = batch / s->dp;
    int m = s->micro_batches, b = s->micro_batch;
    if (m < 0 || b < 0 || (m == 0 && b == 0)) return false;
    if (m == 0) m = per % b ? 0 : per / b;
    if (b == 0) b = per % m ? 0 : per / m;
    if (m == 0 || b == 0 || (int64_t)m * b != per) return false;
    *size = b;
    *count = m;
    return true;
}

bool ms_strategy_equal(const ms_strategy *a, const ms_strategy *b) {
    return a->dp == b->dp && a->tp == b->tp && a->pp == b->pp && a->cp == b->cp && a->sp == b->sp &&
           a->zero == b->zero && a->recompute == b->recompute && a->precision == b->precision &&
           a->micro_batches == b->micro_batches && a->micro_batch == b->micro_batch &&
           a->schedule == b->schedule && a->virtual_stages == b->virtual_stages &&
           a->bucket_mb == b->bucket_mb && a->vocab_replicated == b->vocab_replicated &&
           a->offload == b->offload && !memcmp(a->pp_layers, b->pp_layers, sizeof a->pp_layers);
}

/* Appends to a fixed buffer, truncating (always terminated). */
typedef struct out_text {
    char *p;
    size_t n, k;
} out_text;

static void put(out_text *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_text *o, const char *fmt, ...) {
    if (o->k + 1 >= o->n) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(o->p + o->k, o->n - o->k, fmt, ap);
    va_end(ap);
    if (w > 0) o->k = o->k + (size_t)w < o->n ? o->k + (size_t)w : o->n - 1;
}

static int n_stages(const ms_strategy *s) {
    int n = 0;
    while (n < MS_STRATEGY_MAX_STAGES && s->pp_layers[n]) n++;
    return n;
}

/* micro_batches is shown when it is not the default and not derived from micro_batch (0);
 * an explicit 1 next to a size is shown, so that the text tells the two apart. */
static bool show_micro_batches(const ms_strategy *s) {
    return s->micro_batches != 0 && (s->micro_batches != 1 || s->micro_batch != 0);
}

char *ms_strategy_name(const ms_strategy *s, char *buf, size_t n) {
    out_text o = {buf, n, 0};
    if (n) buf[0] = '\0';
    put(&o, "dp%d x tp%d%s", s->dp, s->tp, s->sp ? " +sp" : "");
    if (s->cp != 1) put(&o, " x cp%d", s->cp);
    if (s->pp != 1) put(&o, " x pp%d", s->pp);
    if (s->zero) put(&o, " zero%d", s->zero);
    if (s->recompute == MS_RECOMPUTE_FULL) put(&o, " recompute");
    if (s->recompute == MS_RECOMPUTE_SELECTIVE) put(&o, " selective-recompute");
    if (s->precision != MS_PRECISION_FP32) put(&o, " %s", ms_precision_name(s->precision));
    if (show_micro_batches(s)) put(&o, " m%d", s->micro_batches);
    if (s->micro_batch) put(&o, " mb%d", s->micro_batch);
    if (s->schedule != MS_SCHEDULE_1F1B) put(&o, " %s", ms_schedule_name(s->schedule));
    if (s->virtual_stages != 1) put(&o, " v%d", s->virtual_stages);
    for (int i = 0, k = n_stages(s); i < k; i++)
        put(&o, "%s%d", i ? "," : " layers=", s->pp_layers[i]);
    if (s->bucket_mb != 0) put(&o, " bucket%gMB", (double)s->bucket_mb);
    if (s->vocab_replicated) put(&o, " head-replicated");
    if (s->offload) put(&o, " offload");
    return buf;
}

char *ms_strategy_short_json(const ms_strategy *s, char *buf, size_t n) {
    out_text o = {buf, n, 0};
    if (n) buf[0] = '\0';
    put(&o, "{\"dp\": %d, \"tp\": %d", s->dp, s->tp);
    if (s->cp != 1) put(&o, ", \"cp\": %d", s->cp);
    if (s->pp != 1) put(&o, ", \"pp\": %d", s->pp);
    put(&o, ", \"sp\": %s", s->sp ? "true" : "false");
    if (s->zero) put(&o, ", \"zero\": %d", s->zero);
    if (s->recompute != MS_RECOMPUTE_NONE)
        put(&o, ", \"recompute\": \"%s\"", ms_recompute_name(s->recompute));
    if (s->precision != MS_PRECISION_FP32)
        put(&o, ", \"precision\": \"%s\"", ms_precision_name(s->precision));
    if (show_micro_batches(s)) put(&o, ", \"micro_batches\": %d", s->micro_batches);
    if (s->micro_batch) put(&o, ", \"micro_batch\": %d", s->micro_batch);
    if (s->schedule != MS_SCHEDULE_1F1B)
        put(&o, ", \"schedule\": \"%s\"", ms_schedule_name(s->schedule));
    if (s->virtual_stages != 1) put(&o, ", \"virtual_stages\": %d", s->virtual_stages);
    for (int i = 0, k = n_stages(s); i < k; i++)
        put(&o, "%s%d%s", i ? ", " : ", \"pp_layers\": [", s->pp_layers[i], i == k - 1 ? "]" : "");
    if (s->bucket_mb != 0) put(&o, ", \"bucket_mb\": %.9g", (double)s->bucket_mb);
    if (s->vocab_replicated) put(&o, ", \"vocab_parallel\": false");
    if (s->offload) put(&o, ", \"offload\": true");
    put(&o, "}");
    return buf;
}

/* --- the parser ------------------------------------------------------------------------------ */

static const char *const top_keys[] = {"mesh",
                                       "dp",
                                       "tp",
                                       "pp",
                                       "cp",
                                       "sp",
                                       "zero",
                                       "recompute",
                                       "precision",
                                       "micro_batches",
                                       "micro_batch",
                                       "schedule",
                                       "virtual_stages",
                                       "pp_layers",
                                       "bucket_mb",
                                       "vocab_parallel",
                                       "offload",
                                       "placements"};
static const char *const mesh_keys[] = {"dp", "tp", "pp", "cp"};

/* Levenshtein distance over the first 31 bytes of each string. */
static int edit_distance(const char *a, const char *b) {
    int row[32], la = (int)strnlen(a, 31), lb = (int)strnlen(b, 31);
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j];
            int sub = diag + (a[i - 1] != b[j - 1]);
            int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *closest(const char *key, const char *const *known, size_t n) {
    const char *best = known[0];
    int bd = edit_distance(key, best);
    for (size_t i = 1; i < n; i++) {
        int d = edit_distance(key, known[i]);
        if (d < bd) bd = d, best = known[i];
    }
    return best;
}

/* Refuses duplicate keys in obj and, when known != NULL, keys not in known. */
static ms_status check_keys(const cJSON *obj, const char *path, const char *const *known, size_t nk,
                            const char *name, ms_error *err) {
    char safe[MS_SAFE_LEN]; /* keys come from a file or a request: never raw in a message */
    for (const cJSON *k = obj->child; k; k = k->next) {
        for (const cJSON *p = obj->child; p != k; p = p->next)
            if (!strcmp(p->string, k->string))
                return ms_fail(err, MS_ERR_INVALID, "%s: %s.%s: duplicate key; give each key once",
                               name, path, ms_safe_str(safe, sizeof safe, k->string));
        if (!known) continue;
        bool ok = false;
        for (size_t i = 0; i < nk && !ok; i++) ok = !strcmp(k->string, known[i]);
        if (!ok) {
            char list[256];
            out_text o = {list, sizeof list, 0};
            list[0] = '\0';
            for (size_t i = 0; i < nk; i++) put(&o, "%s%s", i ? ", " : "", known[i]);
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: %s.%s: unknown key; did you mean \"%s\"? (known: %s)", name, path,
                           ms_safe_str(safe, sizeof safe, k->string), closest(k->string, known, nk),
                           list);
        }
    }
    return MS_OK;
}

static ms_status bad_value(const cJSON *v, const char *path, const char *key, const char *want,
                           const char *name, ms_error *err) {
    char got[64];
    ms_json_describe(v, got, sizeof got);
    return ms_fail(err, MS_ERR_INVALID, "%s: %s.%s: expected %s, got %s", name, path, key, want,
                   got);
}

/* An integer in [lo, hi]; absent keys leave *out alone. */
static ms_status get_int(const cJSON *o, const char *path, const char *key, long lo, long hi,
                         const char *what, int32_t *out, const char *name, ms_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return MS_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) ||
        v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi) {
        char want[128];
        snprintf(want, sizeof want, "%s (an integer in %ld..%ld)", what, lo, hi);
        return bad_value(v, path, key, want, name, err);
    }
    *out = (int32_t)v->valuedouble;
    return MS_OK;
}

static ms_status get_bool(const cJSON *o, const char *key, bool *out, const char *name,
                          ms_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return MS_OK;
    if (!cJSON_IsBool(v)) return bad_value(v, "$", key, "true or false", name, err);
    *out = cJSON_IsTrue(v);
    return MS_OK;
}

/* One of names[0..n) as a string; recompute also takes true / false (full / none). */
static ms_status get_enum(const cJSON *o, const char *key, const char *const *names, int n,
                          const char *what, uint8_t *out, const char *name, ms_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return MS_OK;
    bool boolean = !strcmp(key, "recompute") && cJSON_IsBool(v);
    if (boolean) {
        *out = cJSON_IsTrue(v) ? MS_RECOMPUTE_FULL : MS_RECOMPUTE_NONE;
        return MS_OK;
    }
    for (int i = 0; cJSON_IsString(v) && i < n; i++)
        if (!strcmp(v->valuestring, names[i])) {
            *out = (uint8_t)i;
            return MS_OK;
        }
    char want[160];
    out_text t = {want, sizeof want, 0};
    want[0] = '\0';
    put(&t, "%s: ", what);
    for (int i = 0; i < n; i++)
        put(&t, "%s\"%s\"", i ? (i == n - 1 ? " or " : ", ") : "", names[i]);
    if (!strcmp(key, "recompute")) put(&t, " (or true / false)");
    return bad_value(v, "$", key, want, name, err);
}

static ms_status parse_placements(const cJSON *pls, int mdims, ms_placement_rules *rules,
                                  const char *name, ms_error *err) {
    if (!cJSON_IsObject(pls))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.placements: expected an object of pattern: placements", name);
    if (!rules)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.placements: explicit placements are not taken here; put them in a "
                       "--strategy file",
                       name);
    MS_CHECK(check_keys(pls, "$.placements", NULL, 0, name, err));
    rules->n = 0;
    for (const cJSON *k = pls->child; k; k = k->next) {
        if (rules->n == MS_STRATEGY_MAX_RULES)
            return ms_fail(err, MS_ERR_INVALID, "%s: $.placements: more than %d patterns", name,
                           MS_STRATEGY_MAX_RULES);
        ms_placement_rule *r = &rules->r[rules->n];
        char safe[MS_SAFE_LEN];
        if (!cJSON_IsString(k) || strlen(k->string) >= sizeof r->pattern)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: $.placements[\"%s\"]: expected a placement string like "
                           "\"[S(0), R]\" under a pattern of at most %zu bytes",
                           name, ms_safe_str(safe, sizeof safe, k->string), sizeof r->pattern - 1);
        ms_error e2 = {0};
        if (ms_placements_parse(k->valuestring, &r->pl, &e2) != MS_OK || r->pl.n != mdims)
            return ms_fail(err, MS_ERR_INVALID, "%s: $.placements[\"%s\"]: %s", name,
                           ms_safe_str(safe, sizeof safe, k->string),
                           e2.msg[0] ? e2.msg : "give one placement per mesh dim (dp, tp[, cp])");
        snprintf(r->pattern, sizeof r->pattern, "%s", k->string);
        rules->n++;
    }
    return MS_OK;
}

static ms_status parse_root(const cJSON *root, const char *name, ms_strategy *s,
                            ms_placement_rules *rules, ms_error *err) {
    ms_strategy_defaults(s);
    if (!cJSON_IsObject(root))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $: expected an object like {\"dp\": 2, \"tp\": 2} or {\"mesh\": "
                       "{\"dp\": 2, \"tp\": 2}}",
                       name);
    MS_CHECK(check_keys(root, "$", top_keys, sizeof top_keys / sizeof *top_keys, name, err));
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(root, "mesh");
    const char *dpath = "$";
    if (mesh) {
        if (!cJSON_IsObject(mesh))
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: $.mesh: expected an object like {\"dp\": 2, \"tp\": 2}", name);
        MS_CHECK(
            check_keys(mesh, "$.mesh", mesh_keys, sizeof mesh_keys / sizeof *mesh_keys, name, err));
        for (size_t i = 0; i < sizeof mesh_keys / sizeof *mesh_keys; i++)
            if (cJSON_GetObjectItemCaseSensitive(root, mesh_keys[i]))
                return ms_fail(err, MS_ERR_INVALID,
                               "%s: $.%s: the degrees go in $.mesh or at the top level, not both",
                               name, mesh_keys[i]);
        dpath = "$.mesh";
    } else {
        bool any = false;
        for (size_t i = 0; i < sizeof mesh_keys / sizeof *mesh_keys; i++)
            any |= cJSON_GetObjectItemCaseSensitive(root, mesh_keys[i]) != NULL;
        if (!any)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: $: no degrees; give them as {\"dp\": 2, \"tp\": 2} or {\"mesh\": "
                           "{\"dp\": 2, \"tp\": 2}}",
                           name);
        mesh = root;
    }
    int32_t *deg[4] = {&s->dp, &s->tp, &s->pp, &s->cp};
    for (int i = 0; i < 4; i++)
        MS_CHECK(get_int(mesh, dpath, mesh_keys[i], 1, MS_STRATEGY_MAX_DEGREE, "a degree", deg[i],
                         name, err));
    if (ms_strategy_ranks(s) < 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: %s: the mesh dp%d x tp%d x pp%d x cp%d has more than %d ranks", name,
                       dpath, s->dp, s->tp, s->pp, s->cp, MS_STRATEGY_MAX_RANKS);
    MS_CHECK(get_bool(root, "sp", &s->sp, name, err));
    MS_CHECK(get_int(root, "$", "zero", 0, 3, "a ZeRO stage", &s->zero, name, err));
    MS_CHECK(get_enum(root, "recompute", recompute_names, MS_RECOMPUTE_COUNT, "a recompute mode",
                      &s->recompute, name, err));
    MS_CHECK(get_enum(root, "precision", precision_names, MS_PRECISION_COUNT, "a precision",
                      &s->precision, name, err));
    MS_CHECK(get_enum(root, "schedule", schedule_names, MS_SCHEDULE_COUNT, "a pipeline schedule",
                      &s->schedule, name, err));
    MS_CHECK(get_int(root, "$", "micro_batches", 1, 1 << 24, "a micro-batch count",
                     &s->micro_batches, name, err));
    MS_CHECK(get_int(root, "$", "micro_batch", 1, 1 << 24, "sequences per micro-batch",
                     &s->micro_batch, name, err));
    /* A size alone: the count follows from the batch (see ms_strategy_micro). */
    if (s->micro_batch && !cJSON_GetObjectItemCaseSensitive(root, "micro_batches"))
        s->micro_batches = 0;
    MS_CHECK(get_int(root, "$", "virtual_stages", 1, 1024, "model chunks per pipeline rank",
                     &s->virtual_stages, name, err));
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "bucket_mb");
    if (b && (!cJSON_IsNumber(b) || !(b->valuedouble > 0) || !(b->valuedouble <= 1 << 20)))
        return bad_value(b, "$", "bucket_mb", "a bucket size in MiB (> 0, at most 1048576)", name,
                         err);
    if (b) s->bucket_mb = (float)b->valuedouble;
    bool vocab_parallel = true;
    MS_CHECK(get_bool(root, "vocab_parallel", &vocab_parallel, name, err));
    s->vocab_replicated = !vocab_parallel;
    MS_CHECK(get_bool(root, "offload", &s->offload, name, err));
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "pp_layers");
    if (layers) {
        int n = cJSON_GetArraySize(layers);
        if (!cJSON_IsArray(layers) || n < 1 || n > MS_STRATEGY_MAX_STAGES)
            return bad_value(layers, "$", "pp_layers",
                             "an array of 1 to 64 layer counts, one per pipeline stage", name, err);
        int i = 0;
        for (const cJSON *v = layers->child; v; v = v->next, i++) {
            char key[32];
            snprintf(key, sizeof key, "pp_layers[%d]", i);
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
                v->valuedouble < 1 || v->valuedouble > 65535)
                return bad_value(v, "$", key, "a layer count (an integer in 1..65535)", name, err);
            s->pp_layers[i] = (uint16_t)v->valuedouble;
        }
    }
    const cJSON *pls = cJSON_GetObjectItemCaseSensitive(root, "placements");
    if (rules) rules->n = 0;
    if (pls) MS_CHECK(parse_placements(pls, s->cp > 1 ? 3 : 2, rules, name, err));
    return MS_OK;
}

ms_status ms_strategy_parse_json(const char *json, size_t len, const char *name, ms_strategy *s,
                                 ms_placement_rules *rules, ms_error *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t off = end && end >= json ? (size_t)(end - json) : 0;
        return ms_fail(err, MS_ERR_INVALID, "%s: malformed JSON near byte %zu", name, off);
    }
    size_t off = (size_t)(end - json);
    while (off < len && json[off] && strchr(" \t\r\n", json[off])) off++;
    ms_status st = MS_OK;
    if (off < len)
        st = ms_fail(err, MS_ERR_INVALID,
                     "%s: text after the JSON value at byte %zu; give one object", name, off);
    ms_strategy tmp;
    if (st == MS_OK) st = parse_root(root, name, &tmp, rules, err);
    if (st == MS_OK)
        *s = tmp;
    else if (rules)
        rules->n = 0;
    cJSON_Delete(root);
    return st;
}

ms_status ms_strategy_load(const char *path, ms_strategy *s, ms_placement_rules *rules,
                           ms_error *err) {
    uint8_t *buf = NULL;
    size_t n = 0;
    ms_status st = ms_read_file(path, 1 << 20, &buf, &n, err);
    if (st != MS_OK) return ms_fail_wrap(err, st, "strategy file");
    st = ms_strategy_parse_json((const char *)buf, n, path, s, rules, err);
    free(buf);
    return st;
}

/* --- annotations ----------------------------------------------------------------------------- */

ms_status ms_strategy_mesh(const ms_strategy *s, ms_mesh *out, ms_error *err) {
    const int shape[3] = {s->dp, s->tp, s->cp};
    const char *names[3] = {"dp", "tp", "cp"};
    return ms_mesh_init(out, s->cp > 1 ? 3 : 2, shape, names, NULL, err);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_stream(const char *name) {
    return ends_with(name, ".res1") || ends_with(name, ".res2") || !strcmp(name, "embed") ||
           ends_with(name, ".attn.c_proj") || ends_with(name, ".mlp.c_proj");
}

/* LLaMA's row-parallel outputs: the vocab-parallel lookup and the o and down projections.
 * Over tp they are partial sums, which the residual add reduces (all-reduce, or reduce-scatter
 * onto the sequence shard under sp); over dp and cp they are placed as the stream. */
static bool is_row_output(const ms_strategy *s, const char *name) {
    return (!strcmp(name, "model.embed_tokens") && !s->vocab_replicated) ||
           ends_with(name, ".self_attn.o_proj") || ends_with(name, ".mlp.down_proj");
}

/* The vocabulary's tables: the (tied) word embedding and LLaMA's untied head. Sharded over tp
 * by vocabulary rows (the lookup a partial sum, the logits vocab-parallel), or with
 * vocab_replicated whole on every tp rank (the lookup whole, the head's logits and loss
 * computed on the ranks' own rows of the stream). */
static bool is_vocab_table(const char *name) {
    return ends_with(name, "wte.weight") || ends_with(name, "word_embeddings.weight") ||
           ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight");
}

/* LLaMA's pre-attention, pre-MLP and final norms: their outputs, which the column-parallel
 * q, k, v, gate, up and lm_head read, are replicated over tp (with sp: all-gathered from the
 * sequence shard once, not once per projection; without sp: the first layer's norm all-reduces the
 * vocab-parallel lookup rather than running on a reduce-scattered slice). */
static bool is_norm_output(const ms_strategy *s, const char *name) {
    return s->tp > 1 &&
           (ends_with(name, ".input_layernorm") || ends_with(name, ".post_attention_layernorm") ||
            !strcmp(name, "model.norm"));
}

/* tp placement of a named value under the Megatron layout; false = no opinion. */
static bool megatron(const ms_sharding *sh, const char *name, const ms_shape *shape,
                     ms_placement *tp) {
    const ms_strategy *s = sh->s;
    int ndim = shape->ndim;
    struct {
        const char *suffix;
        int dim;
    } shards[] = {
        {"attn.c_attn.weight", 2},
        {"attn.c_attn.bias", 1},
        {"attn.c_proj.weight", 0},
        {"mlp.c_fc.weight", 1},
        {"mlp.c_fc.bias", 0},
        {"mlp.c_proj.weight", 0},
        {"wte.weight", 0},
        {"word_embeddings.weight", 0},
        /* LLaMA: q heads, gate and up column-parallel; o and down row-parallel */
        {"self_attn.q_proj.weight", 0},
        {"self_attn.o_proj.weight", 1},
        {"mlp.gate_proj.weight", 0},
        {"mlp.up_proj.weight", 0},
        {"mlp.down_proj.weight", 1},
        {"embed_tokens.weight", 0},
        {"lm_head.weight", 0},
    };
    /* kv heads shard with the query heads when they divide tp; otherwise every tp rank keeps
     * them all and computes attention for its own query heads (the operator reads each query
     * head's kv head from the whole set). */
    if (ends_with(name, "self_attn.k_proj.weight") || ends_with(name, "self_attn.v_proj.weight")) {
        *tp = shape->d[0] % s->tp == 0 ? ms_pl_shard(0) : ms_pl_replicate();
        return true;
    }
    if (is_row_output(s, name)) {
        *tp = ms_pl_partial(MS_REDUCE_SUM);
        return true;
    }
    if (s->vocab_replicated && is_vocab_table(name)) {
        *tp = ms_pl_replicate();
        return true;
    }
    for (size_t i = 0; i < sizeof shards / sizeof *shards; i++)
        if (ends_with(name, shards[i].suffix)) {
            *tp = ms_pl_shard(shards[i].dim);
            return true;
        }
    /* The residual stream and GPT-2's row-parallel outputs that join it: replicated (their
     * partial sums all-reduced), or sequence-sharded with sp (reduce-scattered). */
    if (is_norm_output(s, name)) {
        *tp = ms_pl_replicate();
        return true;
    }
    if (is_stream(name)) {
        *tp = s->sp && ndim >= 2 ? ms_pl_shard(1) : ms_pl_replicate();
        return true;
    }
    return false;
}

unsigned ms_strategy_recompute_regions(const ms_strategy *s) {
    switch ((ms_recompute)s->recompute) {
        case MS_RECOMPUTE_FULL:
            return 1u << MS_REGION_BLOCK;
        case MS_RECOMPUTE_SELECTIVE:
            return 1u << MS_REGION_ATTENTION;
        default:
            return 0;
    }
}

bool ms_strategy_shard(void *user, const char *name, const ms_shape *shape, int mesh_ndim,
                       ms_placements *pl) {
    const ms_sharding *sh = user;
    const ms_strategy *s = sh->s;
    for (int r = 0; sh->rules && r < sh->rules->n; r++)
        if (ms_glob_match(sh->rules->r[r].pattern, name) && sh->rules->r[r].pl.n == mesh_ndim) {
            *pl = sh->rules->r[r].pl;
            return true;
        }
    if (mesh_ndim != (s->cp > 1 ? 3 : 2)) return false;
    bool any = false;
    ms_placement dp = ms_pl_replicate(), tp = ms_pl_replicate(), cp = ms_pl_replicate();
    bool is_input =
        !strcmp(name, "input_ids") || !strcmp(name, "targets") || !strcmp(name, "position_ids");
    /* BERT's masked positions and their labels [B, k]: split over dp with the batch, whole
     * over cp (k is not a sequence dim; the head runs on all of them) */
    bool is_mlm_input = !strcmp(name, "masked_lm_positions") || !strcmp(name, "masked_lm_labels");
    bool is_residual = is_stream(name) || is_row_output(s, name) || is_norm_output(s, name);
    if ((is_input || is_mlm_input || is_residual) && s->dp > 1 && shape->ndim >= 1) {
        dp = ms_pl_shard(0);
        any = true;
    }
    if (s->tp > 1 && megatron(sh, name, shape, &tp)) any = true;
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
