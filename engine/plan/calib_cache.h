/* calib_cache.h - when a cpu-local calibration may be reused: the cache of measured machines,
 * the key a cached file is valid under, the check that the machine is quiet before it is
 * measured, and the provenance each file records.
 *
 * The key is what changes the measured rates: the CPU model and the features its kernels use
 * (avx2, avx512f, avx512_bf16, amx_tile, amx_bf16), the online core count, the BLAS build and
 * the kernel it picked on this CPU (ms_blas_describe), and the BLAS thread policy the
 * measurement ran under. The file name stays readable (model and cores) and ends in 8 hex
 * digits of the key's hash; the file stores the whole key, and a load compares it.
 *
 * A calibration taken while other work loads the cores reads low rates and inflated
 * synchronisation, and a cache would keep them for good. Before measuring, the busy CPU of the
 * whole machine is sampled from /proc/stat (meshscope itself is idle then); above the limit it
 * waits and samples again, and if the machine stays busy it measures for this run only and
 * caches nothing. The limit is MS_CALIB_BUSY_CORES cores' worth of busy CPU, or
 * MS_CALIB_BUSY_SHARE of the cores where that is more (a big machine's daemons), on average
 * over MS_CALIB_SAMPLE_S; it waits up to MS_CALIB_WAIT_S. The environment overrides both:
 * MS_CALIBRATE_MAX_BUSY (cores; at least the core count turns the check off) and
 * MS_CALIBRATE_WAIT_S (seconds; 0 samples once).
 *
 * Everything here that takes texts is pure (tests feed it crafted /proc files); the rest reads
 * /proc and the cache folder. No state: nothing to own.
 */
#ifndef MS_PLAN_CALIB_CACHE_H
#define MS_PLAN_CALIB_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "engine/plan/cluster.h"

/* The calibration procedure's version: a cached file of another version is measured again. */
#define MS_CALIBRATION_VERSION "meshscope-cpu-local-10"

#define MS_CALIB_BUSY_CORES 0.25 /* busy CPU above this (in cores) is a loaded machine */
#define MS_CALIB_BUSY_SHARE 0.02 /* ... or above this share of the cores, if more */
#define MS_CALIB_WAIT_S     10.0 /* how long to wait for a busy machine to settle */
#define MS_CALIB_SAMPLE_S   0.5  /* one sample of the busy CPU */

/* Of the features in the key, those the first "flags" line of a /proc/cpuinfo text lists,
 * space-separated in the key's order; "none" when it lists none (or there is no such line). */
void ms_cpu_features(const char *cpuinfo, char *buf, size_t len);

/* The busy CPU between two /proc/stat texts, in cores (0.25: a quarter of one core on
 * average): the aggregate "cpu" line's total - idle - iowait over its total, times the cpuN
 * lines of `after`. False when a text has no aggregate line, or no time passed. */
bool ms_cpu_busy_between(const char *before, const char *after, double *busy_cores);

/* Samples this machine's /proc/stat window_s apart; false when it cannot be read. */
bool ms_cpu_busy_sample(double window_s, double *busy_cores);

/* This machine's key: "model=...; features=...; cores=N; blas=...; threads=...", and
 * "; build=AddressSanitizer" in such a build (its rates are its own). */
#define MS_CALIB_KEY_MAX 512
void ms_calib_key(char *buf, size_t len);
/* 8 hex digits of the key's FNV-1a hash (out has room for 9 bytes). */
void ms_calib_key_hash(const char *key, char *out);
/* The first part in which two keys differ, as "blas: 'A' then, 'B' now"; "" when they are
 * equal. */
void ms_calib_key_diff(const char *then, const char *now, char *buf, size_t len);

/* The quiet check's limits on a machine of `cores`: the defaults above, or the environment's
 * (a malformed value is named on stderr and ignored). */
typedef struct ms_calib_quiet {
    double max_busy; /* cores */
    double wait_s;
} ms_calib_quiet;
ms_calib_quiet ms_calib_quiet_limits(int cores);
/* The default limit alone: what "an idle machine" means in ms_calib_provenance. */
double ms_calib_default_max_busy(int cores);

/* Whether `cached` may stand for this machine under `key` (version, key and core count); if
 * not, one phrase saying why in `why`. */
bool ms_calib_usable(const ms_cluster *cached, const char *key, int cores, char *why, size_t len);

/* When and under what load c was measured, for one line: "taken 2026-12-06 22:10 UTC (3 h
 * ago) on an idle machine (0.02 cores busy before, 0.04 after)". Idle means both samples at
 * most max_busy; now is the current time. */
void ms_calib_provenance(const ms_cluster *c, double max_busy, time_t now, char *buf, size_t len);

/* The CPU model name from /proc/cpuinfo ("unknown" if absent). */
void ms_cluster_cpu_model(char *buf, size_t len);

/* cpu-local for ms_cluster_resolve: the cached calibration when its key and version match
 * (recalibrate: never), else measured after the quiet check and cached if the machine was
 * quiet before and after. A measurement that was not cached serves every later call in this
 * process (thread-safe). `log` (a FILE *, may be NULL) gets the calibration's stages and one
 * line saying which calibration is used, or why it is measured, or why it is not cached. */
ms_status ms_calib_resolve(bool recalibrate, void *log, ms_cluster *out, ms_error *err);

#endif
