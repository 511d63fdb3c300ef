/* json_text.c - see json_text.h. */
#include "io/json_text.h"

#include <stdbool.h>

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
