/* comm_mpi.c - the MPI communicator backend (see comm_mpi.h).
 *
 * Every slot posts non-blocking MPI operations and polls them against the call's deadline,
 * so a rank that never arrives produces MS_ERR_TIMEOUT instead of a hang.
 *
 * Entering a collective (coll_enter): each communicator owns a second, duplicated
 * "control" communicator. Every member posts a receive for an arrival notice from each
 * peer, sends its own notice (tag = collective number mod 32768, payload = the collective's
 * kind and element type), and waits for all notices before posting any data operation. So:
 *   - on timeout, the peers whose notice has not arrived are the missing ranks;
 *   - a rank that timed out never posted the data operation, and a collective cannot
 *     complete until every member posted it, so no abandoned operation can later write
 *     into the caller's buffers; the timed-out rank also sends a "withdrawn" notice so that
 *     a late peer fails at once instead of waiting out its own timeout;
 *   - a notice of another kind means the ranks called collectives in different orders (or
 *     one with float32 and one with bytes), which is reported as such before any data moves.
 * The price is one small message round per collective (it is a barrier), which is also why
 * ms_barrier needs nothing else.
 *
 * After a timeout or a transport error the context is "poisoned" and destroying it leaks
 * it on purpose (its MPI communicators, requests, count arrays and notice buffers): MPI may
 * still touch them (a tiny notice send; or, if a transfer stalled after every rank entered,
 * the data operation itself, which MPI forbids cancelling or freeing). The shared layer
 * refuses every later call on that communicator; a timeout normally ends the job anyway.
 *
 * Naming the stalled rank: a rank blocked behind a stalled peer does not arrive either (it
 * still waits in an earlier collective, or in a transfer the stalled rank never finished), and
 * when the stalled rank had sent its notices before it stopped, the others pass the entry and
 * wait in the data operation, where the notices say nothing. So before naming ranks, a rank
 * that timed out asks its suspects over a process-wide duplicate of MPI_COMM_WORLD (the
 * "health" communicator): every rank answers from its wait loops (backoff), and a rank that
 * gives up announces it once to everyone, since it stops answering when it leaves. Suspects
 * that neither answer nor gave up within a grace period are the stalled ones, and a rank that
 * gave up is a victim, never named (ms_comm_blame). A rank that gave up lingers before it
 * leaves (linger), answering queries until its peers have given up too and had time to ask:
 * one that left at once would be silent to a peer still timing out, and named with the
 * stalled rank.
 */
#include "engine/comm/comm_mpi.h"

#include <stdlib.h>

#include "engine/comm/comm_impl.h"
#include "engine/comm/flight.h"

bool ms_mpi_launched(void) {
    /* OpenMPI's mpirun sets OMPI_COMM_WORLD_SIZE; MPICH/Hydra sets PMI_SIZE; PMIx-based
     * launchers (srun --mpi=pmix, prterun) set PMIX_RANK. */
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int ms_mpi_launch_rank(void) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v) return atoi(v);
    }
    return 0;
}

#ifndef MS_HAVE_MPI

#include <stdio.h>
#include <unistd.h>

static ms_status no_mpi(ms_error *err) {
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "this meshscope build has no MPI support; install OpenMPI (mpicc) and "
                   "reconfigure with -DMS_ENABLE_MPI=ON, or use the threads backend");
}

ms_status ms_mpi_init(int *argc, char ***argv, ms_error *err) {
    (void)argc, (void)argv;
    return no_mpi(err);
}

void ms_mpi_finalize(void) {}

bool ms_mpi_failed(void) {
    return false;
}

_Noreturn void ms_mpi_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    _exit(code);
}

ms_status ms_comm_mpi_create_world(ms_comm **out, ms_error *err) {
    *out = NULL;
    return no_mpi(err);
}

#else /* MS_HAVE_MPI */

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/core/xalloc.h"

/* Whether ms_mpi_init called MPI_Init_thread (then ms_mpi_finalize finalises). */
static bool g_we_initialised = false;
/* The thread level MPI provided (MPI initialised by someone else: SINGLE, no progress
 * threads). */
static int g_thread_level = MPI_THREAD_SINGLE;
/* Whether a communicator of this process abandoned an operation (see ms_mpi_failed). */
static bool g_failed = false;

/* The health communicator (see the top of this file), made with the first world, and this
 * process's rank in it. MPI is per process, so these are too. */
static MPI_Comm g_health = MPI_COMM_NULL;
static int g_health_rank = 0, g_health_size = 0;
static atomic_int g_health_nonce = 0; /* numbers this process's queries */
/* After a timeout: the grace period of a health check, the timeout itself, and the world
 * ranks this process named as stalled. ms_mpi_abort lingers on these (see linger). */
static int64_t g_grace_ns = 0, g_timeout_ns = 0;
static bool *g_named = NULL; /* [g_health_size] */
/* Each world rank's host name (gathered with the health communicator), so that a timeout can
 * tell a host that does not answer at all (a link or the host down) from a stalled rank. */
#define HOST_NAME_CAP 64
static char (*g_host_of)[HOST_NAME_CAP] = NULL; /* [g_health_size] */
static MPI_Request *g_gave_up_req = NULL; /* [g_health_size] our announcements, kept to finish */
enum {
    TAG_QUERY = 0,        /* "are you there?", payload: the query's nonce */
    TAG_GAVE_UP = 1,      /* "I timed out and am leaving", never received (probed) */
    TAG_ANSWER = 2,       /* + nonce % 16384: "I am here" */
    TAG_PROGRESS = 30000, /* never sent: probed to run MPI's progress engine */
};
static const int k_here = 1;

