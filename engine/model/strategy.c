/* strategy.c - the strategy value: defaults, name, short JSON, the parser, and data, tensor,
 * sequence and context parallelism as annotations. */
#include "engine/model/strategy.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"
#include "engine/io/fileio.h"
#include "engine/io/json_text.h"

const char *const ms_recompute_names[] = {"none", "full", "selective"};
const char *const ms_recompute_name_parts[] = {"", "recompute", "selective-recompute"};
const char *const ms_precision_names[] = {"fp32", "bf16"};
const char *const ms_schedule_names[] = {"1f1b", "gpipe", "interleaved", "zb-h1"};

const char *ms_recompute_name(ms_recompute r) {
    return r < MS_RECOMPUTE_COUNT ? ms_recompute_names[r] : "?";
}
const char *ms_precision_name(ms_precision p) {
    return p < MS_PRECISION_COUNT ? ms_precision_names[p] : "?";
}
const char *ms_schedule_name(ms_schedule s) {
    return s < MS_SCHEDULE_COUNT ? ms_schedule_names[s] : "?";
}

/* --- the settings table ------------------------------------------------------------------------
 */

#define MS_SET_ROW(field_, kind_, dflt_, lo_, hi_, words_, fmt_, name_words_, flags_, what_,       \
                   help_)                                                                          \
    [MS_SET_##field_] = {.name = #field_,                                                          \
                         .kind = MS_SET_KIND_##kind_,                                              \
                         .offset = offsetof(ms_strategy, field_),                                  \
                         .dflt = (dflt_),                                                          \
                         .lo = (lo_),                                                              \
                         .hi = (hi_),                                                              \
                         .words = (words_),                                                        \
                         .name_fmt = (fmt_),                                                       \
                         .name_words = (name_words_),                                              \
                         .flags = (flags_),                                                        \
                         .what = (what_),                                                          \
                         .help = (help_)},
const ms_setting ms_settings[MS_SET_COUNT] = {MS_STRATEGY_SETTINGS(MS_SET_ROW)};
#undef MS_SET_ROW

const ms_setting *ms_setting_find(const char *name) {
    for (int i = 0; i < MS_SET_COUNT; i++)
        if (!strcmp(ms_settings[i].name, name)) return &ms_settings[i];
    return NULL;
}

const char *ms_setting_flag(const ms_setting *st, char *buf, size_t n) {
    snprintf(buf, n, "%s", st->name);
    for (char *c = buf; *c; c++)
        if (*c == '_') *c = '-';
    return buf;
}

/* The field of st in s, by kind. */
static void *field(const ms_strategy *s, const ms_setting *st) {
    return (char *)s + st->offset;
}
static int32_t *int_of(const ms_strategy *s, const ms_setting *st) {
    return field(s, st);
}
static bool *bool_of(const ms_strategy *s, const ms_setting *st) {
    return field(s, st);
}
static uint8_t *enum_of(const ms_strategy *s, const ms_setting *st) {
    return field(s, st);
}
static float *mib_of(const ms_strategy *s, const ms_setting *st) {
    return field(s, st);
}
static uint16_t *layers_of(const ms_strategy *s, const ms_setting *st) {
    return field(s, st);
}

static size_t field_size(const ms_setting *st) {
    switch (st->kind) {
        case MS_SET_KIND_DEGREE:
        case MS_SET_KIND_INT:
            return sizeof(int32_t);
        case MS_SET_KIND_BOOL:
            return sizeof(bool);
        case MS_SET_KIND_ENUM:
            return sizeof(uint8_t);
        case MS_SET_KIND_MIB:
            return sizeof(float);
        case MS_SET_KIND_LAYERS:
            return sizeof(uint16_t) * MS_STRATEGY_MAX_STAGES;
    }
    return 0;
}

/* The value as a number (LAYERS: its first count, 0 when balanced). */
double ms_setting_value(const ms_strategy *s, const ms_setting *st) {
    switch (st->kind) {
        case MS_SET_KIND_DEGREE:
        case MS_SET_KIND_INT:
            return *int_of(s, st);
        case MS_SET_KIND_BOOL:
            return *bool_of(s, st);
        case MS_SET_KIND_ENUM:
            return *enum_of(s, st);
        case MS_SET_KIND_MIB:
            return *mib_of(s, st);
        case MS_SET_KIND_LAYERS:
            return layers_of(s, st)[0];
    }
    return 0;
}

