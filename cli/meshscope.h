/* meshscope.h - the meshscope command line as a library call.
 *
 * meshscope_main is the binary: `meshscope COMMAND [options]`. A program that brings its own
 * model (examples/, docs/models.md) calls meshscope_main_with_model from its main: every
 * command then runs that model (train, eval and explain take it in place of --model's config),
 * with everything the binary has: the strategies and their flags, --tui and --web, live
 * switches, checkpoints and resume, traces. --data names its data file (an array file, see
 * engine/data/array_source.h, unless the model opens its own).
 */
#ifndef MS_MESHSCOPE_H
#define MS_MESHSCOPE_H

#include "engine/model/model.h"

/* Runs one command; returns the process's exit code. */
int meshscope_main(int argc, char **argv);

/* The same, with `def` as the model (copied; what it borrows must outlive the call). */
int meshscope_main_with_model(int argc, char **argv, const ms_model_def *def);

#endif
