/* test_flight.c - the flight recorder (engine/comm/flight.h) and `meshscope doctor`
 * (profiler/flight_doctor.h): the ring and its states, dumps written by a real timeout on the
 * threads backend and read back by the doctor, its errors, live records left by a rank killed
 * (SIGKILL, SIGTERM) or exiting, and the hang alert. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/comm/flight.h"
#include "engine/io/fileio.h"
#include "profiler/flight_doctor.h"
#include "profiler/live.h"
#include "profiler/snapshot_json.h"
#include "tests/testkit.h"

static void make_dir(char *dir) {
    strcpy(dir, "/tmp/ms-flight-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[512];
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static int count_dumps(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, "flight-rank", 11);
    if (d) closedir(d);
    return n;
}

static void test_ranks_format_round_trip(void **state) {
    (void)state;
    const int ranks[] = {0, 2, 4, 5, 6, 9, 10};
    char s[64];
    ms_flight_format_ranks(ranks, 7, s, sizeof s);
    assert_string_equal(s, "0,2,4-6,9-10");
    int back[16];
    assert_int_equal(ms_flight_parse_ranks(s, back, 16), 7);
    assert_memory_equal(back, ranks, sizeof ranks);
}

/* Calls move issued -> started -> done or failed, with their times in order; the ring keeps
 * the newest MS_FLIGHT_RING and ignores the end of a call it has dropped. */
static void test_ring_and_states(void **state) {
    (void)state;
    ms_flight_reset();
    ms_flight *f = ms_flight_for_rank(5);
    assert_non_null(f);
    assert_ptr_equal(f, ms_flight_for_rank(5));
    assert_null(ms_flight_for_rank(-1));
    const int members[] = {4, 5, 6, 7};
    ms_flight_comm fc;
    ms_flight_comm_init(&fc, "dp", members, 4, 1);
    assert_string_equal(fc.ranks, "4-7");
    ms_flight_call call = {
        .kind = MS_COLL_ALL_REDUCE, .seq = 1, .bytes = 64, .root = -1, .peer = -1};
    uint64_t a = ms_flight_issue(f, &fc, &call, 100);
    call.seq = 2;
    uint64_t b = ms_flight_issue(f, &fc, &call, 110);
    ms_flight_start(f, a, 120);
    ms_flight_end(f, a, MS_OK, NULL, 0, 130);
    ms_flight_start(f, b, 140);
    const int missing[] = {7};
    ms_flight_end(f, b, MS_ERR_TIMEOUT, missing, 1, 150);
    call.seq = 3;
    ms_flight_issue(f, &fc, &call, 160);

    ms_flight_entry *e = malloc(sizeof *e * MS_FLIGHT_RING);
    assert_int_equal(ms_flight_snapshot(f, e, MS_FLIGHT_RING), 3);
    assert_int_equal(e[0].state, MS_FLIGHT_DONE);
    assert_true(e[0].t_issue_ns <= e[0].t_start_ns && e[0].t_start_ns <= e[0].t_end_ns);
    assert_int_equal(e[1].state, MS_FLIGHT_FAILED);
    assert_int_equal(e[1].n_missing, 1);
    assert_int_equal(e[1].missing[0], 7);
    assert_int_equal(e[2].state, MS_FLIGHT_ISSUED);
    assert_int_equal(e[2].t_start_ns, 0);
    assert_string_equal(ms_flight_where(e, 3) == &e[1] ? "failed" : "other", "failed");

    for (int i = 0; i < MS_FLIGHT_RING + 10; i++) {
        call.seq = 4 + i;
        ms_flight_issue(f, &fc, &call, 200 + i);
    }
    ms_flight_end(f, a, MS_ERR_COMM, NULL, 0, 999); /* dropped: must not touch a live slot */
    int n = ms_flight_snapshot(f, e, MS_FLIGHT_RING);
    assert_int_equal(n, MS_FLIGHT_RING);
    assert_int_equal(e[n - 1].seq, 3 + MS_FLIGHT_RING + 10);
    assert_int_equal(e[0].seq, e[n - 1].seq - MS_FLIGHT_RING + 1);
    for (int i = 0; i < n; i++) assert_int_equal(e[i].state, MS_FLIGHT_ISSUED);
    free(e);
    ms_flight_reset();
}

/* Every rank runs `calls` all-reduces on the world, except that rank `skip` leaves out the
 * last one; the others must time out naming it. */
typedef struct skip_args {
    int calls, skip;
    int64_t seq0; /* the world's sequence number before the calls (same on every rank) */
} skip_args;

static void skip_rank(mt_rank *r, void *arg) {
    skip_args *a = arg;
    ms_comm *w = r->ctx->world;
    ms_comm_set_timeout_ms(w, 400);
    if (r->ctx->rank == 0) a->seq0 = ms_comm_seq(w); /* the same on every rank */
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ms_error err = {0};
    for (int i = 0; i < a->calls; i++) {
        bool last = i == a->calls - 1;
        if (last && r->ctx->rank == a->skip) {
            /* Busy elsewhere, as a rank stuck in its compute would be when terminated. */
            ms_flight_dump(ms_flight_for_rank(a->skip), "test: skipped the call", NULL, 0);
            break;
        }
        ms_status st = ms_all_reduce(w, x, x, 8, MS_REDUCE_SUM, &err);
        if (last)
            MT_CHECK(r, st == MS_ERR_TIMEOUT, "rank %d: the last call returned %s, not a timeout",
                     r->ctx->rank, ms_status_str(st));
        else
            MT_OK(r, st, &err);
    }
}

