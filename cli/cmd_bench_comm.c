#include "commands.h"
int ms_cmd_bench_comm(int argc, char **argv) { (void)argc, (void)argv; return 0; }
int ms_cmd_bench_comm_mpi_worker(int argc, char **argv) { (void)argc, (void)argv; return 0; }