static void set_value(ms_strategy *s, const ms_setting *st, double v) {
    switch (st->kind) {
        case MS_SET_KIND_DEGREE:
        case MS_SET_KIND_INT:
            *int_of(s, st) = (int32_t)v;
            break;
        case MS_SET_KIND_BOOL:
            *bool_of(s, st) = v != 0;
            break;
        case MS_SET_KIND_ENUM:
            *enum_of(s, st) = (uint8_t)v;
            break;
        case MS_SET_KIND_MIB:
            *mib_of(s, st) = (float)v;
            break;
        case MS_SET_KIND_LAYERS:
            memset(layers_of(s, st), 0, field_size(st));
            break;
    }
}

bool ms_setting_equal(const ms_strategy *a, const ms_strategy *b, const ms_setting *st) {
    if (st->kind == MS_SET_KIND_MIB) return *mib_of(a, st) == *mib_of(b, st);
    if (st->kind == MS_SET_KIND_BOOL) return *bool_of(a, st) == *bool_of(b, st);
    return !memcmp(field(a, st), field(b, st), field_size(st));
}

void ms_setting_copy(ms_strategy *dst, const ms_strategy *src, const ms_setting *st) {
    memcpy(field(dst, st), field(src, st), field_size(st));
}

void ms_strategy_settle(ms_strategy *s, uint32_t given) {
    if ((given >> MS_SET_micro_batch & 1) && !(given >> MS_SET_micro_batches & 1))
        s->micro_batches = 0;
}

static bool word_index(const ms_setting *st, const char *text, int *out) {
    for (int i = 0; i <= (int)st->hi; i++)
        if (!strcmp(text, st->words[i])) return *out = i, true;
    return false;
}

static bool bool_word(const char *v, bool *out) {
    static const char *const yes[] = {"true", "1", "on", "yes"}, *const no[] = {"false", "0", "off",
                                                                                "no"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(v, yes[i])) return *out = true, true;
        if (!strcmp(v, no[i])) return *out = false, true;
    }
    return false;
}

/* What st takes, for messages ("a ZeRO stage (an integer in 0..3)"). */
static void expected(const ms_setting *st, char *msg, size_t cap) {
    size_t k = 0;
    switch (st->kind) {
        case MS_SET_KIND_DEGREE:
        case MS_SET_KIND_INT:
            snprintf(msg, cap, "%s (an integer in %.0f..%.0f)", st->what, st->lo, st->hi);
            return;
        case MS_SET_KIND_BOOL:
            snprintf(msg, cap, "true or false");
            return;
        case MS_SET_KIND_MIB:
            snprintf(msg, cap, "%s in MiB (%.9g to %.9g; 0: none)", st->what, st->lo, st->hi);
            return;
        case MS_SET_KIND_LAYERS:
            snprintf(msg, cap, "1 to %d %s (each %.0f..%.0f), one per pipeline stage",
                     MS_STRATEGY_MAX_STAGES, st->what, st->lo, st->hi);
            return;
        case MS_SET_KIND_ENUM:
            k = (size_t)snprintf(msg, cap, "%s: ", st->what);
            for (int i = 0; i <= (int)st->hi && k + 1 < cap; i++) {
                int w = snprintf(msg + k, cap - k, "%s\"%s\"",
                                 i ? (i == (int)st->hi ? " or " : ", ") : "", st->words[i]);
                if (w > 0) k += (size_t)w < cap - k ? (size_t)w : cap - k - 1;
            }
            if (st->flags & MS_SET_BOOL_WORDS && k + 1 < cap)
                snprintf(msg + k, cap - k, " (or true / false)");
            return;
    }
}

/* The argument a setting's flag shows in help: N, MIB, N,N,... or its words joined by '|'. */
const char *ms_setting_metavar(const ms_setting *st, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    switch (st->kind) {
        case MS_SET_KIND_BOOL:
            return NULL;
        case MS_SET_KIND_MIB:
            return "MIB";
        case MS_SET_KIND_LAYERS:
            return "N,N,...";
        case MS_SET_KIND_ENUM:
            for (int w = 0; w <= (int)st->hi && k + 1 < n; w++)
                k += (size_t)snprintf(buf + k, n - k, "%s%s", w ? "|" : "", st->words[w]);
            return buf;
        default:
            return "N";
    }
}

