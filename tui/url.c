/* url.c - the dashboard line a job prints, split into the server's base address and the
 * access token (see ms_tui_parse_url in source.h). Pure. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "tui/source.h"

#define URL_FORM                                                                                   \
    "http://127.0.0.1:PORT/?token=TOKEN (the dashboard line of `meshscope train --web`)"

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

ms_status ms_tui_parse_url(const char *url, char *base, size_t base_cap, char *token,
                           size_t token_cap, ms_error *err) {
    if (base_cap) base[0] = '\0';
    if (token_cap) token[0] = '\0';
    if (!url || !url[0])
        return ms_fail(err, MS_ERR_INVALID, "no dashboard address: expected " URL_FORM);
    for (const char *c = url; *c; c++)
        if ((unsigned char)*c <= 0x20 || *c == 0x7f)
            return ms_fail(err, MS_ERR_INVALID,
                           "'%s' is not a dashboard address (it contains a space or control "
                           "character): expected " URL_FORM,
                           url);
    size_t scheme;
    if (!strncasecmp(url, "http://", 7))
        scheme = 7;
    else if (!strncasecmp(url, "https://", 8))
        scheme = 8;
    else
        return ms_fail(err, MS_ERR_INVALID, "'%s' is not a dashboard address: expected " URL_FORM,
                       url);
    size_t auth = strcspn(url + scheme, "/?#");
    if (auth == 0)
        return ms_fail(err, MS_ERR_INVALID, "'%s' names no host: expected " URL_FORM, url);
    size_t blen = scheme + auth;
    if (blen + 1 > base_cap)
        return ms_fail(err, MS_ERR_INVALID, "'%s': the address is too long", url);
    memcpy(base, url, blen);
    base[blen] = '\0';
    const char *q = strchr(url + blen, '?');
    const char *frag = strchr(url + blen, '#');
    if (!q || (frag && frag < q)) return MS_OK;
    for (const char *p = q + 1; *p && *p != '#';) {
        size_t n = strcspn(p, "&#");
        if (n > 6 && !strncmp(p, "token=", 6)) {
            size_t t = 0;
            for (size_t i = 6; i < n; i++) {
                char c = p[i];
                if (c == '%' && i + 2 < n && hexval(p[i + 1]) >= 0 && hexval(p[i + 2]) >= 0) {
                    c = (char)(hexval(p[i + 1]) * 16 + hexval(p[i + 2]));
                    i += 2;
                }
                if (t + 1 >= token_cap)
                    return ms_fail(err, MS_ERR_INVALID, "'%s': the token is too long", url);
                token[t++] = c;
            }
            token[t] = '\0';
        }
        p += n;
        if (*p == '&') p++;
    }
    return MS_OK;
}
