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

#include "engine/core/status.h"
#include "engine/core/xalloc.h"

/* Diagnoses every flight-rank*-pid*.jsonl in dir. MS_ERR_IO for a folder that cannot be read,
 * MS_ERR_INVALID for one without dumps or with a dump that is not one (the message names the
 * file and line). */
ms_status ms_doctor_dir(const char *dir, ms_strbuf *out, ms_error *err);

/* The same over the dumps paths[0..n). partial: these are only some ranks' dumps (a process
 * reporting its own under MPI), so a rank without one is not presumed dead: it is named only
 * where a timeout named it as missing. */
ms_status ms_doctor_files(const char *const *paths, int n, bool partial, ms_strbuf *out,
                          ms_error *err);

#endif
