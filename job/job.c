/* job.c - resolving a job's model and strategy, and launching its ranks (see job.h). */
#include "job/job.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "engine/comm/comm_mpi.h"
#include "engine/comm/flight.h"
#include "engine/core/xalloc.h"
#include "engine/io/fileio.h"
#include "engine/kernels/kernels.h"
#include "engine/model/onnx_def.h"
#include "engine/plan/auto_place.h"
#include "engine/plan/validate.h"
#include "engine/train/checkpoint.h"
#include "profiler/advisor.h"
#include "profiler/flight_doctor.h"

static ms_job_shape job_shape(const run_opts *o, const job_plan *plan) {
    return (ms_job_shape){.world = plan->world_size, .batch = o->batch, .seq = o->seq};
}

static ms_model_def user_model;
static bool have_user_model;

void job_use_model(const ms_model_def *def) {
    user_model = *def;
    have_user_model = true;
}

ms_status job_open_data(const run_opts *o, const job_plan *plan, double val_fraction,
                        ms_batch_source **out, ms_error *err) {
    ms_batch_source *src = NULL;
    ms_status st = ms_model_def_open_data(&plan->def, o->data, val_fraction, &src, err);
    if (st == MS_OK) st = ms_model_def_check_source(&plan->def, src, err);
    if (st != MS_OK) {
        ms_batch_source_close(src);
        src = NULL;
    }
    *out = src;
    return st;
}

void job_plan_free(job_plan *plan) {
    if (!have_user_model) ms_model_def_onnx_free(&plan->def);
}

bool job_has_model(void) {
    return have_user_model;
}

const ms_model_def *job_model(void) {
    return have_user_model ? &user_model : NULL;
}

const char *job_model_name(void) {
    return have_user_model ? user_model.name : NULL;
}

/* The job's model: the program's own, else --model's config as a built-in model. */
static ms_status read_model(const run_opts *o, job_plan *out, ms_error *err) {
    memset(&out->cfg, 0, sizeof out->cfg);
    if (have_user_model) {
        out->def = user_model;
        return ms_model_def_check(&out->def, err);
    }
    if (!o->model)
        return ms_fail(err, MS_ERR_INVALID, "--model CONFIG is required (a config.json)");
    size_t n = strlen(o->model);
    if (n > 5 && !strcmp(o->model + n - 5, ".onnx")) {
        ms_onnx_def_opts oo = {.loss = o->loss};
        return ms_model_def_from_onnx(o->model, &oo, &out->def, err);
    }
    if (o->loss)
        return ms_fail(err, MS_ERR_INVALID,
                       "--loss names an ONNX model's output; %s is a config, whose loss is "
                       "built in: leave --loss out",
                       o->model);
    MS_CHECK(ms_config_load(o->model, &out->cfg, err));
    return ms_model_def_from_config(&out->cfg, o->seq, &out->def, err);
}

ms_status job_plan_read(const run_opts *o, job_plan *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    MS_CHECK(read_model(o, out, err));
    out->rules.n = 0;
    if (o->strategy_file) {
        MS_CHECK(ms_strategy_load(o->strategy_file, &out->strat, &out->rules, err));
    } else {
        out->strat = o->strat;
    }
    out->world_size = ms_strategy_ranks(&out->strat);
    ms_job_shape job = job_shape(o, out);
    return ms_strategy_check_def(&out->strat, &out->def, &job, err);
}

/* Whether this process says what the job decided: the only one, or the first under mpirun. */
static bool says_notes(void) {
    const char *mpi_rank = getenv("OMPI_COMM_WORLD_RANK");
    return !mpi_rank || !strcmp(mpi_rank, "0");
}

/* --device: where the ranks train, said once. */
static ms_status resolve_device(const run_opts *o, ms_device_kind *kind, ms_error *err) {
    char note[512];
    MS_CHECK(ms_device_resolve((ms_device_choice)o->device, kind, note, sizeof note, err));
    if (note[0] && says_notes()) {
        printf("%s\n", note);
        fflush(stdout);
    }
    return MS_OK;
}

double job_bucket_mb(double flag, bool from_file, const ms_strategy *s, ms_device_kind kind) {
    if (from_file) return s->bucket_mb;
    if (flag >= 0) return flag;
    return kind == MS_DEVICE_CUDA && s->dp * s->cp > 1 ? JOB_CUDA_BUCKET_MB : 0;
}

