/* json_text.c - see json_text.h. */
#include "engine/io/json_text.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

/* Bracket depth after `len` bytes, skipping strings; *max_depth gets the deepest point. */
static size_t depth_scan(const char *s, size_t len, size_t *max_depth) {
    size_t depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    if (max_depth) *max_depth = max;
    return depth;
}

size_t ms_json_depth_at(const char *s, size_t off) {
    return depth_scan(s, off, NULL);
}

size_t ms_json_max_depth(const char *s, size_t len) {
    size_t max;
    depth_scan(s, len, &max);
    return max;
}

void ms_json_describe(const cJSON *v, char *buf, size_t len) {
    char safe[48];
    if (cJSON_IsString(v))
        snprintf(buf, len, "\"%s\"", ms_safe_str(safe, sizeof safe, v->valuestring));
    else if (cJSON_IsNumber(v))
        snprintf(buf, len, "%.17g", v->valuedouble);
    else if (cJSON_IsBool(v))
        snprintf(buf, len, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsNull(v))
        snprintf(buf, len, "null");
    else if (cJSON_IsArray(v))
        snprintf(buf, len, "an array");
    else if (cJSON_IsObject(v))
        snprintf(buf, len, "an object");
    else
        snprintf(buf, len, "an invalid value");
}

char *ms_json_number(double x, const char *fmt, char *buf, size_t cap) {
    if (isfinite(x))
        snprintf(buf, cap, fmt, x);
    else
        snprintf(buf, cap, "null");
    return buf;
}

ms_status ms_json_loss_line(double loss, char *buf, size_t cap, ms_error *err) {
    if (isfinite(loss)) {
        snprintf(buf, cap, "{\"loss\": %.6f}", loss);
        return MS_OK;
    }
    /* Plain text with no quote or backslash, so it goes into the JSON string as it is. */
    char msg[200];
    snprintf(msg, sizeof msg,
             "the loss is %s: the model's outputs are not finite, so the checkpoint holds NaN "
             "or infinite weights (saved from a run that diverged?)",
             isnan(loss) ? "nan"
             : loss > 0  ? "inf"
                         : "-inf");
    snprintf(buf, cap, "{\"loss\": null, \"error\": \"%s\"}", msg);
    return ms_fail(err, MS_ERR_INVALID, "%s", msg);
}

/* path + ".key", or + ["key"] for a key that is not a plain identifier. */
static void path_key(char *path, size_t cap, size_t at, const char *key) {
    bool plain = (*key >= 'A' && *key <= 'Z') || (*key >= 'a' && *key <= 'z') || *key == '_';
    for (const char *c = key; plain && *c; c++)
        plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || *c == '_' ||
                (*c >= '0' && *c <= '9');
    char safe[MS_SAFE_LEN];
    ms_safe_str(safe, sizeof safe, key);
    snprintf(path + at, cap - at, plain ? ".%s" : "[\"%s\"]", safe);
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The first member of object o whose key an earlier member already has, or NULL. Sorting
 * keeps a header with many thousand tensors fast. */
static const cJSON *repeated_member(const cJSON *o) {
    int n = cJSON_GetArraySize(o);
    if (n < 2) return NULL;
    const cJSON **m = xmalloc(sizeof *m * (size_t)n);
    int k = 0;
    for (const cJSON *c = o->child; c; c = c->next) m[k++] = c;
    qsort(m, (size_t)n, sizeof *m, cmp_key);
    const cJSON *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (!strcmp(m[i - 1]->string, m[i]->string)) dup = m[i];
    free(m);
    return dup;
}

static bool find_duplicate(const cJSON *v, char *path, size_t cap, size_t at) {
    /* A path longer than cap comes out cut short; the duplicate is found all the same. */
    if (cJSON_IsObject(v)) {
        const cJSON *dup = repeated_member(v);
        if (dup) {
            path_key(path, cap, at, dup->string);
            return true;
        }
    }
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return false;
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        if (cJSON_IsObject(v))
            path_key(path, cap, at, c->string);
        else
            snprintf(path + at, cap - at, "[%d]", i);
        if (find_duplicate(c, path, cap, strlen(path))) return true;
    }
    path[at] = '\0';
    return false;
}

bool ms_json_find_duplicate_key(const cJSON *root, char *path, size_t cap) {
    snprintf(path, cap, "$");
    return root && find_duplicate(root, path, cap, 1);
}

/* Optimal-string-alignment distance over the first 64 bytes of a and b: three rolling rows
 * (the swap of neighbours looks two rows back). */
static size_t edit_distance(const char *a, const char *b) {
    enum { MAXW = 64 };
    size_t la = strnlen(a, MAXW), lb = strnlen(b, MAXW);
    size_t rows[3][MAXW + 1];
    size_t *back = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            size_t d = sub < del ? sub : del;
            d = d < ins ? d : ins;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                back[j - 2] + 1 < d)
                d = back[j - 2] + 1;
            cur[j] = d;
        }
        size_t *t = back;
        back = prev, prev = cur, cur = t;
    }
    return prev[lb];
}

const char *ms_closest_word(const char *word, const char *const *known, size_t n) {
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(word, known[i]);
        if (d < best_d) best = known[i], best_d = d;
    }
    return best;
}