typedef struct mpi_ctx {
    MPI_Comm comm; /* data: collectives and user point-to-point traffic */
    MPI_Comm ctl;  /* control: arrival notices only, so they never match user tags */
    int rank, size;
    uint32_t coll_seq;     /* collectives entered; p2p batches are not counted, see mpi_p2p */
    int tag;               /* notice tag of the current collective: coll_seq mod 32768 */
    bool poisoned;         /* an operation was abandoned: never free what MPI may touch */
    int note_out;          /* payload of our notices: note_of(kind, dtype) */
    int *note_in;          /* [size] payload received from each peer */
    MPI_Request *note_req; /* [2*size]: receive from peer p at p, send to p at size+p */
    int *ibuf;             /* [4*size] int counts and displacements handed to MPI */
    MPI_Request *p2p_req;  /* grows to the largest batch seen */
    int p2p_cap;
    int *world_of; /* [size] each member's rank in MPI_COMM_WORLD, for the health queries */
} mpi_ctx;

static const ms_comm_backend_ops mpi_ops;

/* --- health ---------------------------------------------------------------------------------- */

static int answer_tag(int nonce) {
    return TAG_ANSWER + nonce % 16384;
}

/* Answers every pending query. Called from the wait loops, so a rank that waits (for
 * anything) is seen to be alive. One thread at a time (a communicator's progress thread may
 * wait while the caller's thread does): the probe and the receive must match one query. */
static void health_serve(void) {
    static pthread_mutex_t serving = PTHREAD_MUTEX_INITIALIZER;
    if (g_health == MPI_COMM_NULL || pthread_mutex_trylock(&serving) != 0) return;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, g_health, &flag, &st) != MPI_SUCCESS || !flag)
            break;
        int nonce = 0;
        if (MPI_Recv(&nonce, 1, MPI_INT, st.MPI_SOURCE, TAG_QUERY, g_health, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS)
            break;
        MPI_Request req;
        if (MPI_Isend(&k_here, 1, MPI_INT, st.MPI_SOURCE, answer_tag(nonce), g_health, &req) ==
            MPI_SUCCESS)
            MPI_Request_free(&req); /* a static buffer: the send may finish whenever */
    }
    pthread_mutex_unlock(&serving);
}

/* Marks the context as abandoned (never freed, see the top of this file) and tells every
 * rank, once per process, that this one gave up: from now on it may stop answering queries
 * without being stalled. */
static void poison(mpi_ctx *m) {
    if (m) m->poisoned = true;
    if (g_failed) return;
    g_failed = true;
    if (g_health == MPI_COMM_NULL) return;
    g_gave_up_req = xmalloc((size_t)g_health_size * sizeof *g_gave_up_req);
    for (int w = 0; w < g_health_size; w++)
        if (w == g_health_rank || MPI_Isend(&k_here, 1, MPI_INT, w, TAG_GAVE_UP, g_health,
                                            &g_gave_up_req[w]) != MPI_SUCCESS)
            g_gave_up_req[w] = MPI_REQUEST_NULL;
}

