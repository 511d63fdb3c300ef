/* json_text.c - see json_text.h. */
#include "io/json_text.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

size_t ms_json_depth_at(const char *s, size_t off) {
    size_t depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < off; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return depth;
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
