/* json_text.h - helpers for JSON text that cJSON leaves to its callers: where a text went wrong
 * (cJSON says only where it stopped), keys given twice (cJSON keeps both), the closest known
 * key for a message, and eval's one-line JSON result. */
#ifndef MS_JSON_TEXT_H
#define MS_JSON_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "engine/core/status.h"

/* Bracket depth at byte `off`, skipping strings: tells a nesting-limit rejection (cJSON stops
 * at CJSON_NESTING_LIMIT levels) apart from a syntax error. */
size_t ms_json_depth_at(const char *s, size_t off);

/* The deepest bracket nesting in s[0, len), skipping strings: lets a server refuse deeply
 * nested bodies before parsing them. */
size_t ms_json_max_depth(const char *s, size_t len);

/* A short rendering of a JSON value for "got ..." in messages: a string's first 40 bytes or so
 * (made safe to print by ms_safe_str), a number, true/false/null, "an array" or "an object". */
void ms_json_describe(const cJSON *v, char *buf, size_t len);

/* Finds a key that appears twice in one object, anywhere in the tree: cJSON keeps both
 * members and lookups return the first, so the second value would be dropped unseen.
 * Returns true and writes the JSON path of the repeated key into path[cap], as $.n_layer,
 * $.mesh.dp or $.placements["h.0"][2] (keys rendered by ms_safe_str); false when every
 * object's keys are unique. */
bool ms_json_find_duplicate_key(const cJSON *root, char *path, size_t cap);

/* The JSON line `meshscope eval` prints: {"loss": 2.345678}. A loss that is not finite has no
 * JSON number (printf's "nan" is not JSON), so the line becomes {"loss": null, "error": "..."}
 * and MS_ERR_INVALID carries the same message: NaN or infinite weights must not pass for an
 * evaluated model. buf[cap] gets the line without a newline (cap of 256 always fits). */
ms_status ms_json_loss_line(double loss, char *buf, size_t cap, ms_error *err);

/* x as a JSON number with printf format fmt (one double conversion), or null when x is not
 * finite (JSON has no NaN or infinity). Returns buf. */
char *ms_json_number(double x, const char *fmt, char *buf, size_t cap);

/* The word of known[0, n) closest to `word` by edit distance (insertions, deletions,
 * substitutions and swaps of neighbours each count 1; the first 64 bytes are compared), the
 * first of equals; NULL when n is 0. For "unknown key, did you mean ...?" messages. */
const char *ms_closest_word(const char *word, const char *const *known, size_t n);

#endif