/* --bucket-mb left at its default on a CUDA device: buckets, said once (as the device note). */
static void default_buckets(const run_opts *o, job_plan *plan, ms_device_kind kind) {
    if (o->strat_given >> MS_SET_bucket_mb & 1 || o->strategy_file) return;
    plan->strat.bucket_mb = (float)job_bucket_mb(-1, false, &plan->strat, kind);
    if (plan->strat.bucket_mb > 0 && says_notes()) {
        printf("gradient buckets: %g MiB, issued during backward (the default on CUDA; "
               "--bucket-mb 0 turns them off)\n",
               (double)plan->strat.bucket_mb);
        fflush(stdout);
    }
}

ms_status job_auto_placements(const run_opts *o, const job_plan *plan, const ms_strategy *s,
                              const ms_placement_rules *pins, ms_auto_place_result *r,
                              ms_error *err) {
    ms_cluster *cl = xmalloc(sizeof *cl);
    ms_status st = ms_cluster_resolve(plan->device == MS_DEVICE_CUDA ? "gpu-local" : "cpu-local",
                                      false, NULL, cl, err);
    if (st == MS_OK && cl->devices_per_node < plan->world_size)
        cl->devices_per_node = plan->world_size; /* ranks sharing devices: each priced alone */
    ms_plan_problem pb = {.devices = plan->world_size,
                          .global_batch = o->batch,
                          .seq = o->seq,
                          .dtype = s->precision == MS_PRECISION_BF16 ? MS_PLAN_BF16 : MS_PLAN_FP32,
                          .cluster = cl,
                          .engine_workloads = true,
                          .def = &plan->def};
    /* --memory-cap bounds the layout as it bounds a switch */
    ms_auto_place_opts ao = {.pins = pins,
                             .time_limit_s = o->auto_time_limit_s,
                             .mem_limit = o->memory_cap_mib * 1048576.0};
    if (st == MS_OK) st = ms_plan_auto_placements(&pb, s, &ao, r, err);
    if (st != MS_OK) st = ms_fail_wrap(err, st, "\"placements\": \"auto\"");
    free(cl);
    return st;
}

void job_auto_placements_say(const ms_auto_place_result *r) {
    if (!says_notes()) return;
    char *text = xmalloc(8192), bytes[32];
    ms_auto_place_rules_str(&r->rules, text, 8192);
    char mem[32];
    printf("auto placements: %s; predicted step %.3f ms, %s per rank, %s of collectives per step "
           "per rank",
           r->rules.n ? text : "none (tp 1: nothing to place)", r->best.step_s * 1e3,
           ms_plan_bytes_str(r->best.mem_total, mem, sizeof mem),
           ms_plan_bytes_str(r->coll_bytes, bytes, sizeof bytes));
    if (r->have_runner_up && r->runner_up.step_s < r->best.step_s)
        printf("; runner-up %.3f ms with %s of collectives (%s), within %.0f%% of the step, so "
               "the fewer bytes win",
               r->runner_up.step_s * 1e3,
               ms_plan_bytes_str(ms_plan_estimate_coll_bytes(&r->runner_up), bytes, sizeof bytes),
               r->runner_up_diff, r->tie * 100);
    else if (r->have_runner_up)
        printf("; runner-up %.3f ms (%s)", r->runner_up.step_s * 1e3, r->runner_up_diff);
    if (r->have_replicated)
        printf("; every weight replicated: %.3f ms, %s per rank", r->replicated.step_s * 1e3,
               ms_plan_bytes_str(r->replicated.mem_total, mem, sizeof mem));
    printf("; %d layout%s compiled in %.0f ms (%d classes, %d interacting pairs, %d round%s)\n",
           r->compiles, r->compiles == 1 ? "" : "s", r->search_ms, r->classes, r->pairs, r->rounds,
           r->rounds == 1 ? "" : "s");
    fflush(stdout);
    free(text);
}

/* "placements": "auto" (or "*": "auto" beside pins): the search before any rank starts, the
 * file's rules kept as its pins; one line says what it found. */