bool ms_setting_set_text(ms_strategy *s, const ms_setting *st, const char *text, char *msg,
                         size_t cap) {
    char *end;
    bool b;
    int w;
    switch (st->kind) {
        case MS_SET_KIND_BOOL:
            if (!text) text = "true";
            if (!bool_word(text, &b)) break;
            *bool_of(s, st) = b;
            return true;
        case MS_SET_KIND_DEGREE:
        case MS_SET_KIND_INT: {
            if (!text) break;
            long v = strtol(text, &end, 10);
            if (!*text || *end || v < st->lo || v > st->hi) break;
            *int_of(s, st) = (int32_t)v;
            return true;
        }
        case MS_SET_KIND_ENUM:
            if (!text) break;
            if (word_index(st, text, &w)) {
                *enum_of(s, st) = (uint8_t)w;
                return true;
            }
            if (st->flags & MS_SET_BOOL_WORDS && bool_word(text, &b)) {
                *enum_of(s, st) = b ? 1 : 0;
                return true;
            }
            break;
        case MS_SET_KIND_MIB: {
            if (!text) break;
            double v = strtod(text, &end);
            if (!*text || *end || !isfinite(v) || v < st->lo || v > st->hi) break;
            *mib_of(s, st) = (float)v;
            return true;
        }
        case MS_SET_KIND_LAYERS: {
            if (!text) break;
            uint16_t counts[MS_STRATEGY_MAX_STAGES] = {0};
            int n = 0;
            const char *p = text;
            while (*p) {
                long v = strtol(p, &end, 10);
                if (end == p || v < st->lo || v > st->hi || n == MS_STRATEGY_MAX_STAGES) break;
                counts[n++] = (uint16_t)v;
                p = end;
                if (*p != ',' && *p != ':') break;
                if (*++p == '\0') break; /* a trailing separator */
            }
            if (n == 0 || *p) break;
            memcpy(layers_of(s, st), counts, sizeof counts);
            return true;
        }
    }
    expected(st, msg, cap);
    return false;
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
    for (int i = 0; i < MS_SET_COUNT; i++) set_value(s, &ms_settings[i], ms_settings[i].dflt);
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
    for (int i = 0; i < MS_SET_COUNT; i++)
        if (!ms_setting_equal(a, b, &ms_settings[i])) return false;
    return true;
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

/* Whether a setting appears in the name (json false) or the short JSON (json true).
 * micro_batches is shown when it is not the default and not derived from micro_batch (0); an
 * explicit 1 next to a size is shown, so that the text tells the two apart. */
static bool shown(const ms_strategy *s, const ms_setting *st, bool json) {
    if (st->flags & (json ? MS_SET_JSON_ALWAYS : MS_SET_NAME_ALWAYS)) return true;
    if (st == &ms_settings[MS_SET_micro_batches])
        return s->micro_batches != 0 && (s->micro_batches != 1 || s->micro_batch != 0);
    if (st->kind == MS_SET_KIND_LAYERS) return layers_of(s, st)[0] != 0;
    return ms_setting_value(s, st) != st->dflt;
}

/* The layer counts, joined by sep. */
static void put_layers(out_text *o, const ms_strategy *s, const ms_setting *st, const char *sep) {
    const uint16_t *c = layers_of(s, st);
    for (int i = 0, k = n_stages(s); i < k; i++) put(o, "%s%d", i ? sep : "", c[i]);
}

/* st's value in s: as JSON (true, "full", [3, 1]) or as a user reads it (on, full, 3,1 or
 * balanced). */
static void put_value(out_text *o, const ms_strategy *s, const ms_setting *st, bool json) {
    switch (st->kind) {
        case MS_SET_KIND_DEGREE:
        case MS_SET_KIND_INT:
            put(o, "%d", *int_of(s, st));
            break;
        case MS_SET_KIND_BOOL:
            put(o, "%s", *bool_of(s, st) ? (json ? "true" : "on") : (json ? "false" : "off"));
            break;
        case MS_SET_KIND_ENUM: {
            uint8_t v = *enum_of(s, st);
            put(o, json ? "\"%s\"" : "%s", v <= st->hi ? st->words[v] : "?");
            break;
        }
        case MS_SET_KIND_MIB:
            put(o, "%.9g", (double)*mib_of(s, st));
            break;
        case MS_SET_KIND_LAYERS:
            if (json || layers_of(s, st)[0]) {
                put(o, json ? "[" : "");
                put_layers(o, s, st, json ? ", " : ",");
                put(o, json ? "]" : "");
            } else {
                put(o, "balanced");
            }
            break;
    }
}

const char *ms_setting_text(const ms_strategy *s, const ms_setting *st, char *buf, size_t n) {
    out_text o = {buf, n, 0};
    if (n) buf[0] = '\0';
    put_value(&o, s, st, false);
    return buf;
}

char *ms_strategy_name(const ms_strategy *s, char *buf, size_t n) {
    out_text o = {buf, n, 0};
    if (n) buf[0] = '\0';
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const ms_setting *st = &ms_settings[i];
        if (!shown(s, st, false)) continue;
        switch (st->kind) {
            case MS_SET_KIND_DEGREE:
            case MS_SET_KIND_INT:
                put(&o, st->name_fmt, *int_of(s, st));
                break;
            case MS_SET_KIND_BOOL:
                put(&o, "%s", st->name_fmt);
                break;
            case MS_SET_KIND_ENUM: {
                const char *const *w = st->name_words ? st->name_words : st->words;
                uint8_t v = *enum_of(s, st);
                put(&o, st->name_fmt, v <= st->hi ? w[v] : "?");
                break;
            }
            case MS_SET_KIND_MIB:
                put(&o, st->name_fmt, (double)*mib_of(s, st));
                break;
            case MS_SET_KIND_LAYERS: {
                char counts[MS_STRATEGY_MAX_STAGES * 6 + 1];
                out_text c = {counts, sizeof counts, 0};
                counts[0] = '\0';
                put_layers(&c, s, st, ",");
                put(&o, st->name_fmt, counts);
                break;
            }
        }
    }
    return buf;
}

