/* dispatch.c - the meshscope command line: dispatches to subcommands (meshscope.h). Each
 * command parses its own flags (options.h) and answers `meshscope CMD --help`. */
#include "cli/meshscope.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "engine/kernels/blas.h"
#include "job/job.h"

#ifndef MS_VERSION
#define MS_VERSION "unknown"
#endif

typedef struct command {
    const char *name;     /* one word, or two for bench's: "bench comm" */
    const char *synopsis; /* the required arguments */
    const char *about;
    int (*run)(int argc, char **argv); /* argv[0]: the command's last word */
} command;

static const command commands[] = {
    {"train", "--model CONFIG --data FILE",
     "train a GPT-2, BERT or LLaMA model on a mesh of ranks; --web and --tui show it live",
     ms_cmd_train},
    {"eval", "--model CONFIG --checkpoint FILE --data FILE",
     "loss of a checkpoint on deterministic windows, as JSON", ms_cmd_eval},
    {"explain", "--model CONFIG", "every value's placements and every reshard with its bytes",
     ms_cmd_explain},
    {"demo", "", "distributed tensors on a mesh: placements, reshard plans, their bytes and times",
     ms_cmd_demo},
    {"bench comm", "", "bus bandwidth of the threads backend against OpenMPI", ms_cmd_bench_comm},
    {"bench gemm", "--m M --n N --k K", "sgemm GFLOP/s at one shape through the matmul kernel",
     ms_cmd_bench_gemm},
    {"trace", "merge|summary|check FILE.json ...", "merge per-rank traces, summarise or check one",
     ms_cmd_trace},
    {"serve", "TRACE.json", "the web dashboard over a trace file (prints its URL)", ms_cmd_serve},
    {"top", "URL", "the terminal view of a running job's dashboard", ms_cmd_top},
    {"run", "[--max-restarts K] [--world N] -- meshscope train ... --save-dir DIR",
     "restart a failed job from its latest checkpoint, replanned for the ranks left", ms_cmd_run},
    {"ops", "[--json]", "every operator with its SPMD rule", ms_cmd_ops},
    {"checkpoint info", "DIR", "what a checkpoint (train --save-dir) holds",
     ms_cmd_checkpoint_info},
    {"checkpoint export", "DIR -o FILE", "a checkpoint's weights as one Hugging Face file",
     ms_cmd_checkpoint_export},
    {"doctor", "DIR", "what a failed job's flight recorder dumps (train --flight-dir) say",
     ms_cmd_doctor},
    {"plan", "--model CONFIG --cluster C --devices N --global-batch B --seq T",
     "rank parallel strategies by predicted step time and memory", ms_cmd_plan},
};
#define N_COMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void usage(FILE *f) {
    fprintf(f, "usage: meshscope COMMAND [options]\n"
               "       meshscope COMMAND --help   the command's options, one line each\n"
               "       meshscope --version\n"
               "\n"
               "commands:\n");
    for (int i = 0; i < N_COMMANDS; i++) {
        const command *c = &commands[i];
        fprintf(f, "  %s%s%s\n      %s\n", c->name, c->synopsis[0] ? " " : "", c->synopsis,
                c->about);
    }
}

/* OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE: when it fell back to its
 * generic ones on this CPU, the process starts again asking for the better core (once: the
 * variable is then set). If exec fails, the run goes on with the generic kernels. */
static void better_blas_core(char **argv) {
    const char *core = ms_blas_better_core();
    if (!core || setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
}

int meshscope_main(int argc, char **argv) {
    better_blas_core(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("meshscope %s\n", MS_VERSION);
        return 0;
    }
    /* Internal: the OpenBLAS core this process runs (after better_blas_core), for
     * scripts/run-tests.sh to give the test binaries the same. */
    if (!strcmp(cmd, "blas-core")) {
        const char *core = getenv("OPENBLAS_CORETYPE");
        printf("%s\n", core ? core : "");
        return 0;
    }
    /* Internal: the raw-MPI side of `bench comm`, started under mpirun by the bench. */
    if (!strcmp(cmd, "bench") && argc >= 3 && !strcmp(argv[2], "comm-mpi-worker"))
        return ms_cmd_bench_comm_mpi_worker(argc - 2, argv + 2);
    char two[64]; /* "bench comm" */
    snprintf(two, sizeof two, "%s %s", cmd, argc >= 3 ? argv[2] : "");
    for (int i = 0; i < N_COMMANDS; i++) {
        if (!strcmp(commands[i].name, cmd)) return commands[i].run(argc - 1, argv + 1);
        if (!strcmp(commands[i].name, two)) return commands[i].run(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "bench")) {
        const char *b = argc >= 3 ? argv[2] : "";
        bool help = !strcmp(b, "--help") || !strcmp(b, "-h");
        if (!help)
            fprintf(stderr, "meshscope bench: unknown benchmark '%s'; available: comm, gemm\n", b);
        fprintf(help ? stdout : stderr,
                "usage: meshscope bench comm|gemm [options]\n"
                "  meshscope bench comm --help, bench gemm --help: their options\n");
        return help ? 0 : 2;
    }
    fprintf(stderr, "meshscope: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}

int meshscope_main_with_model(int argc, char **argv, const ms_model_def *def) {
    job_use_model(def);
    return meshscope_main(argc, argv);
}
