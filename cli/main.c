/* main.c - the meshscope command line: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: meshscope <command> [options]\n"
            "\n"
            "commands:\n"
            "  demo [--ranks N] [--backend threads|mpi]\n"
            "                     distributed tensors on a mesh: placements, reshard plans,\n"
            "                     their bytes and times, checked against the global tensor\n"
            "  bench comm [--json] [--ranks 2,4] [--min-bytes B] [--max-bytes B] [--iters N]\n"
            "                     bus bandwidth of the threads backend against OpenMPI\n"
            "  bench gemm --m M --n N --k K [--ta] [--tb] [--backward] [--threads T] [--json]\n"
            "                     sgemm GFLOP/s at one shape through the engine's matmul kernel\n"
            "  train --model CONFIG --data FILE [--dp N --tp N --sp | --strategy FILE]\n"
            "        [--backend threads|mpi] [--steps N] [--seed S] [--batch B] [--seq T]\n"
            "        [--lr LR] [--log-jsonl FILE] [--save FILE.safetensors] [--sample N]\n"
            "        [--trace FILE.json] [--web HOST:PORT] [--tui] [--switch STEP:STRATEGY]\n"
            "        [--advise-threshold F] [--memory-cap MIB]\n"
            "                     train a GPT-2 or BERT model on a mesh of ranks; --web and\n"
            "                     --tui show it live and take strategy switches\n"
            "  eval --model CONFIG --checkpoint FILE --data FILE --batch B --seq T --batches K\n"
            "                     loss of a checkpoint on deterministic windows, as JSON\n"
            "  explain --model CONFIG [--dp N --tp N --sp | --strategy FILE] [--batch B --seq T]\n"
            "                     every value's placements and every reshard with its bytes\n"
            "  trace merge A.json B.json ... -o OUT.json | trace summary FILE.json [--steps A:B]\n"
            "        | trace check FILE.json\n"
            "                     merge per-rank trace files, summarise or check a trace\n"
            "  serve TRACE.json [--web HOST:PORT]\n"
            "                     the web dashboard over a trace file (prints its URL)\n"
            "  top URL [--token T] [--read-only]\n"
            "                     the terminal view of a running job: URL is the dashboard\n"
            "                     line it prints, http://127.0.0.1:PORT/?token=TOKEN\n"
            "  plan --model CONFIG --cluster cpu-local|dgx-a100-80gb|h100|h200|FILE --devices N\n"
            "       --global-batch B --seq T [--evaluate \"tp=8,pp=2\"] [--top K] [--json]\n"
            "                     rank parallel strategies by predicted step time and memory\n"
            "  help               this text\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "demo")) return ms_cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return ms_cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return ms_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "explain")) return ms_cmd_explain(argc - 1, argv + 1);
    if (!strcmp(cmd, "trace")) return ms_cmd_trace(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return ms_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "top")) return ms_cmd_top(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return ms_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) {
        if (argc >= 3 && !strcmp(argv[2], "comm")) return ms_cmd_bench_comm(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "gemm")) return ms_cmd_bench_gemm(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "comm-mpi-worker"))
            return ms_cmd_bench_comm_mpi_worker(argc - 2, argv + 2);
        fprintf(stderr, "meshscope bench: unknown benchmark '%s'; available: comm, gemm\n",
                argc >= 3 ? argv[2] : "");
        return 2;
    }
    fprintf(stderr, "meshscope: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