char *ms_strategy_short_json(const ms_strategy *s, char *buf, size_t n) {
    out_text o = {buf, n, 0};
    if (n) buf[0] = '\0';
    put(&o, "{");
    bool first = true;
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const ms_setting *st = &ms_settings[i];
        if (!shown(s, st, true)) continue;
        put(&o, "%s\"%s\": ", first ? "" : ", ", st->name);
        first = false;
        put_value(&o, s, st, true);
    }
    put(&o, "}");
    return buf;
}

/* --- the parser ------------------------------------------------------------------------------ */

/* The keys a strategy object may hold: "mesh", every setting, "placements". */
static size_t top_keys(const char **keys) {
    size_t n = 0;
    keys[n++] = "mesh";
    for (int i = 0; i < MS_SET_COUNT; i++) keys[n++] = ms_settings[i].name;
    keys[n++] = "placements";
    return n;
}
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
            char list[512];
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

/* Reads setting st from o[st->name] into s (absent: s untouched). */
static ms_status get_setting(const cJSON *o, const char *path, const ms_setting *st, ms_strategy *s,
                             const char *name, ms_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, st->name);
    if (!v) return MS_OK;
    char want[256];
    expected(st, want, sizeof want);
    const bool integral = st->kind == MS_SET_KIND_DEGREE || st->kind == MS_SET_KIND_INT;
    if (integral || st->kind == MS_SET_KIND_MIB) {
        double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!isfinite(x) || (integral && x != floor(x)) || x < st->lo || x > st->hi)
            return bad_value(v, path, st->name, want, name, err);
        set_value(s, st, x);
        return MS_OK;
    }
    if (st->kind == MS_SET_KIND_BOOL || (st->flags & MS_SET_BOOL_WORDS && cJSON_IsBool(v))) {
        if (!cJSON_IsBool(v)) return bad_value(v, path, st->name, want, name, err);
        set_value(s, st, cJSON_IsTrue(v));
        return MS_OK;
    }
    if (st->kind == MS_SET_KIND_ENUM) {
        int w;
        if (!cJSON_IsString(v) || !word_index(st, v->valuestring, &w))
            return bad_value(v, path, st->name, want, name, err);
        set_value(s, st, w);
        return MS_OK;
    }
    /* LAYERS */
    int n = cJSON_GetArraySize(v);
    if (!cJSON_IsArray(v) || n < 1 || n > MS_STRATEGY_MAX_STAGES)
        return bad_value(v, path, st->name, want, name, err);
    uint16_t *counts = layers_of(s, st);
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        char key[48];
        snprintf(key, sizeof key, "%s[%d]", st->name, i);
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) ||
            c->valuedouble < st->lo || c->valuedouble > st->hi)
            return bad_value(c, path, key, "a layer count (an integer in 1..65535)", name, err);
        counts[i] = (uint16_t)c->valuedouble;
    }
    return MS_OK;
}

