/* nccl_lane.c - NCCL's view of a traced job's collectives (see nccl_lane.h). */
#include "profiler/nccl_lane.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/comm/comm.h"

_Static_assert(sizeof(ms_ev_nccl) <= sizeof(ms_ev_reshard),
               "an NCCL event must not grow ms_event (its size is the gather's wire format)");

/* --- finding and loading the plugin ----------------------------------------------------- */

static bool file_exists(const char *path) {
    return access(path, R_OK) == 0;
}

/* dir/rel/MS_NCCL_PLUGIN_FILE into out, if it exists. */
static bool try_dir(const char *dir, size_t dir_len, const char *rel, char *out, size_t cap) {
    int k = snprintf(out, cap, "%.*s%s/" MS_NCCL_PLUGIN_FILE, (int)dir_len, dir, rel);
    return k > 0 && (size_t)k < cap && file_exists(out);
}

bool ms_nccl_plugin_resolve(const char *env_value, const char *exe_path, char *out, size_t cap,
                            bool *from_env, char *why, size_t why_cap) {
    *from_env = env_value && *env_value;
    if (*from_env) {
        if (!strcmp(env_value, "none")) {
            snprintf(why, why_cap, "NCCL_PROFILER_PLUGIN=none turns NCCL's profiler plugin off");
            return false;
        }
        /* As NCCL reads it: a path or a library's file name as given, a bare name as
         * libnccl-profiler-NAME.so. */
        const size_t len = strlen(env_value);
        const bool as_is =
            strchr(env_value, '/') || (len > 3 && !strcmp(env_value + len - 3, ".so"));
        int k = as_is ? snprintf(out, cap, "%s", env_value)
                      : snprintf(out, cap, "libnccl-profiler-%s.so", env_value);
        if (k > 0 && (size_t)k < cap) return true;
        snprintf(why, why_cap, "NCCL_PROFILER_PLUGIN is longer than %zu bytes", cap);
        return false;
    }
    const char *slash = exe_path ? strrchr(exe_path, '/') : NULL;
    if (slash) {
        const size_t dir_len = (size_t)(slash - exe_path);
        if (try_dir(exe_path, dir_len, "", out, cap) ||
            try_dir(exe_path, dir_len, "/../lib", out, cap))
            return true;
    }
    snprintf(why, why_cap,
             "no " MS_NCCL_PLUGIN_FILE " next to %s or in ../lib; build the "
             "meshscope-nccl-profiler target or set NCCL_PROFILER_PLUGIN to its path",
             exe_path ? exe_path : "the executable");
    return false;
}

typedef size_t (*drain_fn)(ms_nccl_record *, size_t);
typedef int (*kind_fn)(const char *);

static struct {
    pthread_once_t once;
    const char *exe_path;
    bool ok;
    char path[PATH_MAX];
    void *handle;
    drain_fn drain;
    kind_fn coll_kind;
} lane = {.once = PTHREAD_ONCE_INIT};

/* NULL when the plugin was loaded and is ours; else why not (into why). */
static const char *load(char *why, size_t cap) {
    bool from_env = false;
    if (!ms_nccl_plugin_resolve(getenv("NCCL_PROFILER_PLUGIN"), lane.exe_path, lane.path,
                                sizeof lane.path, &from_env, why, cap))
        return why;
    if (!from_env && setenv("NCCL_PROFILER_PLUGIN", lane.path, 0) != 0) {
        snprintf(why, cap, "cannot set NCCL_PROFILER_PLUGIN");
        return why;
    }
    lane.handle = dlopen(lane.path, RTLD_NOW | RTLD_LOCAL);
    if (!lane.handle) {
        snprintf(why, cap, "cannot load %s: %s", lane.path, dlerror());
        return why;
    }
    lane.drain = (drain_fn)dlsym(lane.handle, "ms_nccl_profiler_drain_records");
    lane.coll_kind = (kind_fn)dlsym(lane.handle, "ms_nccl_coll_kind");
    if (!lane.drain || !lane.coll_kind) {
        snprintf(why, cap,
                 "%s is not meshscope's NCCL profiler plugin (no ms_nccl_profiler_drain_records)",
                 lane.path);
        return why;
    }
    return NULL;
}

