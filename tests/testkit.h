/* testkit.h - running test bodies on every rank, on the threads or the MPI backend.
 *
 * A test body is written once as a rank function. mt_run starts it on n thread ranks, or,
 * when the test binary runs under mpirun, once per MPI process (the world may be larger
 * than n: ranks >= n get ctx->rank >= n and usually just take part in mesh creation).
 * cmocka's asserts are not thread-safe, so rank functions record failures with MT_CHECK
 * and keep going (never leave a collective sequence early); mt_run then fails the cmocka
 * test on every rank if any rank failed, printing the first messages.
 */
#ifndef MS_TESTKIT_H
#define MS_TESTKIT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
// clang-format off
#include <cmocka.h>
// clang-format on

#include "engine/data/dataset.h"
#include "engine/runtime/ctx.h"
#include "engine/train/trainer.h"

typedef struct mt_rank {
    ms_ctx *ctx;
    int failures;
    char first[1024];
} mt_rank;

typedef void (*mt_rank_fn)(mt_rank *r, void *arg);

/* --- a trainer's whole state, for comparing runs ------------------------------------------ */

#define MT_MAX_STATE 256
typedef struct mt_state {
    int n;
    float *data[MT_MAX_STATE]; /* world rank 0: each state tensor whole (owned) */
    int64_t len[MT_MAX_STATE];
} mt_state;

/* Collective over the trainer's ranks: every state tensor (each parameter, then its Adam m and
 * v) gathered whole; only world rank 0 fills *out (thread ranks share it). */
void mt_gather_state(mt_rank *r, ms_trainer *tr, mt_state *out, ms_error *err);
void mt_state_free(mt_state *s);
/* Fails naming the first tensor of got off want's by more than 1e-4 of its scale plus 5% of
 * an lr step: reduction order differs between layouts and Adam amplifies it (m / sqrt(v) is
 * the same size whatever the gradient's, so where a gradient is all rounding noise the update
 * differs by a fraction of lr), while a shard moved to the wrong place is off by the weights'
 * own scale and an update lost or doubled by lr. */
void mt_state_check(const mt_state *got, const mt_state *want, double lr);

void mt_failf(mt_rank *r, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define MT_CHECK(r, cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) mt_failf((r), __FILE__, __LINE__, __VA_ARGS__);                               \
    } while (0)

/* Records a failing status with its message; returns true when st == MS_OK. */
#define MT_OK(r, st, err) mt_ok_at((r), (st), (err), __FILE__, __LINE__)
int mt_ok_at(mt_rank *r, ms_status st, const ms_error *err, const char *file, int line);

/* Runs fn on nranks ranks (see above). Fails the current cmocka test on error. */
void mt_run(int nranks, mt_rank_fn fn, void *arg);

/* mt_run with every rank's ctx->device of `device` (MS_DEVICE_FENCED: memory the host
 * cannot touch, engine/core/device.h). */
void mt_run_device(int nranks, ms_device_kind device, mt_rank_fn fn, void *arg);

/* Runs fn on nranks threads even when the binary runs under mpirun (for references). */
void mt_run_threads(int nranks, mt_rank_fn fn, void *arg);

/* This process's MPI world rank, or 0 on the threads backend. */
int mt_world_rank(void);

/* Text a model can learn a little of: `line` repeated 64 times, as data for sequences of
 * `seq` tokens with a tenth held out for validation. */
ms_status mt_repeated_text(const char *line, int seq, ms_text_data *d, ms_error *err);

/* For tests that run the meshscope binary: writes DIR/text.txt (400 verses of text) and
 * DIR/model.json (a GPT of 2 layers, 4 heads, n_embd channels, 32 positions) and returns their
 * paths in text and model (each at least 300 bytes). Returns 0, or -1 if a file cannot be
 * written. */
int mt_write_job_files(const char *dir, int n_embd, char *text, char *model);

/* The small model the equivalence tests train: 4 layers, 4 heads, 32 channels, bytes as
 * tokens, 16 positions; pdrop at every dropout site. */
ms_model_config mt_tiny_config(bool bert, double pdrop);
/* configs/NAME of the source tree ("gpt-bench.json"); fails the test if it does not load. */
ms_model_config mt_source_config(const char *name);

/* What the equivalence tests train with: `steps` AdamW steps on batch x seq (warmup, cosine
 * decay, weight decay and clipping all on, seed 11), so the comparisons exercise all of them. */
ms_train_opts mt_train_opts(int batch, int seq, int steps);

/* The backend this test binary runs on. */
ms_backend_kind mt_backend(void);
/* World size under MPI, or 0 on the threads backend. */
int mt_mpi_world(void);

/* Fails the current cmocka test unless msg contains want and holds no control character (C0,
 * DEL, C1): text from a file must reach messages escaped (ms_safe_str). */
void mt_expect_escaped(const char *msg, const char *want);

/* "--filter PATTERN" in argv[1..2] runs only the tests whose names match PATTERN (cmocka's
 * wildcards * and ?), so that one binary can also serve as a ctest entry for a subset, such as
 * the hardening_* regression tests; "--skip PATTERN" runs all but those. mt_main applies it; a
 * binary with its own main calls it. */
void mt_apply_filter(int argc, char **argv);

/* The brute-force sweeps (every placement pair of test_reshard, every rule combination of
 * test_rules) take every case unless MS_SWEEP_STRIDE=K is set: run-tests.sh sets it for the
 * sanitizers, which look for memory errors and races in the machinery every case drives, not
 * for wrong arithmetic, which the release configuration checks on every case. Then a sweep
 * takes about one case in K, chosen by a hash of (i, salt), and always its case salt % n, so
 * every operator, mesh and shape keeps at least one case. All ranks decide alike. */
bool mt_sweep_take(long i, long n, long salt);
/* True when the sweeps take every case (no MS_SWEEP_STRIDE). */
bool mt_sweep_full(void);

/* main() for test binaries: sets up MPI when launched by mpirun, runs the group. */
int mt_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t n);
#define MT_MAIN(name, tests)                                                                       \
    int main(int argc, char **argv) {                                                              \
        return mt_main(argc, argv, name, tests, sizeof(tests) / sizeof((tests)[0]));               \
    }

/* Communicator timeout used by tests, short so that a bug fails fast. */
#define MT_TIMEOUT_MS 60000

#endif