static ms_status parse_placements(const cJSON *pls, int mdims, ms_placement_rules *rules,
                                  const char *name, ms_error *err) {
    bool is_auto = cJSON_IsString(pls) && !strcmp(pls->valuestring, "auto");
    if (!cJSON_IsObject(pls) && !is_auto)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.placements: expected an object of pattern: placements, or \"auto\" "
                       "(the planner finds them)",
                       name);
    if (!rules)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.placements: explicit placements are not taken here; put them in a "
                       "--strategy file",
                       name);
    rules->n = 0;
    if (is_auto) {
        rules->auto_place = rules->no_hints = true;
        return MS_OK;
    }
    MS_CHECK(check_keys(pls, "$.placements", NULL, 0, name, err));
    for (const cJSON *k = pls->child; k; k = k->next) {
        char safe[MS_SAFE_LEN];
        bool rest_auto = cJSON_IsString(k) && !strcmp(k->valuestring, "auto");
        if (rest_auto || (cJSON_IsString(k) && !strcmp(k->valuestring, "complete"))) {
            /* the rest: searched ("auto"), or left to the completion pass without the model's
             * own hints ("complete": what a searched layout says of itself) */
            if (strcmp(k->string, "*"))
                return ms_fail(err, MS_ERR_INVALID,
                               "%s: $.placements[\"%s\"]: \"%s\" goes under the pattern \"*\" "
                               "(it says how everything the other patterns leave is placed)",
                               name, ms_safe_str(safe, sizeof safe, k->string), k->valuestring);
            rules->auto_place |= rest_auto;
            rules->no_hints = true;
            continue;
        }
        if (rules->n == MS_STRATEGY_MAX_RULES)
            return ms_fail(err, MS_ERR_INVALID, "%s: $.placements: more than %d patterns", name,
                           MS_STRATEGY_MAX_RULES);
        ms_placement_rule *r = &rules->r[rules->n];
        if (!cJSON_IsString(k) || strlen(k->string) >= sizeof r->pattern)
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: $.placements[\"%s\"]: expected a placement string like "
                           "\"[S(0), R]\" (or \"auto\" or \"complete\" under \"*\") under a "
                           "pattern of at most %zu bytes",
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
    if (cJSON_GetObjectItemCaseSensitive(root, "vocab_parallel"))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.vocab_parallel: this setting is now \"head_replicated\", of the "
                       "opposite sense: write \"head_replicated\": true where it said false, and "
                       "leave it out where it said true",
                       name);
    const char *keys[MS_SET_COUNT + 2];
    MS_CHECK(check_keys(root, "$", keys, top_keys(keys), name, err));
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
    uint32_t given = 0;
    for (int i = 0; i < MS_SET_COUNT; i++) {
        const ms_setting *st = &ms_settings[i];
        const bool degree = st->kind == MS_SET_KIND_DEGREE;
        const cJSON *from = degree ? mesh : root;
        MS_CHECK(get_setting(from, degree ? dpath : "$", st, s, name, err));
        if (cJSON_GetObjectItemCaseSensitive(from, st->name)) given |= 1u << i;
    }
    if (ms_strategy_ranks(s) < 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: %s: the mesh dp%d x tp%d x pp%d x cp%d has more than %d ranks", name,
                       dpath, s->dp, s->tp, s->pp, s->cp, MS_STRATEGY_MAX_RANKS);
    ms_strategy_settle(s, given);
    const cJSON *pls = cJSON_GetObjectItemCaseSensitive(root, "placements");
    if (rules) *rules = (ms_placement_rules){0};
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
        *rules = (ms_placement_rules){0};
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
    return (!strcmp(name, "model.embed_tokens") && !s->head_replicated) ||
           ends_with(name, ".self_attn.o_proj") || ends_with(name, ".mlp.down_proj");
}