/* Whether world rank w announced that it gave up (the announcement is probed, never taken). */
static bool gave_up(int w) {
    int flag = 0;
    return MPI_Iprobe(w, TAG_GAVE_UP, g_health, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag;
}

/* Before a rank that gave up leaves: its peers may still be timing out on collectives it
 * never joined, and a peer that asks a rank already gone gets no answer and would name it as
 * stalled. So serve their queries until every peer we did not name has given up too (or a
 * timeout has passed: a peer entering later hears our withdrawal instead), then for one more
 * grace period, the length of their health checks. Our own announcements are driven to
 * completion meanwhile, so a peer that probes for them finds them. */
static void linger(void) {
    if (g_health == MPI_COMM_NULL || g_timeout_ns <= 0) return;
    int64_t now = ms_now_ns(), cap = now + g_timeout_ns + g_grace_ns, end = cap;
    bool all = false;
    while ((now = ms_now_ns()) < end) {
        health_serve();
        for (int w = 0; g_gave_up_req && w < g_health_size; w++) {
            int flag = 0;
            if (g_gave_up_req[w] != MPI_REQUEST_NULL)
                MPI_Test(&g_gave_up_req[w], &flag, MPI_STATUS_IGNORE);
        }
        if (!all) {
            all = true;
            for (int w = 0; w < g_health_size && all; w++)
                all = w == g_health_rank || (g_named && g_named[w]) || gave_up(w);
            if (all && now + g_grace_ns + 200000000 < end) end = now + g_grace_ns + 200000000;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* --- helpers --------------------------------------------------------------------------------- */

static ms_status mpi_fail(mpi_ctx *m, ms_error *err, int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    /* Something may still be in flight (notices at least), so never free it. */
    poison(m);
    return ms_fail(err, MS_ERR_COMM, "%s failed: %s", what, s);
}

static bool fits_int(size_t v) {
    return v <= (size_t)INT_MAX;
}

static ms_status too_big(ms_error *err, const char *what) {
    return ms_fail(err, MS_ERR_INVALID,
                   "%s exceeds the MPI limit of %d elements per count or displacement", what,
                   INT_MAX);
}

static MPI_Datatype mpi_type(ms_comm_dtype dt) {
    return dt == MS_COMM_BYTES ? MPI_BYTE : dt == MS_COMM_BF16 ? MPI_UINT16_T : MPI_FLOAT;
}

/* The payload of an arrival notice: what the rank entered, kind and element type. */
static int note_of(ms_coll_kind kind, ms_comm_dtype dt) {
    return (int)kind * MS_COMM_DTYPE_COUNT + (int)dt;
}

static MPI_Op mpi_op(ms_reduce_op op) {
    switch (op) {
        case MS_REDUCE_MAX:
            return MPI_MAX;
        case MS_REDUCE_MIN:
            return MPI_MIN;
        default:
            return MPI_SUM; /* SUM, and AVG = SUM then scale by 1/n */
    }
}

/* Between polls: spin briefly (the peer is usually about to finish), then yield, then
 * sleep, because tests run several ranks per core and a spinning waiter starves the
 * rank it is waiting for. A progress thread sleeps almost at once. */
static void backoff(int *spins) {
    int s = (*spins)++;
    if (ms_comm_on_progress_thread()) {
        /* Beside the rank's compute: poll every 50 us and leave the core to the kernels
         * (a spinning poller took a quarter of a step's compute on 2 cores). */
        if (s >= 4) {
            health_serve();
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        return;
    }
    if (s < 64) return;
    health_serve();
    if (s < 1024) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* Asks the world ranks `world[0..n)` whether they are alive, waiting a grace period (a
 * quarter of the call's timeout, 0.1 to 5 s) or until all answered. state[i]:
 * MS_PEER_ANSWERED, else MS_PEER_GAVE_UP when rank i announced that it gave up (possibly long
 * ago: an answer is the better evidence, hence the wait), else MS_PEER_SILENT. */
static void health_check(const ms_comm_call *call, const int *world, int n, ms_peer_state *state) {
    for (int i = 0; i < n; i++) state[i] = MS_PEER_SILENT;
    if (g_health == MPI_COMM_NULL || n == 0) return;
    int64_t grace = call->timeout_ns / 4;
    grace = grace < 100000000 ? 100000000 : grace > 5000000000LL ? 5000000000LL : grace;
    g_grace_ns = grace;
    g_timeout_ns = call->timeout_ns;
    int64_t deadline = ms_now_ns() + grace;
    /* Leaked on purpose: a query to a stalled rank may stay in flight. */
    int *nonce = xmalloc(sizeof *nonce);
    *nonce = atomic_fetch_add(&g_health_nonce, 1) & 0x3fffffff;
    int *in = xmalloc((size_t)n * sizeof *in);
    MPI_Request *req = xmalloc((size_t)n * sizeof *req);
    for (int i = 0; i < n; i++) {
        int w = world[i];
        MPI_Request sreq;
        if (MPI_Isend(nonce, 1, MPI_INT, w, TAG_QUERY, g_health, &sreq) == MPI_SUCCESS)
            MPI_Request_free(&sreq);
        if (MPI_Irecv(&in[i], 1, MPI_INT, w, answer_tag(*nonce), g_health, &req[i]) != MPI_SUCCESS)
            req[i] = MPI_REQUEST_NULL;
    }
    int spins = 0;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++) {
            int flag = 0;
            if (state[i] != MS_PEER_ANSWERED && req[i] != MPI_REQUEST_NULL &&
                MPI_Test(&req[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
                state[i] = MS_PEER_ANSWERED;
            all &= state[i] == MS_PEER_ANSWERED;
        }
        if (all || ms_now_ns() > deadline) break;
        backoff(&spins); /* answers the queries of peers checking at the same time */
    }
    for (int i = 0; i < n; i++) {
        if (req[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&req[i]); /* local: the wait cannot hang */
            MPI_Wait(&req[i], MPI_STATUS_IGNORE);
        }
        if (state[i] == MS_PEER_SILENT && gave_up(world[i])) state[i] = MS_PEER_GAVE_UP;
    }
    free(in);
    free(req);
}

/* Appends world rank w to world[0..*n) unless it is there (cap 128). */
static void add_world_rank(int *world, int *n, int w) {
    for (int i = 0; i < *n; i++)
        if (world[i] == w) return;
    if (*n < 128) world[(*n)++] = w;
}

/* Adds the other ranks of world rank w's host, when it is not this rank's, to world[0..*n):
 * queried with the suspects, so that a host none of whose ranks answers is told from one
 * stalled rank. */
static void add_host_ranks(int *world, int *n, int w) {
    if (!g_host_of || !strcmp(g_host_of[w], g_host_of[g_health_rank])) return;
    for (int v = 0; v < g_health_size; v++)
        if (v != g_health_rank && !strcmp(g_host_of[v], g_host_of[w])) add_world_rank(world, n, v);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* call->note: the hosts, other than this rank's, of which a named rank is and none of whose
 * ranks answered: unreachable, a link or the host down. */
static void name_unreachable(ms_comm_call *call, const int *world, int n,
                             const ms_peer_state *state, const int *named, int n_named) {
    size_t len = 0;
    call->note[0] = '\0';
    for (int i = 0; g_host_of && i < n_named; i++) {
        const char *host = g_host_of[named[i]];
        bool seen = !strcmp(host, g_host_of[g_health_rank]), silent = true;
        for (int k = 0; k < i; k++) seen |= !strcmp(g_host_of[named[k]], host);
        if (seen) continue; /* this rank's own host, or one already said */
        int ranks[128], nr = 0;
        for (int j = 0; j < n; j++) {
            if (strcmp(g_host_of[world[j]], host)) continue;
            silent &= state[j] == MS_PEER_SILENT;
            ranks[nr++] = world[j];
        }
        if (!silent) continue;
        /* none of them hears this rank either: ms_mpi_abort need not linger for them */
        for (int k = 0; g_named && k < nr; k++) g_named[ranks[k]] = true;
        qsort(ranks, (size_t)nr, sizeof *ranks, cmp_int);
        char list[64];
        ms_flight_format_ranks(ranks, nr, list, sizeof list);
        len += (size_t)snprintf(call->note + len, sizeof call->note - len,
                                "%shost %s unreachable from host %s: none of its ranks (world %s) "
                                "answers, a link or the host is down",
                                len ? "; " : "", host, g_host_of[g_health_rank], list);
        if (len >= sizeof call->note) break;
    }
}

/* Narrows the suspects of a timeout (call->missing; every peer when all_arrived, i.e. the data
 * transfer stalled after every member entered) to the ranks to name, see ms_comm_blame; and
 * names the hosts that do not answer at all (name_unreachable). */
static void name_missing(const mpi_ctx *m, ms_comm_call *call, bool all_arrived) {
    int suspects[64], world[128], named[64];
    ms_peer_state state[128];
    int n = 0, nw = 0;
    if (all_arrived) {
        for (int p = 0; p < m->size && n < 64; p++)
            if (p != m->rank) suspects[n++] = p;
    } else {
        n = call->n_missing;
        memcpy(suspects, call->missing, sizeof(int) * (size_t)n);
    }
    for (int i = 0; i < n; i++) world[nw++] = m->world_of[suspects[i]];
    for (int i = 0; i < n; i++) add_host_ranks(world, &nw, m->world_of[suspects[i]]);
    health_check(call, world, nw, state);
    call->n_missing = ms_comm_blame(suspects, state, n, all_arrived, call->missing);
    if (!g_named && g_health != MPI_COMM_NULL) g_named = xcalloc((size_t)g_health_size, 1);
    for (int i = 0; i < call->n_missing; i++) {
        named[i] = m->world_of[call->missing[i]];
        if (g_named) g_named[named[i]] = true;
    }
    name_unreachable(call, world, nw, state, named, call->n_missing);
}

/* Notice payload sent after a timeout to the peers that had not arrived: "I gave up". */
static const int k_withdrawn = -2;

/* Times out the entry of a collective: names the peers whose notice has not arrived,
 * cancels those receives and tells each such peer that we gave up, so that it fails at
 * once if it arrives later instead of waiting for a collective nobody else will join. */
static ms_status enter_timed_out(mpi_ctx *m, ms_comm_call *call, ms_error *err) {
    (void)err; /* the shared layer formats timeouts from call->missing */
    poison(m);
    call->n_missing = 0;
    for (int p = 0; p < m->size; p++) {
        if (p == m->rank || m->note_req[p] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        if (MPI_Test(&m->note_req[p], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) continue;
        if (call->n_missing < (int)(sizeof call->missing / sizeof call->missing[0]))
            call->missing[call->n_missing++] = p;
        /* Cancelling a receive completes locally, so the wait cannot hang. */
        MPI_Cancel(&m->note_req[p]);
        MPI_Wait(&m->note_req[p], MPI_STATUS_IGNORE);
        MPI_Request req;
        if (MPI_Isend(&k_withdrawn, 1, MPI_INT, p, m->tag, m->ctl, &req) == MPI_SUCCESS)
            MPI_Request_free(&req); /* a static buffer: the send may finish whenever */
    }
    /* Our own notice sends are left to finish (sends cannot be cancelled reliably); they
     * are tiny eager messages, and the poisoned context keeps their buffer alive. Every notice
     * arrived but one of ours did not leave: treated as a stalled transfer. */
    name_missing(m, call, call->n_missing == 0);
    return MS_ERR_TIMEOUT;
}

/* After every notice arrived: checks that all peers entered the same kind of collective
 * and that none of them had already given up on it (see enter_timed_out). */
static ms_status check_notes(mpi_ctx *m, ms_comm_call *call, ms_error *err) {
    for (int p = 0; p < m->size; p++) {
        if (p == m->rank) continue;
        if (m->note_in[p] != m->note_out) {
            poison(m);
            int in = m->note_in[p];
            return ms_fail(err, MS_ERR_COMM,
                           "ranks called collectives in different orders: rank %d entered %s "
                           "(%s) while this rank (%d) entered %s (%s)",
                           p, ms_coll_name((ms_coll_kind)(in / MS_COMM_DTYPE_COUNT)),
                           ms_comm_dtype_name((ms_comm_dtype)(in % MS_COMM_DTYPE_COUNT)), m->rank,
                           ms_coll_name(call->kind), ms_comm_dtype_name(call->dtype));
        }
    }
    /* A withdrawal follows a notice with the same tag, and messages between two ranks do
     * not overtake each other, so it is visible here if it was sent in time. Every notice of
     * this tag has been received, so anything left with it is a withdrawal; one wildcard
     * probe keeps the common path cheap. */
    int flag = 0;
    MPI_Status stat;
    MPI_Iprobe(MPI_ANY_SOURCE, m->tag, m->ctl, &flag, &stat);
    if (flag) {
        poison(m);
        return ms_fail(err, MS_ERR_COMM,
                       "rank %d had already timed out on this %s before this rank (%d) arrived",
                       stat.MPI_SOURCE, ms_coll_name(call->kind), m->rank);
    }
    return MS_OK;
}

/* Enters a collective: every member sends an arrival notice to each peer on the control
 * communicator and waits for all of theirs before any data moves. A missing rank is thus
 * detected while no data operation is posted, so nothing is left in flight that could
 * later write into the caller's buffers: a data operation can only complete once every
 * member has posted it, and a member that timed out here never posts it. */
static ms_status coll_enter(mpi_ctx *m, ms_comm_call *call, ms_error *err) {
    call->algo = "mpi";
    m->coll_seq++;
    m->tag = (int)(m->coll_seq & 0x7fff);
    m->note_out = note_of(call->kind, call->dtype);
    for (int p = 0; p < m->size; p++) {
        if (p == m->rank) continue;
        m->note_in[p] = -1;
        int rc = MPI_Irecv(&m->note_in[p], 1, MPI_INT, p, m->tag, m->ctl, &m->note_req[p]);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Irecv (arrival notice)");
    }
    for (int p = 0; p < m->size; p++) {
        if (p == m->rank) continue;
        int rc = MPI_Isend(&m->note_out, 1, MPI_INT, p, m->tag, m->ctl, &m->note_req[m->size + p]);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Isend (arrival notice)");
    }
    int spins = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Testall(2 * m->size, m->note_req, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Testall (arrival notices)");
        if (flag) break;
        if (ms_now_ns() > call->deadline_ns) return enter_timed_out(m, call, err);
        backoff(&spins);
    }
    return check_notes(m, call, err);
}

/* Polls the data requests of a collective that every member entered. A timeout here means
 * the transfer itself stalled (a rank died or stopped mid-way): the request is abandoned
 * in flight, and the missing ranks are the peers that do not answer (name_missing). */
static ms_status wait_data(mpi_ctx *m, MPI_Request *reqs, int n, ms_comm_call *call,
                           ms_error *err) {
    int spins = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Testall");
        if (flag) return MS_OK;
        if (ms_now_ns() > call->deadline_ns) {
            poison(m);
            name_missing(m, call, true);
            return MS_ERR_TIMEOUT;
        }
        backoff(&spins);
    }
}

/* --- context --------------------------------------------------------------------------------- */

/* Duplicates `src` without blocking past the deadline. */
static ms_status idup(MPI_Comm src, MPI_Comm *out, int64_t deadline_ns, ms_error *err) {
    MPI_Request req;
    int rc = MPI_Comm_idup(src, out, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(NULL, err, rc, "MPI_Comm_idup");
    int spins = 0;
    for (;;) {
        int flag = 0;
        rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(NULL, err, rc, "MPI_Comm_idup");
        if (flag) break;
        if (ms_now_ns() > deadline_ns) {
            /* The pending idup may still complete: the caller leaks what it involves. */
            return ms_fail(err, MS_ERR_TIMEOUT,
                           "duplicating an MPI communicator timed out: not every member "
                           "arrived");
        }
        backoff(&spins);
    }
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return MS_OK;
}

/* Fills g_host_of from every rank of the health communicator (a non-blocking all-gather
 * under the deadline: a rank that never arrives times out, as in idup). */
static ms_status gather_host_names(int64_t deadline_ns, ms_error *err) {
    char mine[HOST_NAME_CAP] = "";
    if (gethostname(mine, sizeof mine - 1) != 0) snprintf(mine, sizeof mine, "?");
    char(*all)[HOST_NAME_CAP] = xcalloc((size_t)g_health_size, sizeof *all);
    MPI_Request req;
    int rc =
        MPI_Iallgather(mine, HOST_NAME_CAP, MPI_CHAR, all, HOST_NAME_CAP, MPI_CHAR, g_health, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(NULL, err, rc, "MPI_Iallgather of the host names");
    for (int spins = 0, flag = 0; !flag;) {
        rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(NULL, err, rc, "MPI_Iallgather of the host names");
        if (!flag && ms_now_ns() > deadline_ns)
            return ms_fail(err, MS_ERR_TIMEOUT,
                           "gathering the ranks' host names timed out: not every rank arrived");
        if (!flag) backoff(&spins);
    }
    for (int w = 0; w < g_health_size; w++) all[w][HOST_NAME_CAP - 1] = '\0';
    g_host_of = all;
    return MS_OK;
}

/* Builds the context of a group whose data communicator is `comm` (taken over). */
static ms_status ctx_create(MPI_Comm comm, int64_t deadline_ns, mpi_ctx **out, ms_error *err) {
    *out = NULL;
    mpi_ctx *m = xcalloc(1, sizeof *m);
    m->comm = comm;
    m->ctl = MPI_COMM_NULL;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &m->rank);
    MPI_Comm_size(comm, &m->size);
    ms_status st = idup(comm, &m->ctl, deadline_ns, err);
    if (st != MS_OK) {
        /* A half-finished idup may still complete; leak m and comm rather than free them. */
        return st;
    }
    size_t n = (size_t)m->size;
    m->note_in = xcalloc(n, sizeof *m->note_in);
    m->note_req = xmalloc(2 * n * sizeof *m->note_req);
    for (size_t i = 0; i < 2 * n; i++) m->note_req[i] = MPI_REQUEST_NULL;
    m->ibuf = xcalloc(4 * n, sizeof *m->ibuf);
    m->world_of = xmalloc(n * sizeof *m->world_of);
    MPI_Group group, world;
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    for (int p = 0; p < m->size; p++) m->ibuf[p] = p;
    MPI_Group_translate_ranks(group, m->size, m->ibuf, world, m->world_of);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    *out = m;
    return MS_OK;
}

static void mpi_destroy(void *ctx) {
    mpi_ctx *m = ctx;
    if (!m) return;
    if (m->poisoned) return; /* on purpose: see the top of this file */
    MPI_Comm_free(&m->ctl);
    MPI_Comm_free(&m->comm);
    free(m->note_in);
    free(m->note_req);
    free(m->ibuf);
    free(m->p2p_req);
    free(m->world_of);
    free(m);
}

/* --- slots ----------------------------------------------------------------------------------- */

/* MPI counts are int: larger single-count operations run in chunks of this many elements. */
#define CHUNK         ((size_t)1 << 30)

/* bf16 reductions must equal ms_reduce_bf16 bit for bit (fp32 in rank order, rounded once),
 * which a user MPI_Op cannot give: MPI reduces pairwise and would round at every step. So the
 * blocks travel raw and their owner reduces them: member p sends block q (sc[q] elements at
 * sd[q] of send) to member q and receives every member's block `mine` into scratch, which it
 * reduces into out; the caller checked that mine * size fits an int. The scratch is freed on
 * success only: after a timeout MPI may still touch it (the context is poisoned, see the top of
 * this file). */
static ms_status bf16_exchange_reduce(mpi_ctx *m, const void *send, const int *sc, const int *sd,
                                      int mine, uint16_t *out, ms_reduce_op op, ms_comm_call *call,
                                      ms_error *err) {
    const int n = m->size;
    int *rcnt = m->ibuf + 2 * n, *rdsp = m->ibuf + 3 * n;
    for (int p = 0; p < n; p++) rcnt[p] = mine, rdsp[p] = p * mine;
    uint16_t *blocks = xmalloc(((size_t)mine * (size_t)n + 1) * sizeof *blocks);
    MPI_Request req;
    int rc =
        MPI_Ialltoallv(send, sc, sd, MPI_UINT16_T, blocks, rcnt, rdsp, MPI_UINT16_T, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Ialltoallv (bf16 reduction)");
    MS_CHECK(wait_data(m, &req, 1, call, err));
    const uint16_t **src = xmalloc((size_t)n * sizeof *src);
    for (int p = 0; p < n; p++) src[p] = blocks + (size_t)p * (size_t)mine;
    ms_reduce_bf16(out, src, n, (size_t)mine, op);
    free(src);
    free(blocks);
    return MS_OK;
}

/* bf16: the chunks of the balanced split reduced by their owners, then gathered. */
static ms_status bf16_all_reduce(mpi_ctx *m, const void *send, void *recv, size_t count,
                                 ms_reduce_op op, ms_comm_call *call, ms_error *err) {
    const int n = m->size;
    if (!fits_int(count + (size_t)n)) return too_big(err, "a bf16 all_reduce");
    int *sc = m->ibuf, *sd = m->ibuf + n;
    for (int p = 0; p < n; p++) {
        sc[p] = (int)(count / (size_t)n + ((size_t)p < count % (size_t)n));
        sd[p] = p ? sd[p - 1] + sc[p - 1] : 0;
    }
    MS_CHECK(coll_enter(m, call, err));
    const int mine = sc[m->rank];
    uint16_t *chunk = xmalloc(((size_t)mine + 1) * sizeof *chunk);
    MS_CHECK(bf16_exchange_reduce(m, send, sc, sd, mine, chunk, op, call, err));
    MPI_Request req;
    int rc = MPI_Iallgatherv(chunk, mine, MPI_UINT16_T, recv, sc, sd, MPI_UINT16_T, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Iallgatherv (bf16 all_reduce)");
    MS_CHECK(wait_data(m, &req, 1, call, err));
    free(chunk);
    return MS_OK;
}

static ms_status mpi_all_reduce(void *ctx, const void *send, void *recv, size_t count,
                                ms_reduce_op op, ms_comm_call *call, ms_error *err) {
    mpi_ctx *m = ctx;
    if (call->dtype == MS_COMM_BF16) return bf16_all_reduce(m, send, recv, count, op, call, err);
    MS_CHECK(coll_enter(m, call, err));
    const float *fs = send;
    float *fr = recv;
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t n = count - off < CHUNK ? count - off : CHUNK;
        MPI_Request req;
        const void *s = fs == fr ? MPI_IN_PLACE : (const void *)(fs + off);
        int rc = MPI_Iallreduce(s, fr + off, (int)n, MPI_FLOAT, mpi_op(op), m->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Iallreduce");
        MS_CHECK(wait_data(m, &req, 1, call, err));
    }
    ms_reduce_finish(fr, count, op, m->size);
    return MS_OK;
}

static ms_status mpi_reduce_scatter(void *ctx, const void *send, void *recv,
                                    const size_t *recv_counts, ms_reduce_op op, ms_comm_call *call,
                                    ms_error *err) {
    mpi_ctx *m = ctx;
    size_t total = 0, most = 0; /* the same on every member, so all refuse alike */
    for (int p = 0; p < m->size; p++) {
        if (!fits_int(recv_counts[p])) return too_big(err, "a reduce_scatter block");
        m->ibuf[p] = (int)recv_counts[p];
        m->ibuf[m->size + p] = (int)total; /* bf16: the block's displacement */
        total += recv_counts[p];
        most = recv_counts[p] > most ? recv_counts[p] : most;
    }
    if (!fits_int(total)) return too_big(err, "the reduce_scatter input");
    if (call->dtype == MS_COMM_BF16 && !fits_int(most * (size_t)m->size))
        return too_big(err, "a bf16 reduce_scatter block times the group size");
    MS_CHECK(coll_enter(m, call, err));
    if (call->dtype == MS_COMM_BF16)
        return bf16_exchange_reduce(m, send, m->ibuf, m->ibuf + m->size, m->ibuf[m->rank], recv, op,
                                    call, err);
    MPI_Request req;
    int rc = MPI_Ireduce_scatter(send, recv, m->ibuf, MPI_FLOAT, mpi_op(op), m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Ireduce_scatter");
    MS_CHECK(wait_data(m, &req, 1, call, err));
    ms_reduce_finish(recv, recv_counts[m->rank], op, m->size);
    return MS_OK;
}

static ms_status mpi_all_gather(void *ctx, const void *send, void *recv, const size_t *counts,
                                ms_comm_call *call, ms_error *err) {
    mpi_ctx *m = ctx;
    int *cnt = m->ibuf, *displ = m->ibuf + m->size;
    size_t off = 0;
    for (int p = 0; p < m->size; p++) {
        if (!fits_int(counts[p]) || !fits_int(off + counts[p]))
            return too_big(err, "the all_gather output");
        cnt[p] = (int)counts[p];
        displ[p] = (int)off;
        off += counts[p];
    }
    MS_CHECK(coll_enter(m, call, err));
    MPI_Request req;
    const MPI_Datatype type = mpi_type(call->dtype);
    int rc = MPI_Iallgatherv(send, cnt[m->rank], type, recv, cnt, displ, type, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Iallgatherv");
    return wait_data(m, &req, 1, call, err);
}

static ms_status mpi_all_to_all(void *ctx, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs, ms_comm_call *call, ms_error *err) {
    mpi_ctx *m = ctx;
    int n = m->size;
    int *sc = m->ibuf, *sd = m->ibuf + n, *rcn = m->ibuf + 2 * n, *rd = m->ibuf + 3 * n;
    for (int p = 0; p < n; p++) {
        if (!fits_int(send_counts[p]) || !fits_int(send_displs[p]) || !fits_int(recv_counts[p]) ||
            !fits_int(recv_displs[p]))
            return too_big(err, "an all_to_all count or displacement");
        sc[p] = (int)send_counts[p];
        sd[p] = (int)send_displs[p];
        rcn[p] = (int)recv_counts[p];
        rd[p] = (int)recv_displs[p];
    }
    MS_CHECK(coll_enter(m, call, err));
    MPI_Request req;
    const MPI_Datatype type = mpi_type(call->dtype);
    int rc = MPI_Ialltoallv(send, sc, sd, type, recv, rcn, rd, type, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Ialltoallv");
    return wait_data(m, &req, 1, call, err);
}

static ms_status mpi_broadcast(void *ctx, void *buf, size_t count, int root, ms_comm_call *call,
                               ms_error *err) {
    mpi_ctx *m = ctx;
    const size_t elem = ms_comm_dtype_size(call->dtype);
    MS_CHECK(coll_enter(m, call, err));
    for (size_t off = 0; off < count; off += CHUNK) {
        size_t n = count - off < CHUNK ? count - off : CHUNK;
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + off * elem, (int)n, mpi_type(call->dtype), root, m->comm,
                            &req);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Ibcast");
        MS_CHECK(wait_data(m, &req, 1, call, err));
    }
    return MS_OK;
}

static ms_status mpi_barrier(void *ctx, ms_comm_call *call, ms_error *err) {
    /* Entering is itself a barrier: a rank returns once every peer has sent its notice,
     * i.e. entered. An MPI_Ibarrier on top would only double the messages. */
    return coll_enter(ctx, call, err);
}

/* A p2p batch is not collective (only the named peers take part), so it does not advance
 * coll_seq and sends no notices; on timeout the peers of the unfinished operations are
 * the missing ranks. User tags go on the data communicator, apart from the notices. */
static ms_status p2p_start(mpi_ctx *m, const ms_p2p_op *ops, int nops, MPI_Request *req,
                           ms_comm_call *call, ms_error *err) {
    call->algo = "mpi";
    for (int i = 0; i < nops; i++)
        if (!fits_int(ops[i].count)) return too_big(err, "a send/recv count");
    const MPI_Datatype type = mpi_type(call->dtype);
    for (int i = 0; i < nops; i++) {
        const ms_p2p_op *o = &ops[i];
        /* Synchronous sends: a send completes only once the receiver matched it, as on the
         * threads backend and in NCCL, so an absent receiver is a timeout naming it rather
         * than a send that "succeeded" into MPI's eager buffers. */
        int rc = o->kind == MS_P2P_SEND
                     ? MPI_Issend(o->buf, (int)o->count, type, o->peer, o->tag, m->comm, &req[i])
                     : MPI_Irecv(o->buf, (int)o->count, type, o->peer, o->tag, m->comm, &req[i]);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Issend/MPI_Irecv");
    }
    return MS_OK;
}

/* Tests a started batch: once, or (wait) until done or the deadline. */
static ms_status p2p_finish(mpi_ctx *m, const ms_p2p_op *ops, int nops, MPI_Request *req, bool wait,
                            bool *done, ms_comm_call *call, ms_error *err) {
    int spins = 0;
    *done = false;
    for (;;) {
        int flag = 0;
        int rc = MPI_Testall(nops, req, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Testall");
        if (flag) {
            *done = true;
            return MS_OK;
        }
        if (ms_now_ns() > call->deadline_ns) break;
        if (!wait) return MS_OK;
        backoff(&spins);
    }
    /* Timeout: name the peers whose operations did not finish. Unfinished receives are
     * cancelled (local, so the wait returns), so a late sender can never write into the
     * caller's buffer; unfinished sends cannot be withdrawn and may still be read by a late
     * receiver (poisoned context). */
    poison(m);
    call->n_missing = 0;
    for (int i = 0; i < nops; i++) {
        int flag = 0;
        if (req[i] == MPI_REQUEST_NULL) continue;
        if (MPI_Test(&req[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) continue;
        if (ops[i].kind == MS_P2P_RECV) {
            MPI_Cancel(&req[i]);
            MPI_Wait(&req[i], MPI_STATUS_IGNORE);
        }
        bool seen = false;
        for (int j = 0; j < call->n_missing; j++) seen |= call->missing[j] == ops[i].peer;
        if (!seen && call->n_missing < (int)(sizeof call->missing / sizeof call->missing[0]))
            call->missing[call->n_missing++] = ops[i].peer;
    }
    name_missing(m, call, false);
    return MS_ERR_TIMEOUT;
}

static ms_status mpi_p2p(void *ctx, const ms_p2p_op *ops, int nops, ms_comm_call *call,
                         ms_error *err) {
    mpi_ctx *m = ctx;
    if (nops > m->p2p_cap) {
        m->p2p_cap = nops > 2 * m->p2p_cap ? nops : 2 * m->p2p_cap;
        free(m->p2p_req);
        m->p2p_req = xmalloc((size_t)m->p2p_cap * sizeof *m->p2p_req);
    }
    bool done;
    MS_CHECK(p2p_start(m, ops, nops, m->p2p_req, call, err));
    return p2p_finish(m, ops, nops, m->p2p_req, true, &done, call, err);
}

/* A non-blocking batch: the caller's operations and their MPI requests. */
typedef struct mbatch {
    const ms_p2p_op *ops;
    int nops;
    MPI_Request req[];
} mbatch;

static ms_status mpi_p2p_post(void *ctx, const ms_p2p_op *ops, int nops, ms_comm_call *call,
                              void **req, ms_error *err) {
    mbatch *b = xcalloc(1, sizeof *b + sizeof b->req[0] * (size_t)nops);
    b->ops = ops;
    b->nops = nops;
    for (int i = 0; i < nops; i++) b->req[i] = MPI_REQUEST_NULL;
    ms_status st = p2p_start(ctx, ops, nops, b->req, call, err);
    if (st != MS_OK) {
        free(b); /* as in ms_p2p, operations started before the failure stay with MPI */
        return st;
    }
    *req = b;
    return MS_OK;
}

static ms_status mpi_p2p_poll(void *ctx, void *req, bool wait, bool *done, ms_comm_call *call,
                              ms_error *err) {
    mbatch *b = req;
    ms_status st = p2p_finish(ctx, b->ops, b->nops, b->req, wait, done, call, err);
    if (*done || st != MS_OK) free(b);
    return st;
}

static ms_status mpi_split(void *ctx, int color, int key, void **out_ctx, int *out_size,
                           int *out_rank, int *out_members, ms_comm_call *call, ms_error *err) {
    mpi_ctx *m = ctx;
    *out_ctx = NULL;
    /* First learn every (color, key) with a non-blocking all-gather under the deadline, so
     * that the blocking MPI_Comm_split below only runs once every member has arrived. Its
     * buffers live in the context (ibuf holds 4*size ints), not on the stack, because an
     * all-gather abandoned by a timeout may still read or write them later. */
    int *all = m->ibuf, *mine = m->ibuf + 2 * m->size;
    mine[0] = color < 0 ? -1 : color;
    mine[1] = key;
    MS_CHECK(coll_enter(m, call, err));
    MPI_Request req;
    int rc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Iallgather (split colors)");
    MS_CHECK(wait_data(m, &req, 1, call, err));

    MPI_Comm sub = MPI_COMM_NULL;
    rc = MPI_Comm_split(m->comm, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    if (rc != MPI_SUCCESS) return mpi_fail(m, err, rc, "MPI_Comm_split");
    if (color < 0) return MS_OK;

    int me = -1;
    int n = ms_split_order(all, m->size, color, m->rank, out_members, &me);
    int sub_rank = -1, sub_size = 0;
    MPI_Comm_rank(sub, &sub_rank);
    MPI_Comm_size(sub, &sub_size);
    if (sub_rank != me || sub_size != n) {
        MPI_Comm_free(&sub);
        return ms_fail(err, MS_ERR_INTERNAL,
                       "MPI_Comm_split gave rank %d of %d but (key, rank) order gives %d of %d",
                       sub_rank, sub_size, me, n);
    }
    mpi_ctx *child;
    MS_CHECK(ctx_create(sub, call->deadline_ns, &child, err));
    *out_ctx = child;
    *out_size = n;
    *out_rank = me;
    return MS_OK;
}

/* A progress thread may call MPI while the caller's thread does too only under
 * MPI_THREAD_MULTIPLE (ms_mpi_init asks for it). */
static bool mpi_async_ok(void *ctx) {
    (void)ctx;
    return g_thread_level >= MPI_THREAD_MULTIPLE;
}

/* Any MPI call runs OpenMPI's progress engine, which advances every request in flight;
 * a probe for a tag no call uses is the cheapest. */
static void mpi_progress(void *ctx) {
    (void)ctx;
    int flag = 0;
    if (g_thread_level >= MPI_THREAD_MULTIPLE && g_health != MPI_COMM_NULL)
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_PROGRESS, g_health, &flag, MPI_STATUS_IGNORE);
}

static const ms_comm_backend_ops mpi_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_to_all = mpi_all_to_all,
    .broadcast = mpi_broadcast,
    .p2p = mpi_p2p,
    .p2p_post = mpi_p2p_post,
    .p2p_poll = mpi_p2p_poll,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .destroy = mpi_destroy,
    .async_ok = mpi_async_ok,
    .progress = mpi_progress,
};

/* --- public ---------------------------------------------------------------------------------- */

ms_status ms_mpi_init(int *argc, char ***argv, ms_error *err) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) return MS_OK;
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(NULL, err, rc, "MPI_Init_thread");
    g_we_initialised = true;
    g_thread_level = provided;
    /* With less than SERIALIZED only the main thread may call MPI, which is also how the
     * MPI launcher uses it (one rank per process), so a lower level is accepted; below
     * MULTIPLE, non-blocking calls run at issue (mpi_async_ok). */
    return MS_OK;
}

void ms_mpi_finalize(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (g_we_initialised && !fin) MPI_Finalize();
    g_we_initialised = false;
}

bool ms_mpi_failed(void) {
    return g_failed;
}

_Noreturn void ms_mpi_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin && g_failed) linger();
    if (inited && !fin) MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code); /* MPI_Abort does not return; this is for when MPI is not running */
}

ms_status ms_comm_mpi_create_world(ms_comm **out, ms_error *err) {
    *out = NULL;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin)
        return ms_fail(err, MS_ERR_INVALID,
                       "MPI is %s; call ms_mpi_init first (and start the program with mpirun)",
                       fin ? "already finalised" : "not initialised");
    /* The duplicates get MPI_ERRORS_RETURN (ctx_create); MPI_COMM_WORLD's own handler is
     * the application's business and is left alone. */
    int64_t deadline = ms_now_ns() + (int64_t)MS_COMM_DEFAULT_TIMEOUT_MS * 1000000;
    if (g_health == MPI_COMM_NULL) {
        /* Published only once complete: the wait loops (backoff) probe it. */
        MPI_Comm health;
        MS_CHECK(idup(MPI_COMM_WORLD, &health, deadline, err));
        MPI_Comm_rank(health, &g_health_rank);
        MPI_Comm_size(health, &g_health_size);
        g_health = health;
        MS_CHECK(gather_host_names(deadline, err));
    }
    MPI_Comm data;
    MS_CHECK(idup(MPI_COMM_WORLD, &data, deadline, err));
    mpi_ctx *m;
    MS_CHECK(ctx_create(data, deadline, &m, err));
    int *world = xmalloc((size_t)m->size * sizeof *world);
    for (int i = 0; i < m->size; i++) world[i] = i;
    *out = ms_comm_wrap(&mpi_ops, m, m->rank, m->size, world, "world");
    free(world);
    return MS_OK;
}

#endif /* MS_HAVE_MPI */
