/* fuzz_http.c - fuzz target: what the dashboard does with untrusted request text before any
 * route runs (web/security.c): the body's JSON (nesting check, then cJSON), and the same bytes
 * as Host, Origin, Cookie and Authorization headers. The status is the body parse's. */
#include "tests/fuzz/fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "web/web_internal.h"

int ms_fuzz_one(const uint8_t *data, size_t size, ms_error *err) {
    cJSON *j = NULL;
    ms_status st = ms_web_parse_json((const char *)data, size, &j, err);
    cJSON_Delete(j);
    /* Header values are NUL-terminated text. */
    char *text = malloc(size + 1);
    if (!text) return (int)st;
    memcpy(text, data, size);
    text[size] = '\0';
    char out[128];
    (void)ms_web_host_ok(text, "10.0.0.1");
    (void)ms_web_origin_ok(text, 8080, NULL);
    (void)ms_web_cookie_get(text, "meshscope_8080", out, sizeof out);
    (void)ms_web_bearer_get(text, out, sizeof out);
    (void)ms_web_token_eq(text, "0123456789abcdef0123456789abcdef");
    char host[64];
    int port = 0;
    (void)ms_web_parse_hostport(text, host, sizeof host, &port, NULL);
    free(text);
    return (int)st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)ms_fuzz_one(data, size, NULL);
    return 0;
}
