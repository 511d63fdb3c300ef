/* sse_client.c - N concurrent server-sent event streams against a meshscope dashboard, for
 * bench/sse_load.sh. One process, one epoll loop; each stream sends
 *   GET /api/v1/events with "Authorization: Bearer TOKEN"
 * and counts the "event: snapshot" lines it receives (matched across reads).
 *
 * usage: sse_client HOST PORT TOKEN CLIENTS SECONDS
 * Prints one line: clients, seconds, events per client (min / median / max), megabytes
 * received; exits 1 if any stream failed or received no event.
 * Build: cc -O2 -o sse_client bench/sse_client.c
 */
#define _GNU_SOURCE /* memmem */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PATTERN "event: snapshot\n"

typedef struct stream {
    int fd;
    long events;
    long long bytes;
    char tail[sizeof PATTERN]; /* the last bytes of the previous read */
    size_t tail_len;
    int failed;
} stream;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* Counts PATTERN in tail + data without copying all of data. */
static void count(stream *s, const char *data, size_t n) {
    const size_t pl = sizeof PATTERN - 1;
    char joint[2 * sizeof PATTERN];
    size_t head = n < pl - 1 ? n : pl - 1;
    memcpy(joint, s->tail, s->tail_len);
    memcpy(joint + s->tail_len, data, head);
    size_t jl = s->tail_len + head;
    for (size_t i = 0; i + pl <= jl; i++)
        if (i < s->tail_len && !memcmp(joint + i, PATTERN, pl)) s->events++;
    for (const char *p = data; (p = memmem(p, n - (size_t)(p - data), PATTERN, pl)); p += pl)
        s->events++;
    size_t keep = n < pl - 1 ? n : pl - 1;
    if (n < pl - 1) {
        /* keep the end of joint */
        size_t from = jl > pl - 1 ? jl - (pl - 1) : 0;
        memmove(s->tail, joint + from, jl - from);
        s->tail_len = jl - from;
    } else {
        memcpy(s->tail, data + n - keep, keep);
        s->tail_len = keep;
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: sse_client HOST PORT TOKEN CLIENTS SECONDS\n");
        return 2;
    }
    const char *host = argv[1], *token = argv[3];
    int port = atoi(argv[2]), nc = atoi(argv[4]);
    double secs = atof(argv[5]);
    if (nc < 1 || port < 1 || secs <= 0) return 2;
    stream *st = calloc((size_t)nc, sizeof *st);
    int ep = epoll_create1(0);
    char req[512];
    int rl = snprintf(req, sizeof req,
                      "GET /api/v1/events HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
                      "Accept: text/event-stream\r\n\r\n",
                      host, port, token);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    for (int i = 0; i < nc; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
            write(fd, req, (size_t)rl) != rl) {
            fprintf(stderr, "stream %d: cannot connect: %s\n", i, strerror(errno));
            st[i].failed = 1;
            if (fd >= 0) close(fd);
            st[i].fd = -1;
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        st[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    const double end = now() + secs;
    static char buf[1 << 16];
    struct epoll_event evs[64];
    for (double t; (t = now()) < end;) {
        int n = epoll_wait(ep, evs, 64, (int)((end - t) * 1000) + 1);
        for (int k = 0; k < n; k++) {
            stream *s = &st[evs[k].data.u32];
            for (;;) {
                ssize_t r = read(s->fd, buf, sizeof buf);
                if (r > 0) {
                    s->bytes += r;
                    count(s, buf, (size_t)r);
                    continue;
                }
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                s->failed = 1; /* closed by the server */
                epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
                break;
            }
        }
    }
    long *ev = malloc(sizeof *ev * (size_t)nc);
    long long bytes = 0;
    int bad = 0;
    for (int i = 0; i < nc; i++) {
        ev[i] = st[i].events;
        bytes += st[i].bytes;
        if (st[i].failed || st[i].events == 0) bad++;
        if (st[i].fd >= 0) close(st[i].fd);
    }
    qsort(ev, (size_t)nc, sizeof *ev, cmp_long);
    printf("clients %d seconds %.0f events per client min %ld median %ld max %ld received %.1f MB "
           "failed %d\n",
           nc, secs, ev[0], ev[nc / 2], ev[nc - 1], bytes / 1e6, bad);
    free(ev);
    free(st);
    return bad ? 1 : 0;
}