static ms_status resolve_auto_placements(const run_opts *o, job_plan *plan, ms_error *err) {
    if (!plan->rules.auto_place) return MS_OK;
    ms_auto_place_result *r = xmalloc(sizeof *r);
    ms_placement_rules *pins = xmalloc(sizeof *pins);
    *pins = plan->rules;
    ms_status st = job_auto_placements(o, plan, &plan->strat, pins, r, err);
    if (st == MS_OK) {
        plan->rules = r->rules;
        job_auto_placements_say(r);
    }
    free(pins);
    free(r);
    return st;
}

ms_status job_plan_validate(const run_opts *o, job_plan *plan, ms_error *err) {
    ms_job_shape job = job_shape(o, plan);
    MS_CHECK(ms_strategy_check_def(&plan->strat, &plan->def, &job, err));
    if (o->offload_serial && !plan->strat.offload)
        return ms_fail(err, MS_ERR_INVALID,
                       "--offload-serial orders the host optimizer of offload; add --offload (or "
                       "\"offload\": true in the strategy)");
    MS_CHECK(resolve_device(o, &plan->device, err));
    default_buckets(o, plan, plan->device);
    return resolve_auto_placements(o, plan, err);
}

ms_status job_plan_resolve(const run_opts *o, job_plan *out, ms_error *err) {
    MS_CHECK(job_plan_read(o, out, err));
    return job_plan_validate(o, out, err);
}

/* One output path: not a directory, and its directory takes a new file. */
static ms_status check_output(const char *flag, const char *path, ms_error *err) {
    if (!path) return MS_OK;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return ms_fail(err, MS_ERR_INVALID, "%s %s is a directory; give a file path", flag, path);
    char *copy = xstrdup(path);
    const char *dir = dirname(copy);
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/.meshscope-probe.XXXXXX", dir);
    int fd = mkstemp(probe);
    ms_status st = MS_OK;
    if (fd < 0)
        st = ms_fail(err, MS_ERR_IO, "%s %s: cannot create files in %s (%s); fix the path first",
                     flag, path, dir, strerror(errno));
    else
        close(fd), unlink(probe);
    free(copy);
    return st;
}

ms_status job_check_outputs(const run_opts *o, ms_error *err) {
    MS_CHECK(check_output("--save", o->save, err));
    if ((o->save_every || o->keep) && !o->save_dir)
        return ms_fail(err, MS_ERR_INVALID,
                       "--save-every and --keep need --save-dir DIR (where checkpoints go)");
    if (o->resume) {
        ms_ckpt_info info;
        MS_CHECK(ms_ckpt_describe(o->resume, &info, NULL, err));
        if (info.step > o->steps)
            return ms_fail(err, MS_ERR_INVALID,
                           "--resume %s: the checkpoint is at step %lld, past --steps %d (the "
                           "run's total): raise --steps",
                           o->resume, (long long)info.step, o->steps);
    }
    MS_CHECK(check_output("--trace", o->trace, err));
    return check_output("--log-jsonl", o->log_jsonl, err);
}

ms_status job_claim_save_dir(const run_opts *o, int *fd, ms_error *err) {
    *fd = -1;
    if (!o->save_dir || ms_mpi_launch_rank() != 0) return MS_OK;
    ms_status st = ms_dir_lock(o->save_dir, fd, err);
    return st == MS_OK ? MS_OK : ms_fail_wrap(err, st, "--save-dir");
}

ms_train_opts job_train_opts(const run_opts *o, bool keep_logits, bool inference) {
    return (ms_train_opts){.batch = o->batch,
                           .seq = o->seq,
                           .steps = o->steps,
                           .warmup = o->warmup,
                           .seed = o->seed,
                           .lr = o->lr,
                           .min_lr = o->min_lr,
                           .weight_decay = o->weight_decay,
                           .clip = o->clip,
                           .keep_logits = keep_logits,
                           .inference = inference,
                           .on_nonfinite = o->on_nan,
                           .offload_serial = o->offload_serial};
}

#define MS_FLIGHT_MAX_LOCAL 256 /* dumps one process reports: its thread ranks */

