/* cmd_checkpoint.c - `meshscope checkpoint info DIR` and `meshscope checkpoint export DIR -o
 * FILE`: what a distributed checkpoint (train --save-dir) holds, and its parameters as one
 * Hugging Face safetensors file.
 *
 * Exit codes: 0 done, 1 an unreadable, corrupt or incomplete checkpoint or an unwritable
 * output (the message names the file and the reason), 2 usage errors.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/train/checkpoint.h"

int ms_cmd_checkpoint_info(int argc, char **argv) {
    const char *pos[1];
    int npos = 0;
    const ms_opts_cmd cmd = {.name = "checkpoint info",
                             .synopsis = "DIR",
                             .about = "What a checkpoint folder (train --save-dir) or one of its "
                                      "step folders holds: step, strategy, tensors, files.",
                             .min_pos = 1,
                             .pos_name = "a checkpoint folder"};
    int rc = ms_opts_run(&cmd, argc, argv, pos, 1, &npos);
    if (rc != MS_OPTS_PROCEED) return rc;
    ms_strbuf text = {0};
    ms_error err = {0};
    if (ms_ckpt_describe(pos[0], NULL, &text, &err) != MS_OK) {
        fprintf(stderr, "meshscope checkpoint info: %s\n", err.msg);
        free(text.p);
        return 1;
    }
    fputs(text.p, stdout);
    free(text.p);
    return 0;
}

int ms_cmd_checkpoint_export(int argc, char **argv) {
    const char *pos[1], *out = NULL;
    int npos = 0;
    const ms_option opts[] = {
        {.name = "output",
         .short_name = 'o',
         .kind = MS_OPT_STRING,
         .metavar = "FILE",
         .help = "the safetensors file to write (required)",
         .dest = &out},
    };
    const ms_opts_cmd cmd = {.name = "checkpoint export",
                             .synopsis = "DIR -o FILE",
                             .about = "Writes a checkpoint's parameters, each assembled whole, as "
                                      "one Hugging Face safetensors file\n(what train --save "
                                      "writes); checks every file's size and CRC first.",
                             .min_pos = 1,
                             .pos_name = "a checkpoint folder",
                             MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, pos, 1, &npos);
    if (rc != MS_OPTS_PROCEED) return rc;
    if (!out) {
        fprintf(stderr, "meshscope checkpoint export: give the checkpoint and the output, e.g.\n"
                        "  meshscope checkpoint export runs/ckpt -o model.safetensors\n");
        return 2;
    }
    ms_error err = {0};
    int n = 0;
    if (ms_ckpt_export(pos[0], out, &n, &err) != MS_OK) {
        fprintf(stderr, "meshscope checkpoint export: %s\n", err.msg);
        return 1;
    }
    printf("wrote %d tensors to %s\n", n, out);
    return 0;
}
