/* commands.h - the subcommands of the meshscope binary. Each takes the arguments after
 * its own name (argv[0] is the subcommand name) and returns the process exit code. Only
 * the CLI prints errors and decides the exit code. */
#ifndef MS_COMMANDS_H
#define MS_COMMANDS_H

int ms_cmd_demo(int argc, char **argv);
int ms_cmd_train(int argc, char **argv);
int ms_cmd_eval(int argc, char **argv);
int ms_cmd_explain(int argc, char **argv);
int ms_cmd_bench_comm(int argc, char **argv);
int ms_cmd_bench_gemm(int argc, char **argv);
/* `meshscope trace merge|summary|check` (cmd_trace.c). */
int ms_cmd_trace(int argc, char **argv);
/* `meshscope serve TRACE.json [--web HOST:PORT]`: the dashboard over a trace (cmd_serve.c). */
int ms_cmd_serve(int argc, char **argv);
/* `meshscope top URL`: the terminal view of a running job's dashboard (cmd_top.c). */
int ms_cmd_top(int argc, char **argv);
/* `meshscope plan`: strategies ranked by the cost model (cmd_plan.c). */
int ms_cmd_plan(int argc, char **argv);
/* `meshscope run -- COMMAND`: restarts a failed job from its checkpoint (cmd_run.c). */
int ms_cmd_run(int argc, char **argv);
/* `meshscope ops [--json]`: every operator with its SPMD rule (cmd_ops.c). */
int ms_cmd_ops(int argc, char **argv);
/* `meshscope checkpoint info|export`: distributed checkpoints (cmd_checkpoint.c). */
int ms_cmd_checkpoint_info(int argc, char **argv);
int ms_cmd_checkpoint_export(int argc, char **argv);
/* `meshscope doctor DIR`: what the flight recorder dumps of a failed job say (cmd_doctor.c). */
int ms_cmd_doctor(int argc, char **argv);
/* Internal: the raw-MPI side of `bench comm`, run under mpirun by the bench itself. */
int ms_cmd_bench_comm_mpi_worker(int argc, char **argv);

#endif