static void test_dump_and_doctor_round_trip(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    ms_flight_reset();
    ms_flight_set_dir(dir);
    skip_args a = {.calls = 5, .skip = 3};
    mt_run_threads(4, skip_rank, &a);
    ms_flight_set_dir(NULL);
    assert_int_equal(count_dumps(dir), 4);

    ms_strbuf out = {0};
    ms_error err = {0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    char want[256];
    long long seq = (long long)(a.seq0 + a.calls);
    snprintf(want, sizeof want,
             "rank 3 never entered all_reduce seq %lld on 'world' (ranks 0-3); ranks 0-2 waited ",
             seq);
    if (!strstr(out.p, want)) fail_msg("the diagnosis lacks \"%s\":\n%s", want, out.p);
    assert_non_null(strstr(out.p, "per rank (4 dumps)"));
    snprintf(want, sizeof want,
             " ms in all_reduce seq %lld on 'world' (ranks 0-3) and gave up (timed out); not "
             "arrived: rank 3",
             seq);
    /* About the timeout: each rank's own clock, from a little after its deadline was set. */
    bool waited = strstr(out.p, "  rank 0 waited 3") || strstr(out.p, "  rank 0 waited 4");
    if (!strstr(out.p, want) || !waited) fail_msg("the diagnosis lacks \"%s\":\n%s", want, out.p);
    free(out.p);

    /* Without rank 3's dump (killed), the timeouts' missing ranks still name it. */
    char path[128];
    snprintf(path, sizeof path, "%s/flight-rank3-pid%d.jsonl", dir, (int)getpid());
    assert_int_equal(unlink(path), 0);
    out = (ms_strbuf){0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    snprintf(want, sizeof want,
             "rank 3 never arrived in all_reduce seq %lld on 'world' (ranks 0-3) and left no "
             "flight dump (it died or was stopped); ranks 0-2 waited ",
             seq);
    if (!strstr(out.p, want)) fail_msg("the diagnosis lacks \"%s\":\n%s", want, out.p);
    free(out.p);
    remove_dir(dir);
    ms_flight_reset();
}

/* Rank 2 sends to rank 3, which never receives: rank 2 times out in its send. */
static void unmatched_send_rank(mt_rank *r, void *arg) {
    int64_t *seq = arg;
    ms_comm *w = r->ctx->world;
    ms_comm_set_timeout_ms(w, 300);
    float x[4] = {1, 2, 3, 4};
    ms_error err = {0};
    if (r->ctx->rank != 2) return;
    *seq = ms_comm_seq(w) + 1;
    ms_status st = ms_send(w, x, 4, 3, 7, &err);
    MT_CHECK(r, st == MS_ERR_TIMEOUT, "the send returned %s, not a timeout", ms_status_str(st));
}

static void test_doctor_names_stuck_send(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    ms_flight_reset();
    ms_flight_set_dir(dir);
    int64_t seq = 0;
    mt_run_threads(4, unmatched_send_rank, &seq);
    ms_flight_set_dir(NULL);
    assert_int_equal(count_dumps(dir), 1);
    ms_strbuf out = {0};
    ms_error err = {0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    char want[160];
    snprintf(want, sizeof want, "rank 2 was last seen in send to rank 3 seq %lld on 'world'",
             (long long)seq);
    if (!strstr(out.p, want) ||
        !strstr(out.p, "; rank 3 left no flight dump (it died or was stopped)"))
        fail_msg("the diagnosis lacks \"%s\":\n%s", want, out.p);
    free(out.p);
    remove_dir(dir);
    ms_flight_reset();
}

/* Dumps of ranks that completed everything: the doctor says there was no fault. */
static void all_done_rank(mt_rank *r, void *arg) {
    (void)arg;
    float x[4] = {1, 2, 3, 4};
    ms_error err = {0};
    for (int i = 0; i < 3; i++)
        MT_OK(r, ms_all_reduce(r->ctx->world, x, x, 4, MS_REDUCE_MAX, &err), &err);
}

static void test_doctor_no_fault(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    ms_flight_reset();
    ms_flight_set_dir(dir);
    mt_run_threads(2, all_done_rank, NULL);
    for (int r = 0; r < 2; r++) assert_true(ms_flight_dump(ms_flight_for_rank(r), "test", NULL, 0));
    ms_flight_set_dir(NULL);
    ms_strbuf out = {0};
    ms_error err = {0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    if (!strstr(out.p, "all ranks completed every collective: no communication fault"))
        fail_msg("unexpected diagnosis:\n%s", out.p);
    free(out.p);
    remove_dir(dir);
    ms_flight_reset();
}

static void test_doctor_errors(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    ms_strbuf out = {0};
    ms_error err = {0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "holds no flight recorder dumps"));
    char path[128];
    snprintf(path, sizeof path, "%s/flight-rank0-pid1.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("not json\n", f);
    fclose(f);
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "is not a flight recorder dump"));
    /* a complete line that is no entry is refused, naming it; a last line cut off mid-write
     * (the rank killed while dumping) leaves the entries before it */
    static const char *const dump_then[2] = {"{\"op\":\"all_reduce\",\"sta\n",
                                             "{\"op\":\"all_reduce\",\"sta"};
    for (int cut = 0; cut < 2; cut++) {
        f = fopen(path, "w");
        fputs("{\"flight\":1,\"rank\":0,\"pid\":1,\"reason\":\"SIGTERM\",\"now_ns\":5}\n"
              "{\"op\":\"all_reduce\",\"state\":\"done\",\"seq\":1,\"comm\":\"dp\","
              "\"comm_size\":2,\"issue_ns\":1,\"start_ns\":1,\"end_ns\":2}\n",
              f);
        fputs(dump_then[cut], f);
        fclose(f);
        if (cut) break;
        assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_ERR_INVALID);
        assert_non_null(strstr(err.msg, "line 3 is not a flight recorder entry"));
    }
    out.len = 0;
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    if (!strstr(out.p, "cut short")) fail_msg("no note of the cut dump:\n%s", out.p);
    /* ranks killed before they wrote a header (an empty file, a header cut off) are left out,
     * named, and the others' dumps are still read; with nothing else, the doctor refuses */
    char empty[128], no_head[128];
    snprintf(empty, sizeof empty, "%s/flight-rank2-pid3.jsonl", dir);
    snprintf(no_head, sizeof no_head, "%s/flight-rank3-pid4.jsonl", dir);
    fclose(fopen(empty, "w"));
    f = fopen(no_head, "w");
    fputs("{\"flight\":1,\"rank\":3,\"pi", f);
    fclose(f);
    out.len = 0;
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    if (!strstr(out.p, "flight-rank2-pid3.jsonl: empty; the rank was killed while dumping") ||
        !strstr(out.p, "flight-rank3-pid4.jsonl: its first line is cut short") ||
        !strstr(out.p, "per rank (1 dump):"))
        fail_msg("the unreadable dumps are not left out by name:\n%s", out.p);
    remove(path);
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no flight recorder dump could be read"));
    remove_dir(dir);
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot read the folder"));
    free(out.p);
}

/* A dump of `rank` on `host` that timed out in an all-reduce on the pair {rank, peer},
 * naming peer as missing, as every rank's is when the link between two hosts goes down. */
static void write_pair_timeout(const char *dir, int rank, const char *host, int peer) {
    char path[128];
    snprintf(path, sizeof path, "%s/flight-rank%d-pid%d.jsonl", dir, rank, 100 + rank);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    int lo = rank < peer ? rank : peer, hi = rank < peer ? peer : rank;
    fprintf(f,
            "{\"flight\":1,\"rank\":%d,\"pid\":%d,\"host\":\"%s\",\"reason\":\"timed out\","
            "\"now_ns\":7000000000,\"entries\":1,\"dropped\":0}\n",
            rank, 100 + rank, host);
    fprintf(f,
            "{\"seq\":5,\"op\":\"all_reduce\",\"comm\":\"dp\",\"comm_id\":%d,\"ranks\":"
            "\"%d,%d\",\"comm_rank\":%d,\"comm_size\":2,\"state\":\"failed\",\"bytes\":4,"
            "\"dtype\":\"f32\",\"root\":-1,\"peer\":-1,\"p2p\":\"\",\"issue_ns\":1000000000,"
            "\"start_ns\":1000000000,\"end_ns\":6000000000,\"timeout_ms\":5000,\"status\":"
            "\"%s\",\"missing\":[%d]}\n",
            100 + lo, lo, hi, rank == lo ? 0 : 1, ms_status_str(MS_ERR_TIMEOUT), peer);
    fclose(f);
}

/* Two hosts that lost each other: each rank of host0 timed out waiting for its dp partner on
 * host1 and the other way round, all of them alive (dumped). The doctor names the link; when
 * a rank names a peer of its own host, it does not. */
static void test_doctor_names_link_between_hosts(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    const char *hosts[4] = {"host0", "host0", "host1", "host1"};
    for (int r = 0; r < 4; r++) write_pair_timeout(dir, r, hosts[r], (r + 2) % 4);
    ms_strbuf out = {0};
    ms_error err = {0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    assert_non_null(strstr(out.p, "hosts host0 (ranks 0-1) and host1 (ranks 2-3) lost each other"));
    assert_non_null(strstr(out.p, "the link between host0 and host1 is down"));
    free(out.p);
    /* ranks 1 and 3 gave up first, in a tp collective, waiting for ranks 0 and 2 of their own
     * hosts, which were still in the dp collective across the link: the link all the same */
    write_pair_timeout(dir, 1, "host0", 0);
    write_pair_timeout(dir, 3, "host1", 2);
    out = (ms_strbuf){0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    if (!strstr(out.p, "hosts host0 (ranks 0-1) and host1 (ranks 2-3) lost each other"))
        fail_msg("waits behind a peer of the same host hid the link:\n%s", out.p);
    free(out.p);
    /* rank 3 on host0 after all: rank 1 waited for a rank of its own host */
    write_pair_timeout(dir, 1, "host0", 3);
    write_pair_timeout(dir, 3, "host0", 1);
    out = (ms_strbuf){0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    assert_null(strstr(out.p, "lost each other"));
    assert_non_null(strstr(out.p, "all_reduce seq 5 on 'dp'"));
    free(out.p);
    remove_dir(dir);
}

/* --- hardening: dumps are input; the doctor bounds what it reads and checks what it is told --- */

static void put_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A rank stopped inside a bucket's all-reduce (seq 4) after sending its share: the others
 * finished seq 4 and timed out in seq 5, which the stopped rank had only issued (queued behind
 * seq 4). The doctor names it as never arriving in seq 5, still in seq 4; it once said the
 * stopped rank "finished" seq 5. */
static void test_doctor_rank_stuck_behind_issued_call(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    for (int r = 0; r < 4; r++) {
        char name[64], text[1024];
        snprintf(name, sizeof name, "flight-rank%d-pid%d.jsonl", r, 100 + r);
        const char *call = "\"op\":\"all_reduce\",\"comm\":\"dp\",\"comm_id\":7,"
                           "\"ranks\":\"0-3\",\"comm_size\":4";
        if (r == 2)
            snprintf(text, sizeof text,
                     "{\"flight\":1,\"rank\":2,\"reason\":\"SIGTERM\",\"now_ns\":9000000000}\n"
                     "{\"seq\":4,%s,\"state\":\"started\",\"issue_ns\":1000000000,"
                     "\"start_ns\":1000000000}\n"
                     "{\"seq\":5,%s,\"state\":\"issued\",\"issue_ns\":1000000100}\n",
                     call, call);
        else
            snprintf(text, sizeof text,
                     "{\"flight\":1,\"rank\":%d,\"reason\":\"timed out\",\"now_ns\":"
                     "7000000000}\n"
                     "{\"seq\":4,%s,\"state\":\"done\",\"issue_ns\":1000000000,"
                     "\"start_ns\":1000000000,\"end_ns\":1000500000}\n"
                     "{\"seq\":5,%s,\"state\":\"failed\",\"issue_ns\":1000000100,"
                     "\"start_ns\":1000600000,\"end_ns\":6000600000,\"timeout_ms\":5000,"
                     "\"status\":\"%s\",\"missing\":[2]}\n",
                     r, call, call, ms_status_str(MS_ERR_TIMEOUT));
        put_file(dir, name, text);
    }
    ms_strbuf out = {0};
    ms_error err = {0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    if (strncmp(out.p, "rank 2 never arrived in all_reduce seq 5", 40) != 0 ||
        !strstr(out.p, "it was still in all_reduce seq 4"))
        fail_msg("the doctor did not name rank 2 as stuck in seq 4:\n%s", out.p);
    free(out.p);
    remove_dir(dir);
}

/* n dumps of ranks 0..n) with rank `absent` left out, each started in all-reduce seq 5 of the
 * communicator `ranks`. */
static void put_stuck_dumps(const char *dir, int n, int absent, const char *ranks) {
    for (int r = 0; r < n; r++) {
        if (r == absent) continue;
        char name[64], text[512];
        snprintf(name, sizeof name, "flight-rank%d-pid%d.jsonl", r, r);
        snprintf(text, sizeof text,
                 "{\"flight\":1,\"rank\":%d,\"now_ns\":100000}\n{\"seq\":5,\"op\":\"all_reduce\","
                 "\"comm\":\"dp\",\"comm_id\":7,\"ranks\":\"%s\",\"state\":\"started\","
                 "\"start_ns\":1}\n",
                 r, ranks);
        put_file(dir, name, text);
    }
}

static void expect_doctor(const char *dir, ms_status want, const char *needle) {
    ms_strbuf out = {0};
    ms_error err = {0};
    ms_status st = ms_doctor_dir(dir, &out, &err);
    const char *said = st == MS_OK ? (out.p ? out.p : "") : err.msg;
    if (st != want || !strstr(said, needle))
        fail_msg("doctor: status %d, expected %d with \"%s\":\n%s", st, want, needle, said);
    free(out.p);
}

/* More dumps in one collective than the communicator layer has ranks (1024) once overran the
 * doctor's stack arrays: thousands are read and diagnosed, and ranks that are not members of
 * the collective they claim to wait in are named as such. */
static void hardening_doctor_many_dumps(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    put_stuck_dumps(dir, 4000, -1, "0-3");
    expect_doctor(dir, MS_OK,
                  "ranks 4-3999 dumped as in all_reduce seq 5 on 'dp' (ranks 0-3) "
                  "but are not among its ranks");
    expect_doctor(dir, MS_OK, "every member entered all_reduce seq 5 on 'dp' (ranks 0-3)");
    expect_doctor(dir, MS_OK, "per rank (4000 dumps):");
    remove_dir(dir);
    /* 1100 members, rank 1100 without a dump: the other 1100 waited for it */
    make_dir(dir);
    put_stuck_dumps(dir, 1101, 1100, "0-1100");
    expect_doctor(dir, MS_OK,
                  "rank 1100 did not finish all_reduce seq 5 on 'dp' (ranks 0-1100) and left no "
                  "flight dump (it died or was stopped); ranks 0-1099 waited 0.1 ms\n");
    remove_dir(dir);
}

/* Numbers no recorder writes: a timeout or times at the ends of int64 are diagnosed without
 * overflow; ranks outside 0..32767 (as a header's rank, a missing rank, a peer, a member) are
 * refused by file and line instead of printed wrapped around. */
static void hardening_doctor_crafted_numbers(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    static const char head[] = "{\"flight\":1,\"rank\":0,\"now_ns\":100000}\n";
    static const char entry[] = "{\"seq\":5,\"op\":\"all_reduce\",\"comm\":\"dp\",\"comm_id\":7,"
                                "\"ranks\":\"0-1\",\"state\":";
    char text[1024];
    snprintf(text, sizeof text, "%s%s\"started\",\"start_ns\":1,\"timeout_ms\":1e15}\n", head,
             entry);
    put_file(dir, "flight-rank0-pid0.jsonl", text);
    expect_doctor(dir, MS_OK, "rank 1 did not finish all_reduce seq 5");
    snprintf(text, sizeof text,
             "%s%s\"failed\",\"start_ns\":-9e18,\"end_ns\":9e18,\"timeout_ms\":-1e300}\n", head,
             entry);
    put_file(dir, "flight-rank0-pid0.jsonl", text);
    expect_doctor(dir, MS_OK, "rank 0 waited 9223372036.8 s in all_reduce seq 5");
    put_file(dir, "flight-rank0-pid0.jsonl", "{\"flight\":1,\"rank\":5e9,\"now_ns\":1}\n");
    expect_doctor(dir, MS_ERR_INVALID, "its header's \"rank\" is 5000000000, not a world rank");
    static const char *const bad[][2] = {
        {"\"failed\",\"missing\":[99999]}", "\"missing\" holds something other than a rank"},
        {"\"failed\",\"missing\":[-1]}", "\"missing\" holds something other than a rank"},
        {"\"started\",\"p2p\":\"send\",\"peer\":70000}", "root, peer, comm_rank or comm_size"},
        {"\"started\",\"comm_rank\":1.5}", "root, peer, comm_rank or comm_size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, "%s%s%s\n", head, entry, bad[i][0]);
        put_file(dir, "flight-rank0-pid0.jsonl", text);
        expect_doctor(dir, MS_ERR_INVALID, "flight-rank0-pid0.jsonl line 2: ");
        expect_doctor(dir, MS_ERR_INVALID, bad[i][1]);
    }
    snprintf(text, sizeof text,
             "%s{\"seq\":5,\"op\":\"all_reduce\",\"comm\":\"dp\",\"ranks\":\"0-99999\","
             "\"state\":\"started\"}\n",
             head);
    put_file(dir, "flight-rank0-pid0.jsonl", text);
    expect_doctor(dir, MS_ERR_INVALID, "line 2: \"ranks\" names a rank past 32767");
    remove_dir(dir);
}

/* A FIFO or a device named like a dump is refused by name, never opened for reading (the
 * doctor once waited forever on a FIFO). The alarm turns a hang into a failure. */
static void hardening_doctor_non_regular(void **state) {
    (void)state;
    char dir[64], path[128];
    make_dir(dir);
    put_file(dir, "flight-rank0-pid0.jsonl", "{\"flight\":1,\"rank\":0,\"now_ns\":1}\n");
    snprintf(path, sizeof path, "%s/flight-rank1-pid1.jsonl", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(30);
    expect_doctor(dir, MS_ERR_IO, "flight-rank1-pid1.jsonl: is a FIFO, not a regular file");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink("/dev/zero", path), 0);
    expect_doctor(dir, MS_ERR_IO, "is a character device, not a regular file");
    alarm(0);
    remove_dir(dir);
}

/* A file larger than a dump can be is refused by its size, unread (a 1 GB file of zeros was
 * once read whole and taken for a rank killed while dumping); one with NUL bytes is no text;
 * one with more entries than a recorder keeps is no dump. */
static void hardening_doctor_bounded_reads(void **state) {
    (void)state;
    char dir[64], path[128];
    make_dir(dir);
    put_file(dir, "flight-rank0-pid0.jsonl", "{\"flight\":1,\"rank\":0,\"now_ns\":1}\n");
    snprintf(path, sizeof path, "%s/flight-rank1-pid1.jsonl", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), (off_t)(1 << 30)), 0); /* sparse: no disk used */
    fclose(f);
    expect_doctor(dir, MS_ERR_INVALID,
                  "flight-rank1-pid1.jsonl is 1073741824 bytes, more than the 64 MiB a flight "
                  "recorder dump can take");
    f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), 4096), 0);
    fclose(f);
    expect_doctor(dir, MS_ERR_INVALID, "flight-rank1-pid1.jsonl holds NUL bytes");
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"flight\":1,\"rank\":1,\"now_ns\":1}\n", f);
    for (int i = 0; i <= MS_FLIGHT_RING; i++)
        fprintf(f, "{\"seq\":%d,\"op\":\"all_reduce\",\"state\":\"done\"}\n", i + 1);
    fclose(f);
    expect_doctor(dir, MS_ERR_INVALID, "holds more than 1024 entries");
    remove_dir(dir);
}

