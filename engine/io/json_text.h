/* json_text.h - helpers for reporting where JSON text went wrong (config files, checkpoint
 * headers): cJSON says only where it stopped. */
#ifndef MS_JSON_TEXT_H
#define MS_JSON_TEXT_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Bracket depth at byte `off`, skipping strings: tells a nesting-limit rejection (cJSON stops
 * at CJSON_NESTING_LIMIT levels) apart from a syntax error. */
size_t ms_json_depth_at(const char *s, size_t off);

/* The deepest bracket nesting in s[0, len), skipping strings: lets a server refuse deeply
 * nested bodies before parsing them. */
size_t ms_json_max_depth(const char *s, size_t len);

/* A short rendering of a JSON value for "got ..." in messages: a string's first 40 bytes,
 * a number, true/false/null, "an array" or "an object". */
void ms_json_describe(const cJSON *v, char *buf, size_t len);

#endif