/* The vocabulary's tables: the (tied) word embedding and LLaMA's untied head. Sharded over tp
 * by vocabulary rows (the lookup a partial sum, the logits vocab-parallel), or with
 * head_replicated whole on every tp rank (the lookup whole, the head's logits and loss
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
static bool megatron(const ms_strategy *s, const char *name, const ms_shape *shape,
                     ms_placement *tp) {
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
    if (s->head_replicated && is_vocab_table(name)) {
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

ms_compile_opts ms_strategy_compile_opts(const ms_strategy *s, ms_sharding *sh) {
    sh->s = s;
    return (ms_compile_opts){
        .shard = ms_strategy_shard,
        .shard_user = sh,
        .split_weight_grads = s->pp > 1 && s->schedule == MS_SCHEDULE_ZB_H1,
        .recompute = ms_strategy_recompute_regions(s),
        .recompute_blocks = s->recompute_layers,
        .zero_stage = s->zero,
        .zero_dim = MS_STRATEGY_DP_DIM,
        .bucket_mb = s->bucket_mb,
        .bf16 = s->precision == MS_PRECISION_BF16,
        .deferred_param_sync = s->offload,
    };
}

/* The built-in language models' inputs: token ids, targets, positions, BERT's masked ones. */
static bool is_lm_input(const char *name) {
    return !strcmp(name, "input_ids") || !strcmp(name, "targets") ||
           !strcmp(name, "position_ids") || !strcmp(name, "masked_lm_positions") ||
           !strcmp(name, "masked_lm_labels");
}

/* A model's input (or a pipeline chunk's), without a hint of its own: its rows split over dp. */
static bool input_rows_over_dp(const ms_sharding *sh, const char *name, const ms_shape *shape,
                               int mesh_ndim, ms_placements *pl) {
    bool boundary = !strcmp(name, "hidden_in"); /* what crosses a pipeline cut */
    bool input = sh->def ? ms_model_def_find_input(sh->def, name) >= 0 : is_lm_input(name);
    if (sh->s->dp < 2 || shape->ndim < 1 || (!boundary && !input)) return false;
    *pl = ms_placements_replicated(mesh_ndim);
    pl->p[MS_STRATEGY_DP_DIM] = ms_pl_shard(0);
    ms_placements_default_order(pl);
    return true;
}

bool ms_strategy_shard(void *user, const char *name, const ms_shape *shape, int mesh_ndim,
                       ms_placements *pl) {
    const ms_sharding *sh = user;
    for (int r = 0; sh->rules && r < sh->rules->n; r++)
        if (ms_glob_match(sh->rules->r[r].pattern, name) && sh->rules->r[r].pl.n == mesh_ndim) {
            *pl = sh->rules->r[r].pl;
            return true;
        }
    if (sh->rules && sh->rules->no_hints) {
        /* the built-in models' inputs keep their placement over dp and cp (no tp opinion) */
        if ((!sh->def || sh->def->lm) && is_lm_input(name) && sh->s->cp > 1) {
            ms_strategy whole = *sh->s;
            whole.tp = 1;
            return ms_lm_shard(&whole, name, shape, mesh_ndim, pl);
        }
        return input_rows_over_dp(sh, name, shape, mesh_ndim, pl);
    }
    if (!sh->def) return ms_lm_shard(sh->s, name, shape, mesh_ndim, pl);
    if (sh->def->hooks->shard && sh->def->hooks->shard(sh->def, sh->s, name, shape, mesh_ndim, pl))
        return true;
    return input_rows_over_dp(sh, name, shape, mesh_ndim, pl);
}

bool ms_lm_shard(const ms_strategy *s, const char *name, const ms_shape *shape, int mesh_ndim,
                 ms_placements *pl) {
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
    if (s->tp > 1 && megatron(s, name, shape, &tp)) any = true;
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
