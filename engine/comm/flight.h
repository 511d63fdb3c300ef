/* flight.h - the flight recorder: every rank keeps the last MS_FLIGHT_RING collectives and
 * point-to-point batches it took part in (op, communicator, sequence number, bytes, peers,
 * state and times), so that a job that dies or hangs leaves a record of who was where.
 *
 * The shared communicator layer (comm.c) writes it for every backend: ms_flight_issue when a
 * call gets its sequence number, ms_flight_start when it begins to execute, ms_flight_end when
 * it returns. One recorder per world rank of the process (the threads backend runs all ranks
 * in one process, MPI one each), created on first use and kept for the process's lifetime: a
 * fixed ring, no allocation per call, a mutex per recorder (the caller's thread and its
 * communicators' progress threads write it).
 *
 * Dumps (docs/formats.md, "Flight recorder dumps"): on a timeout or a broken communicator
 * comm.c dumps the rank's recorder once, as JSON lines, to DIR/flight-rank<R>-pid<P>.jsonl
 * (DIR from ms_flight_set_dir; no dumps until it is set, or MS_FLIGHT_DIR in the environment).
 * ms_flight_install_signals makes SIGTERM and SIGABRT dump every recorder of the process too,
 * signal-safely (preformatted with no allocation, written with write(2)), then die as before.
 * A dump is written under a temporary name and renamed: it is whole or absent.
 *
 * Live records: while DIR is set, each recorder's ring lives in a file-backed shared mapping,
 * DIR/flight-rank<R>-pid<P>.ring, written in place by every call. A process killed at any
 * instant (mpirun's SIGKILL a few milliseconds after its SIGTERM, before the handler got to
 * run or finished its dump) leaves the kernel's copy of its last state on disk. The record is
 * removed once its dump is written, when DIR changes and when the process exits normally.
 * `meshscope doctor DIR` reads dumps and live records (profiler/flight_doctor.h). */
#ifndef MS_FLIGHT_H
#define MS_FLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"

#define MS_FLIGHT_RING        1024
#define MS_FLIGHT_MAX_MISSING 8
/* The largest world rank an entry can name: ranks are held in 16 bits (root, peer, missing).
 * Readers of dumps refuse ranks outside 0..MS_FLIGHT_MAX_RANK. */
#define MS_FLIGHT_MAX_RANK INT16_MAX

typedef enum ms_flight_state {
    MS_FLIGHT_ISSUED,  /* has its sequence number; queued behind earlier non-blocking calls */
    MS_FLIGHT_STARTED, /* executing: waiting for or moving data with its peers */
    MS_FLIGHT_DONE,
    MS_FLIGHT_FAILED,
    MS_FLIGHT_STATE_COUNT
} ms_flight_state;

const char *ms_flight_state_name(ms_flight_state s); /* "issued", "started", "done", "failed" */

/* What an entry says about its communicator; comm.c fills one per communicator once. */
typedef struct ms_flight_comm {
    char name[24];
    char ranks[48]; /* its world ranks, compact: "0-3", "0,2,4-7" ("..." when cut) */
    uint32_t id;    /* hash of name and members: the same on every member */
    int32_t rank;   /* this rank's position in it */
    int32_t size;
    int64_t timeout_ns;
} ms_flight_comm;

/* One recorded call. */
typedef struct ms_flight_entry {
    uint64_t ticket; /* position in the ring's history, from 1; 0: empty slot */
    int64_t seq;
    int64_t t_issue_ns, t_start_ns, t_end_ns; /* monotonic; 0 when not reached */
    uint64_t bytes;
    uint8_t kind;    /* ms_coll_kind */
    uint8_t dtype;   /* ms_comm_dtype */
    uint8_t state;   /* ms_flight_state */
    int8_t p2p_send; /* p2p: 1 when the first op is a send, 0 a receive */
    int16_t root;    /* broadcast root (world rank), else -1 */
    int16_t peer;    /* p2p: first op's peer (world rank), else -1 */
    int16_t n_p2p;
    int16_t status; /* ms_status of a finished call */
    int16_t n_missing;
    int16_t missing[MS_FLIGHT_MAX_MISSING]; /* world ranks a timeout named as not arrived */
    ms_flight_comm comm;
} ms_flight_entry;

typedef struct ms_flight ms_flight;

/* Describes communicator members for its entries: world_ranks[0..size). */
void ms_flight_comm_init(ms_flight_comm *fc, const char *name, const int *world_ranks, int size,
                         int rank);

/* The recorder of world rank `world_rank`, created on first use (with its live record when
 * DIR is set); NULL when out of range. Recorders live as long as the process. */
ms_flight *ms_flight_for_rank(int world_rank);
int ms_flight_rank(const ms_flight *f);
/* Creates the recorder of world_rank before its first call and notes the size of its world, so
 * that a rank killed before it communicated still leaves a record, and the doctor can name
 * ranks that left none. Launchers call it for each rank they run, once DIR is set. */
void ms_flight_prepare(int world_rank, int world_size);

/* Records a call; returns its ticket for ms_flight_start / ms_flight_end. */
typedef struct ms_flight_call {
    ms_coll_kind kind;
    ms_comm_dtype dtype;
    int64_t seq;
    uint64_t bytes;
    int root;      /* broadcast root, world rank; else -1 */
    int peer;      /* p2p: the first op's peer, world rank; else -1 */
    bool p2p_send; /* p2p: the first op is a send */
    int n_p2p;
} ms_flight_call;
uint64_t ms_flight_issue(ms_flight *f, const ms_flight_comm *fc, const ms_flight_call *call,
                         int64_t now_ns);
