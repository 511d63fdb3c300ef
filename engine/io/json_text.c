/* json_text.c - see json_text.h. */
#include "engine/io/json_text.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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
    if (cJSON_IsString(v))
        snprintf(buf, len, "\"%.40s\"%s", v->valuestring, strlen(v->valuestring) > 40 ? "..." : "");
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
