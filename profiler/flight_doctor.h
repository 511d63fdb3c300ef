/* flight_doctor.h - `meshscope doctor`: reads the flight recorder dumps of a failed job, and the
 * live records of its ranks that ended without one (engine/comm/flight.h; docs/formats.md,
 * "Flight recorder dumps") and says in plain words what happened: which rank never entered
 * which collective, who waited for it and how long, which ranks ended without a dump or left
 * no record at all, where each rank was last seen, or that every collective completed.
 *
 * The diagnosis is text, one finding a line, then one line per rank with a record
 * (ms_flight_describe's words and what the record is). Ownership: the caller owns `out` (free
 * out->p). */
#ifndef MS_FLIGHT_DOCTOR_H
#define MS_FLIGHT_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/core/status.h"
#include "engine/core/xalloc.h"

/* Diagnoses every flight-rank*-pid*.jsonl in dir, and every flight-rank*-pid*.ring (a live
 * record) without a dump of its process beside it. MS_ERR_IO for a folder that cannot be read
 * or a dump that is not a regular file (a FIFO or a device is never opened for reading),
 * MS_ERR_INVALID for one without dumps or with a dump that is not one: larger than a dump can
 * be (refused unread), not text, or with a line that is no entry or names a rank out of range
 * (the message names the file and line). A live record that is none is left out, named in
 * the diagnosis with the reason. */
ms_status ms_doctor_dir(const char *dir, ms_strbuf *out, ms_error *err);

/* The same over the dumps paths[0..n). partial: these are only some ranks' dumps (a process
 * reporting its own under MPI), so a rank without one is not presumed dead: it is named only
 * where a timeout named it as missing. */
ms_status ms_doctor_files(const char *const *paths, int n, bool partial, ms_strbuf *out,
                          ms_error *err);

/* One dump already in memory: its text (need not end in '\0') and the name that stands for
 * it in messages; a name ending in ".ring" marks the bytes of a live record. Borrowed for the
 * call. */
typedef struct ms_doctor_text {
    const char *name;
    const char *text;
    size_t len;
} ms_doctor_text;

/* The same over dumps held in memory (what ms_doctor_files does once each file is read; the
 * fuzzing entry point). */
ms_status ms_doctor_texts(const ms_doctor_text *dumps, int n, bool partial, ms_strbuf *out,
                          ms_error *err);

#endif
