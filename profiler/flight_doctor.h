/* flight_doctor.h - `meshscope doctor`: reads the flight recorder dumps of a failed job
 * (engine/comm/flight.h; docs/formats.md, "Flight recorder dumps") and says in plain words what
 * happened: which rank never entered which collective, who waited for it and how long, where
 * each rank was last seen, or that every collective completed.
 *
 * The diagnosis is text, one finding a line, then one line per dumped rank (ms_flight_describe's
 * words). Ownership: the caller owns `out` (free out->p). */
#ifndef MS_FLIGHT_DOCTOR_H
#define MS_FLIGHT_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/core/status.h"
#include "engine/core/xalloc.h"

/* Diagnoses every flight-rank*-pid*.jsonl in dir. MS_ERR_IO for a folder that cannot be read
 * or a dump that is not a regular file (a FIFO or a device is never opened for reading),
 * MS_ERR_INVALID for one without dumps or with a dump that is not one: larger than a dump can
 * be (refused unread), not text, or with a line that is no entry or names a rank out of range
 * (the message names the file and line). */
ms_status ms_doctor_dir(const char *dir, ms_strbuf *out, ms_error *err);

/* The same over the dumps paths[0..n). partial: these are only some ranks' dumps (a process
 * reporting its own under MPI), so a rank without one is not presumed dead: it is named only
 * where a timeout named it as missing. */
ms_status ms_doctor_files(const char *const *paths, int n, bool partial, ms_strbuf *out,
                          ms_error *err);

/* One dump already in memory: its text (need not end in '\0') and the name that stands for
 * it in messages. Borrowed for the call. */
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