static void open_once(void) {
    char why[PATH_MAX + 160];
    char exe[PATH_MAX];
    if (!lane.exe_path) {
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[k > 0 ? k : 0] = '\0';
        lane.exe_path = k > 0 ? exe : NULL;
    }
    const bool was_set = getenv("NCCL_PROFILER_PLUGIN") != NULL;
    lane.ok = load(why, sizeof why) == NULL;
    lane.exe_path = NULL; /* exe is on this stack */
    if (lane.ok) return;
    if (!was_set) unsetenv("NCCL_PROFILER_PLUGIN"); /* NCCL would fail on it as well */
    lane.path[0] = '\0';
    fprintf(stderr, "trace: no NCCL profiler plugin (%s); tracing without NCCL's view\n", why);
}

bool ms_nccl_lane_open(const char *exe_path) {
    /* Only the first caller's exe_path counts; pthread_once passes no argument. */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    lane.exe_path = exe_path;
    pthread_once(&lane.once, open_once);
    pthread_mutex_unlock(&mu);
    return lane.ok;
}

const char *ms_nccl_lane_path(void) {
    return lane.ok ? lane.path : "";
}

/* --- draining --------------------------------------------------------------------------- */

bool ms_nccl_lane_event(const ms_nccl_record *r, int32_t rank, int coll, ms_event *out) {
    if (r->kind != MS_NCCL_COLL && r->kind != MS_NCCL_P2P) return false;
    ms_event e;
    memset(&e, 0, sizeof e);
    e.kind = MS_EV_NCCL;
    e.phase = MS_PHASE_OTHER;
    e.rank = rank;
    e.step = -1;
    e.t0_ns = r->t_start_ns;
    e.t1_ns = r->timing == MS_NCCL_T_ENQUEUE ? r->t_enqueued_ns : r->t_end_ns;
    if (e.t1_ns < e.t0_ns) e.t1_ns = e.t0_ns;
    ms_ev_nccl *c = &e.u.nccl;
    c->comm_id = r->comm_id;
    c->seq = r->kind == MS_NCCL_COLL ? r->seq : 0;
    c->count = r->count;
    if (r->timing == MS_NCCL_T_GPU) c->gpu_t0 = r->gpu_start_ns, c->gpu_t1 = r->gpu_end_ns;
    c->enqueued_ns = r->t_enqueued_ns - r->t_start_ns;
    c->ms_seq = -1;
    c->ms_group = -1;
    c->comm_rank = r->rank;
    c->nranks = r->nranks;
    c->peer = r->peer;
    c->channels = (int16_t)r->n_channels;
    c->p2p = r->kind == MS_NCCL_P2P;
    c->is_send = r->is_send;
    c->timing = r->timing;
    c->coll = coll >= 0 && coll < MS_COLL_KIND_COUNT ? (uint8_t)coll : UINT8_MAX;
    ms_ev_strcpy(c->func, sizeof c->func, NULL, r->func);
    ms_ev_strcpy(c->dtype, sizeof c->dtype, NULL, r->datatype);
    ms_ev_strcpy(c->algo, sizeof c->algo, NULL, r->algo);
    ms_ev_strcpy(c->proto, sizeof c->proto, NULL, r->proto);
    *out = e;
    return true;
}

size_t ms_nccl_lane_drain(ms_recorder *rec, int32_t rank, ms_nccl_lane_counts *counts) {
    if (!lane.ok || !rec) return 0;
    ms_nccl_record buf[128];
    size_t got, pushed = 0;
    while ((got = lane.drain(buf, 128)) > 0)
        for (size_t i = 0; i < got; i++) {
            ms_event e;
            if (ms_nccl_lane_event(&buf[i], rank, lane.coll_kind(buf[i].func), &e)) {
                ms_recorder_push_as(rec, &e);
                pushed++;
            } else if (counts && buf[i].kind == MS_NCCL_PROXY_OP) {
                counts->proxy_ops++;
            }
        }
    if (counts) counts->events += pushed;
    return pushed;
}