void job_report_flight(const char *cmd, bool mpi) {
    const char *paths[MS_FLIGHT_MAX_LOCAL];
    int n = 0;
    while (n < MS_FLIGHT_MAX_LOCAL && (paths[n] = ms_flight_dump_path(n))) n++;
    if (!n) return;
    ms_strbuf text = {0};
    ms_error err = {0};
    if (ms_doctor_files(paths, n, mpi, &text, &err) == MS_OK)
        fprintf(stderr, "meshscope %s: flight recorder (meshscope doctor %s):\n%s", cmd,
                ms_flight_dir(), text.p);
    else
        fprintf(stderr, "meshscope %s: flight recorder: %s\n", cmd, err.msg);
    free(text.p);
}

/* Flight recorder dumps go to --flight-dir, else $MS_FLIGHT_DIR, else ./meshscope-flight; a
 * terminated rank dumps too. The recorders of this process's ranks are made now, each with its
 * live record there: a rank killed before its first collective still leaves one, and one
 * that left none at all is named by the others' (they know the world's size). */
static void arm_flight_recorder(const run_opts *o, int nranks) {
    if (o->flight_dir)
        ms_flight_set_dir(o->flight_dir);
    else if (!ms_flight_dir())
        ms_flight_set_dir("meshscope-flight");
    if (o->backend == MS_BACKEND_MPI)
        ms_flight_prepare(ms_mpi_launch_rank(), nranks);
    else
        for (int r = 0; r < nranks; r++) ms_flight_prepare(r, nranks);
    ms_flight_install_signals();
}

/* Thread ranks still running after the others failed: say so, then what failed and what the
 * flight recorder says, as a failed launch would; the launcher then exits. */
static void report_abandoned(const ms_error *err, const int *stuck, int n_stuck, void *arg) {
    const char *cmd = arg;
    char ranks[128];
    ms_flight_format_ranks(stuck, n_stuck, ranks, sizeof ranks);
    fprintf(stderr,
            "meshscope %s: rank%s %s still running after the others failed; exiting without "
            "waiting for %s\n",
            cmd, n_stuck > 1 ? "s" : "", ranks, n_stuck > 1 ? "them" : "it");
    fprintf(stderr, "meshscope %s: %s\n", cmd, err->msg);
    job_report_flight(cmd, false);
}

ms_status job_launch(const char *cmd, const run_opts *o, const job_plan *plan, ms_rank_fn fn,
                     void *arg, ms_error *err) {
    int nranks = plan->world_size;
    arm_flight_recorder(o, nranks);
    if (o->backend == MS_BACKEND_MPI) {
        int argc = 0;
        char **argv = NULL;
        MS_CHECK(ms_mpi_init(&argc, &argv, err));
    }
    /* OpenBLAS's pool is process-wide: share the cores among the thread ranks. */
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int per_rank = o->threads > 0                     ? o->threads
                   : o->backend == MS_BACKEND_THREADS ? (cores / nranks > 0 ? cores / nranks : 1)
                                                      : 1;
    ms_k_blas_set_threads(per_rank);
    ms_device_kind device;
    MS_CHECK(ms_device_resolve((ms_device_choice)o->device, &device, NULL, 0, err));
    ms_launch_opts lo = {.backend = o->backend,
                         .device = device,
                         .nranks = nranks,
                         .seed = o->seed,
                         .timeout_ms = (int64_t)o->timeout_s * 1000,
                         /* a live rank notices a broken job within one communicator timeout */
                         .abandon_after_ms = o->timeout_s > 0 ? (int64_t)o->timeout_s * 1000
                                                              : MS_COMM_DEFAULT_TIMEOUT_MS,
                         .on_abandon = report_abandoned,
                         .abandon_arg = (void *)cmd};
    ms_status st = ms_launch(&lo, fn, arg, err);
    if (o->backend == MS_BACKEND_MPI) {
        if (ms_mpi_failed()) {
            fprintf(stderr, "meshscope %s: %s\n", cmd, err->msg);
            job_report_flight(cmd, true);
            ms_mpi_abort(1);
        }
        ms_mpi_finalize();
    }
    return st;
}

char *job_strategy_name(const ms_strategy *s, const ms_placement_rules *rules, char *buf,
                        size_t n) {
    if (rules && rules->no_hints && rules->n) return ms_advisor_layout_name(s, buf, n);
    return ms_strategy_name(s, buf, n);
}