/* Ranks of host0 that each timed out naming the next two of their host, down to two that
 * named a rank of host1: the waits were followed once per path, taking exponential time (60
 * dumps: years); each rank is followed once now. The alarm turns a hang into a failure. */
static void hardening_doctor_wait_chains(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    enum { N = 60 };
    for (int r = 0; r <= N; r++) {
        char name[64], text[640], missing[32];
        if (r == N)
            snprintf(missing, sizeof missing, "0");
        else if (r >= N - 2)
            snprintf(missing, sizeof missing, "%d", N);
        else
            snprintf(missing, sizeof missing, "%d,%d", r + 1, r + 2);
        snprintf(name, sizeof name, "flight-rank%d-pid%d.jsonl", r, r);
        snprintf(text, sizeof text,
                 "{\"flight\":1,\"rank\":%d,\"host\":\"%s\",\"now_ns\":9}\n{\"seq\":5,\"op\":"
                 "\"all_reduce\",\"comm\":\"c\",\"comm_id\":%d,\"ranks\":\"0-%d\",\"state\":"
                 "\"failed\",\"start_ns\":1,\"end_ns\":5,\"status\":\"%s\",\"missing\":[%s]}\n",
                 r, r == N ? "host1" : "host0", 100 + r, N, ms_status_str(MS_ERR_TIMEOUT), missing);
        put_file(dir, name, text);
    }
    alarm(60);
    expect_doctor(dir, MS_OK, "hosts host0 (ranks 0-59) and host1 (ranks 60) lost each other");
    alarm(0);
    remove_dir(dir);
}

