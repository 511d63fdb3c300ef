/* json_text.h - helpers for reporting where JSON text went wrong (config files, checkpoint
 * headers): cJSON says only where it stopped. */
#ifndef MS_JSON_TEXT_H
#define MS_JSON_TEXT_H

#include <stddef.h>

/* Bracket depth at byte `off`, skipping strings: tells a nesting-limit rejection (cJSON stops
 * at CJSON_NESTING_LIMIT levels) apart from a syntax error. */
size_t ms_json_depth_at(const char *s, size_t off);

#endif
