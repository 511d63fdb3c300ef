/* replay.c - runs a fuzz target over a corpus folder without libFuzzer (for CI).
 *
 *   replay_<target> DIR
 *
 * Files named ok-* must parse (MS_OK); files named bad-* must be rejected with a status
 * other than MS_OK; other names only have to not crash (under ASan/UBSan: no memory error).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "engine/io/fileio.h"

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) {
        perror(argv[1]);
        return 1;
    }
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n + 1) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], names[i]);
        uint8_t *buf;
        size_t len;
        ms_error err = {0};
        if (ms_read_file(path, 1u << 30, &buf, &len, &err) != MS_OK) {
            fprintf(stderr, "FAIL %s: %s\n", names[i], err.msg);
            failures++;
            continue;
        }
        /* Hand the target an exact-size copy so ASan sees any read past the input. */
        uint8_t *exact = malloc(len ? len : 1);
        memcpy(exact, buf, len);
        free(buf);
        ms_error perr = {0};
        int st = ms_fuzz_one(exact, len, &perr);
        (void)LLVMFuzzerTestOneInput(exact, len);
        free(exact);
        int want_ok = strncmp(names[i], "ok-", 3) == 0,
            want_bad = strncmp(names[i], "bad-", 4) == 0;
        if ((want_ok && st != 0) || (want_bad && st == 0)) {
            fprintf(stderr, "FAIL %s: status %d (%s), expected %s\n", names[i], st,
                    st ? perr.msg : "accepted", want_ok ? "success" : "rejection");
            failures++;
        } else {
            printf("ok   %s: %s\n", names[i], st ? perr.msg : "accepted");
        }
        free(names[i]);
    }
    free(names);
    printf("%zu inputs, %d failures\n", n, failures);
    if (n == 0) {
        fprintf(stderr, "FAIL: empty corpus %s\n", argv[1]);
        return 1;
    }
    return failures ? 1 : 0;
}