/* --- live records: what a rank leaves however it ends -------------------------------------- */

/* How a recording child ends (live_child). */
enum { END_KILL, END_TERM, END_TERM_NO_DUMP, END_EXIT };

/* The child: a fresh process (no recorders of earlier tests) that records rank 1 of a world of
 * 3 in dir: two all-reduces done, the third started, then ends as `how` says. Its dump is made
 * impossible for END_TERM_NO_DUMP by a folder where the dump's temporary file goes. */
static int live_child(const char *dir, int how) {
    ms_flight_set_dir(dir);
    ms_flight_install_signals();
    ms_flight_prepare(1, 3);
    ms_flight *f = ms_flight_for_rank(1);
    const int members[] = {0, 1, 2};
    ms_flight_comm fc;
    ms_flight_comm_init(&fc, "dp", members, 3, 1);
    ms_flight_call call = {.kind = MS_COLL_ALL_REDUCE, .bytes = 64, .root = -1, .peer = -1};
    for (int i = 1; i <= 3; i++) {
        call.seq = i;
        uint64_t t = ms_flight_issue(f, &fc, &call, i * 1000000);
        ms_flight_start(f, t, i * 1000000);
        if (i < 3) ms_flight_end(f, t, MS_OK, NULL, 0, i * 1000000 + 500);
    }
    if (how == END_EXIT) return 0;
    if (how == END_TERM_NO_DUMP) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s/flight-rank1-pid%d.jsonl.tmp", dir, (int)getpid());
        mkdir(tmp, 0755);
    }
    raise(how == END_KILL ? SIGKILL : SIGTERM);
    return 99;
}