void ms_flight_start(ms_flight *f, uint64_t ticket, int64_t now_ns);
/* missing: world ranks a timeout named as not arrived (n_missing may be 0). */
void ms_flight_end(ms_flight *f, uint64_t ticket, ms_status st, const int *missing, int n_missing,
                   int64_t now_ns);

/* Copies the recorder's entries, oldest first, into out[0..cap); returns how many. */
int ms_flight_snapshot(ms_flight *f, ms_flight_entry *out, int cap);
/* Forgets every recorder's entries and dumps (tests run many jobs in one process); a recorder
 * whose live record went with its dump gets a new one when DIR is set. */
void ms_flight_reset(void);

/* --- dumps ---------------------------------------------------------------------------- */

/* Where dumps and live records go; NULL or "" turns them off. Copied. Existing recorders move
 * their live records to the new DIR (the old files are removed; none without a DIR). Not while
 * a signal may dump: launchers set it before their ranks start. */
void ms_flight_set_dir(const char *dir);
const char *ms_flight_dir(void);
/* Dumps f once (later calls do nothing) with `reason`; creates the folder. Returns whether a
 * dump of f exists, and its path in path[0..len) when path is not NULL. */
bool ms_flight_dump(ms_flight *f, const char *reason, char *path, size_t len);
/* Whether this process dumped any recorder, and the path of the i-th dump (NULL past it). */
const char *ms_flight_dump_path(int i);
/* SIGTERM and SIGABRT first mark every live record with the signal and its time, then dump
 * every recorder of the process (reason "SIGTERM"/"SIGABRT"), print one line per rank to
 * stderr saying where it was, and die of the signal. Idempotent. */
void ms_flight_install_signals(void);

/* One line that says where f's rank is: its oldest unfinished call, e.g. "rank 2 was in
 * all_reduce seq 12 on 'dp' (ranks 0-3) for 5.0 s", or its last call when all finished.
 * Signal-safe (no allocation, no stdio). */
size_t ms_flight_describe(const ms_flight_entry *e, int n, int rank, int64_t now_ns, char *out,
                          size_t len);

/* The call that tells where a rank is: its first failure, else its oldest call still
 * executing, else its oldest queued one; NULL when every call finished. */
const ms_flight_entry *ms_flight_where(const ms_flight_entry *e, int n);

/* "all_reduce seq 12 on 'dp' (ranks 0-3)" or "send to rank 3 seq 17 on 'pp' (ranks 0-3)";
 * returns its length. Signal-safe. */
size_t ms_flight_format_call(const ms_flight_entry *e, char *out, size_t len);

/* World ranks as a compact list, "0-3,6" ("..." when cut); returns its length. */
size_t ms_flight_format_ranks(const int *ranks, int n, char *out, size_t len);
/* The reverse: a compact list into out[0..cap); returns the count (the list stops at the first
 * character that continues none, such as a cut list's "..."), or -1 when it names a rank past
 * MS_FLIGHT_MAX_RANK (a dump's list is input: it may say anything). */
int ms_flight_parse_ranks(const char *s, int *out, int cap);

/* to - from, for times read from dumps: 0 when to is not later, INT64_MAX when the difference
 * does not fit, never an overflow. Signal-safe. */
int64_t ms_flight_span_ns(int64_t from, int64_t to);

/* --- live records, read back --------------------------------------------------------- */

/* What a live record's header says. Every field is checked or bounded when read. */
typedef struct ms_flight_live {
    int rank;       /* 0..MS_FLIGHT_MAX_RANK */
    int world_size; /* 0 (not known) .. MS_FLIGHT_MAX_RANK + 1 */
    int pid;
    char host[64];
    int term_sig;     /* SIGTERM or SIGABRT when one arrived before the end; else 0 */
    int64_t term_ns;  /* when it arrived; 0: none */
    int64_t last_ns;  /* the newest call's time: the state is as of then */
    uint64_t dropped; /* older calls the ring no longer held */
    int torn;         /* entries left out: being written when the process ended */
} ms_flight_live;

/* The size in bytes of a live record written by this build. */
size_t ms_flight_live_size(void);

/* Reads a live record from bytes[0..len) (untrusted: any bytes): its header into *info and its
 * valid entries, oldest first, into out[0..MS_FLIGHT_RING). Returns how many, or -1 with *why
 * saying what is wrong when it is no live record of this build (wrong size, magic, version or
 * layout, or a rank out of range). */
int ms_flight_live_read(const void *bytes, size_t len, ms_flight_live *info, ms_flight_entry *out,
                        const char **why);

/* --- hang alerts ---------------------------------------------------------------------- */

/* A call of a recorder of this process that has been executing far longer than usual: more
 * than `factor` times the median of its communicator's recent completions of the same op, and
 * more than min_ns. Writes one line naming the op, sequence number, communicator and the
 * members that have not entered it (known for the members that live in this process: the
 * threads backend; otherwise it says it waits) and returns true; false when nothing hangs. */
bool ms_flight_hang_alert(int64_t now_ns, double factor, int64_t min_ns, char *out, size_t len);

#endif