/* Runs live_child in a new process of this program; returns its pid, *sig the signal that
 * ended it (0: it exited). */
static pid_t run_live_child(const char *dir, int how, int *sig) {
    char how_s[8];
    snprintf(how_s, sizeof how_s, "%d", how);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (!pid) {
        execl("/proc/self/exe", "test_flight", "--live-child", dir, how_s, (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    *sig = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
    if (!*sig) assert_int_equal(WEXITSTATUS(ws), 0);
    return pid;
}

static bool exists(const char *dir, const char *fmt, pid_t pid) {
    char path[512];
    snprintf(path, sizeof path, "%s/", dir);
    snprintf(path + strlen(path), sizeof path - strlen(path), fmt, (int)pid);
    return access(path, F_OK) == 0;
}

/* SIGKILL leaves the live record: the doctor reads where the rank was, says it ended without a
 * dump, and names the ranks of its world that left nothing. */
static void test_live_record_outlives_sigkill(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    int sig;
    pid_t pid = run_live_child(dir, END_KILL, &sig);
    assert_int_equal(sig, SIGKILL);
    assert_true(exists(dir, "flight-rank1-pid%d.ring", pid));
    expect_doctor(dir, MS_OK,
                  "rank 1 ended without a dump or a signal it could handle (SIGKILL, or a crash)");
    expect_doctor(
        dir, MS_OK,
        "per rank (0 dumps, 1 live record):\n  rank 1 was in all_reduce seq 3 on 'dp' "
        "(ranks 0-2) for 0.0 ms [no dump: it ended without a dump or a signal it could "
        "handle (SIGKILL, or a crash); read from its live record, as of its last call]\n");
    expect_doctor(dir, MS_OK, "\n  rank 0 left no flight record: ended before it began recording");
    expect_doctor(dir, MS_OK, "\n  rank 2 left no flight record: ended before it began recording");
    remove_dir(dir);
}

/* SIGTERM: a whole dump replaces the live record; when the dump cannot be written (the rank
 * killed in the middle, here a folder in the way of its temporary file), the live record
 * stays, marked with the signal, and reads as of its arrival. A normal exit leaves nothing,
 * not even the folder made for the records. */
static void test_live_record_on_sigterm_and_exit(void **state) {
    (void)state;
    char dir[64];
    make_dir(dir);
    int sig;
    pid_t pid = run_live_child(dir, END_TERM, &sig);
    assert_int_equal(sig, SIGTERM);
    assert_true(exists(dir, "flight-rank1-pid%d.jsonl", pid));
    assert_false(exists(dir, "flight-rank1-pid%d.ring", pid));
    assert_false(exists(dir, "flight-rank1-pid%d.jsonl.tmp", pid));
    expect_doctor(dir, MS_OK, "per rank (1 dump):\n  rank 1 was in all_reduce seq 3");
    expect_doctor(dir, MS_OK, "[dumped on: SIGTERM]\n  rank 0 left no flight record");
    remove_dir(dir);

    make_dir(dir);
    pid = run_live_child(dir, END_TERM_NO_DUMP, &sig);
    assert_int_equal(sig, SIGTERM);
    assert_false(exists(dir, "flight-rank1-pid%d.jsonl", pid));
    expect_doctor(dir, MS_OK, "  rank 1 was in all_reduce seq 3 on 'dp' (ranks 0-2) for ");
    expect_doctor(dir, MS_OK,
                  " [no dump: it got SIGTERM and was killed before its dump was written; read "
                  "from its live record]\n");
    char path[512];
    snprintf(path, sizeof path, "%s/flight-rank1-pid%d.jsonl.tmp", dir, (int)pid);
    rmdir(path);
    remove_dir(dir);

    make_dir(dir);
    pid = run_live_child(dir, END_EXIT, &sig);
    assert_int_equal(sig, 0);
    assert_int_equal(access(dir, F_OK), -1);
}

/* The doctor's words on one live record held in memory, as ms_doctor_texts reads it. */
static ms_status doctor_live(const void *bytes, size_t len, ms_strbuf *out, ms_error *err) {
    ms_doctor_text t = {"x/flight-rank1-pid1.ring", bytes, len};
    out->len = 0;
    return ms_doctor_texts(&t, 1, false, out, err);
}

static void expect_live(const void *bytes, size_t len, ms_status want, const char *needle) {
    ms_strbuf out = {0};
    ms_error err = {0};
    ms_status st = doctor_live(bytes, len, &out, &err);
    const char *said = st == MS_OK ? (out.p ? out.p : "") : err.msg;
    if (st != want || !strstr(out.p ? out.p : "", needle))
        fail_msg("doctor: status %d, expected %d with \"%s\":\n%s%s", st, want, needle,
                 out.p ? out.p : "", said);
    free(out.p);
}

/* Slot i of a live record's ring (the ring ends the file), copied out and back. */
static ms_flight_entry *live_slot(unsigned char *rec, size_t len, int i, ms_flight_entry *e) {
    unsigned char *at = rec + len - sizeof *e * (MS_FLIGHT_RING - (size_t)i);
    memcpy(e, at, sizeof *e);
    return (ms_flight_entry *)(void *)at;
}

/* A live record is input like a dump: a file of the wrong size or without the magic is left
 * out, naming why; an entry with any field no recorder writes (a kind, a rank, a count, a
 * string without its end) is left out and counted; random bytes anywhere are read without
 * harm. The alarm turns a hang into a failure. */
static void hardening_doctor_live_records(void **state) {
    (void)state;
    char dir[64], path[512];
    make_dir(dir);
    int sig;
    pid_t pid = run_live_child(dir, END_KILL, &sig);
    snprintf(path, sizeof path, "%s/flight-rank1-pid%d.ring", dir, (int)pid);
    uint8_t *rec;
    size_t len;
    ms_error err = {0};
    assert_int_equal(ms_read_file(path, 1 << 20, &rec, &len, &err), MS_OK);
    assert_int_equal(len, ms_flight_live_size());
    expect_live(rec, len, MS_OK, "rank 1 was in all_reduce seq 3 on 'dp' (ranks 0-2)");
    expect_live(rec, len - 1, MS_ERR_INVALID, "its size is not that of a live record");
    uint8_t *copy = malloc(len);
    memcpy(copy, rec, len);
    copy[0] ^= 0xff;
    expect_live(copy, len, MS_ERR_INVALID, "does not begin as a live record does");

    /* slot 2 holds seq 3: each bad field leaves it out, seq 2 is then where rank 1 was */
    ms_flight_entry e;
    for (int k = 0; k < 6; k++) {
        memcpy(copy, rec, len);
        ms_flight_entry *at = live_slot(copy, len, 2, &e);
        if (k == 0) e.kind = 250;
        if (k == 1) memset(e.comm.ranks, '7', sizeof e.comm.ranks);
        if (k == 2) e.n_missing = 300;
        if (k == 3) e.n_missing = 1, e.missing[0] = -3;
        if (k == 4) snprintf(e.comm.ranks, sizeof e.comm.ranks, "0-99999");
        if (k == 5) e.peer = -7;
        memcpy(at, &e, sizeof e);
        expect_live(copy, len, MS_OK,
                    "completed all of its last 2 calls; the last: all_reduce seq 2");
        expect_live(copy, len, MS_OK, "(1 entry being written as it ended left out)");
    }
    /* a ticket far ahead of the others: they are older than the ring, left out unnamed */
    memcpy(copy, rec, len);
    ms_flight_entry *at = live_slot(copy, len, 0, &e);
    e.ticket = 1 + (uint64_t)MS_FLIGHT_RING * 1000000;
    memcpy(at, &e, sizeof e);
    expect_live(copy, len, MS_OK, "completed all of its last 1 calls; the last: all_reduce seq 1");

    unsigned seed = 12345;
    alarm(60);
    for (int round = 0; round < 300; round++) {
        memcpy(copy, rec, len);
        size_t from = round % 3 ? len - sizeof e * MS_FLIGHT_RING : 0; /* ring, or anywhere */
        for (int k = 0; k < 64; k++)
            copy[from + (size_t)rand_r(&seed) % (len - from)] = (uint8_t)rand_r(&seed);
        ms_strbuf out = {0};
        ms_status st = doctor_live(copy, len, &out, &err);
        assert_true(st == MS_OK || st == MS_ERR_INVALID);
        free(out.p);
    }
    alarm(0);

    /* a dump of the same process beside its live record: the dump is read, the record not
     * (looked up in a listing where such pairs come first, last, and between others) */
    char name[64];
    snprintf(name, sizeof name, "flight-rank1-pid%d.jsonl", (int)pid);
    put_file(dir, name, "{\"flight\":1,\"rank\":1,\"world\":3,\"now_ns\":5}\n");
    put_file(dir, "flight-rank0-pid1.jsonl", "{\"flight\":1,\"rank\":0,\"now_ns\":5}\n");
    put_file(dir, "flight-rank0-pid1.ring", "a record beside its dump");
    put_file(dir, "flight-rank1-pid1.ring", "no live record");
    expect_doctor(dir, MS_OK, "(left out ");
    snprintf(path, sizeof path, "%s/flight-rank1-pid1.ring", dir);
    unlink(path);
    ms_strbuf out = {0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    if (strstr(out.p, "live record") || strstr(out.p, "left out") ||
        !strstr(out.p, "per rank (2 dumps):\n  rank 0 recorded no communication") ||
        !strstr(out.p, "  rank 1 recorded no communication") ||
        !strstr(out.p, "  rank 2 left no flight record"))
        fail_msg("the dumps do not stand for their live records:\n%s", out.p);
    free(out.p);
    /* a world as large as ranks go, in one dump: the others in one line; past that, ignored */
    put_file(dir, name, "{\"flight\":1,\"rank\":1,\"world\":32768,\"now_ns\":5}\n");
    expect_doctor(dir, MS_OK, "  32766 ranks (2-32767) left no flight record");
    put_file(dir, name, "{\"flight\":1,\"rank\":1,\"world\":32769,\"now_ns\":5}\n");
    out = (ms_strbuf){0};
    assert_int_equal(ms_doctor_dir(dir, &out, &err), MS_OK);
    assert_null(strstr(out.p, "left no flight record"));
    free(out.p);
    free(copy);
    free(rec);
    remove_dir(dir);
}

/* Rank 1 arrives late at the fourth all-reduce; before it does, the alert names it. */
typedef struct late_args {
    char alert[256];
    bool early_alert; /* an alert before anybody waited long */
    ms_live *live;    /* when set: the alert as the live snapshot's JSON has it */
} late_args;

/* The live model's latest snapshot's "hang_alert", as its JSON says it: published by the live
 * thread on its own (a hang brings no steps), so polled for up to 2 s until it is (want) or is
 * not set. */
static void snapshot_alert(ms_live *l, bool want, char *out, size_t len) {
    for (int i = 0; i < 40; i++) {
        const ms_snapshot *s = ms_live_acquire(l);
        cJSON *j = ms_snapshot_to_json(s);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "hang_alert");
        snprintf(out, len, "%s", cJSON_IsString(v) ? v->valuestring : "(missing)");
        cJSON_Delete(j);
        ms_snapshot_release(s);
        if ((out[0] != '\0') == want) return;
        usleep(50000);
    }
}

static void check_alert(char *out, size_t len, bool want, late_args *a) {
    if (a->live)
        snapshot_alert(a->live, want, out, len);
    else
        ms_flight_hang_alert(ms_now_ns(), 10, 1000000000, out, len);
}

static void late_rank(mt_rank *r, void *arg) {
    late_args *a = arg;
    ms_comm *w = r->ctx->world;
    ms_comm_set_timeout_ms(w, 10000);
    float x[4] = {1, 2, 3, 4};
    ms_error err = {0};
    char text[256];
    for (int i = 0; i < 3; i++) MT_OK(r, ms_all_reduce(w, x, x, 4, MS_REDUCE_SUM, &err), &err);
    if (r->ctx->rank == 1) {
        usleep(200000);
        check_alert(text, sizeof text, false, a);
        a->early_alert = text[0] != '\0';
        usleep(1100000); /* rank 0 now waits > 1 s, many times its usual all-reduce */
        check_alert(a->alert, sizeof a->alert, true, a);
    }
    MT_OK(r, ms_all_reduce(w, x, x, 4, MS_REDUCE_SUM, &err), &err);
}

static void expect_late_alert(ms_live *live) {
    ms_flight_reset();
    late_args a = {{0}, false, live};
    mt_run_threads(2, late_rank, &a);
    assert_false(a.early_alert);
    if (!strstr(a.alert, "hang: all_reduce seq ") || !strstr(a.alert, "on 'world' (ranks 0-1)") ||
        !strstr(a.alert, "not arrived: rank 1"))
        fail_msg("unexpected alert: \"%s\"", a.alert);
    char text[256];
    check_alert(text, sizeof text, false, &a);
    assert_string_equal(text, ""); /* over once the call completed */
    ms_flight_reset();
}

static void test_hang_alert_names_late_rank(void **state) {
    (void)state;
    expect_late_alert(NULL);
}

/* The same alert reaches the live snapshot's JSON (the dashboard's banner, the TUI's status
 * line) while the call waits, well before its 10 s timeout. */
static void test_hang_alert_in_snapshot_json(void **state) {
    (void)state;
    ms_live_opts o = {.info = {.nranks = 2, .live = true, .tokens_per_step = 64}};
    ms_live *l = NULL;
    ms_error err = {0};
    assert_int_equal(ms_live_create(&o, &l, &err), MS_OK);
    assert_int_equal(ms_live_start(l, &err), MS_OK);
    expect_late_alert(l);
    ms_live_destroy(l);
}

/* What recording costs one call (issue, start, end: three short critical sections and a copy of
 * the communicator's description), against a whole one-rank all-reduce of one float, which
 * pays it. Printed for the record; bounded so that a slow recorder fails. */
static void one_rank_all_reduces(mt_rank *r, void *arg) {
    double *ns = arg;
    float x = 1;
    ms_error err = {0};
    enum { N = 100000 };
    int64_t t0 = ms_now_ns();
    for (int i = 0; i < N; i++)
        MT_OK(r, ms_all_reduce(r->ctx->world, &x, &x, 1, MS_REDUCE_SUM, &err), &err);
    *ns = (double)(ms_now_ns() - t0) / N;
}

static void test_recorder_overhead(void **state) {
    (void)state;
    ms_flight_reset();
    ms_flight *f = ms_flight_for_rank(0);
    const int members[] = {0, 1, 2, 3};
    ms_flight_comm fc;
    ms_flight_comm_init(&fc, "dp", members, 4, 0);
    enum { N = 1000000 };
    ms_flight_call call = {.kind = MS_COLL_ALL_REDUCE, .bytes = 4, .root = -1, .peer = -1};
    int64_t t0 = ms_now_ns();
    for (int i = 0; i < N; i++) {
        call.seq = i + 1;
        uint64_t t = ms_flight_issue(f, &fc, &call, t0);
        ms_flight_start(f, t, t0);
        ms_flight_end(f, t, MS_OK, NULL, 0, t0);
    }
    double per_call = (double)(ms_now_ns() - t0) / N;
    double all_reduce = 0;
    mt_run_threads(1, one_rank_all_reduces, &all_reduce);
    print_message("flight recorder: %.1f ns per call recorded; a one-rank all_reduce of one float "
                  "(recorder included): %.1f ns\n",
                  per_call, all_reduce);
    assert_true(per_call < 10000); /* generous: sanitizers and shared cores slow it 10x */
    ms_flight_reset();
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--live-child")) return live_child(argv[2], atoi(argv[3]));
    mt_apply_filter(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_format_round_trip),
        cmocka_unit_test(test_ring_and_states),
        cmocka_unit_test(test_dump_and_doctor_round_trip),
        cmocka_unit_test(test_doctor_names_stuck_send),
        cmocka_unit_test(test_doctor_no_fault),
        cmocka_unit_test(test_doctor_rank_stuck_behind_issued_call),
        cmocka_unit_test(test_doctor_errors),
        cmocka_unit_test(test_doctor_names_link_between_hosts),
        cmocka_unit_test(test_hang_alert_names_late_rank),
        cmocka_unit_test(test_hang_alert_in_snapshot_json),
        cmocka_unit_test(test_recorder_overhead),
        cmocka_unit_test(test_live_record_outlives_sigkill),
        cmocka_unit_test(test_live_record_on_sigterm_and_exit),
        cmocka_unit_test(hardening_doctor_many_dumps),
        cmocka_unit_test(hardening_doctor_crafted_numbers),
        cmocka_unit_test(hardening_doctor_non_regular),
        cmocka_unit_test(hardening_doctor_bounded_reads),
        cmocka_unit_test(hardening_doctor_wait_chains),
        cmocka_unit_test(hardening_doctor_live_records),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
