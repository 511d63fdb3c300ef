/* cmd_ops.c - `meshscope ops [--json]`: every operator of the table with the devices whose
 * kernel tables run it (ms_op_def.runs_on) and its SPMD rule.
 *
 * A rule lists, along one mesh dim, the placements each input must have and what each output
 * then is. Rules depend on shapes and attributes, so each operator's rule is shown for the
 * first probe of small input shapes that its shape function accepts with default attributes,
 * or for operators whose attributes no probe guesses (pooling windows, group counts) at an
 * example of its inputs and attributes, which it describes; operators that need attributes or
 * integer inputs to be well-formed say so instead of showing a made-up rule.
 *
 * Exit codes: 0, 2 usage errors.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/ops/op.h"

/* The devices whose kernel tables hold every kernel the op calls ("cpu" always: an op without
 * runs_on calls the CPU kernels directly). Writes names separated by sep; returns how many. */
static int op_devices(const ms_op_def *d, const char **names, int cap) {
    static const ms_device_kind kinds[] = {MS_DEVICE_CPU, MS_DEVICE_FENCED, MS_DEVICE_CUDA};
    int n = 0;
    for (size_t j = 0; j < sizeof kinds / sizeof *kinds && n < cap; j++) {
        const ms_kernels *k = ms_kernels_for(kinds[j]);
        if (!k) continue;
        if (kinds[j] == MS_DEVICE_CPU || (d->runs_on && d->runs_on(k))) names[n++] = k->name;
    }
    return n;
}

/* One candidate as "S(0), R -> S(0)". */
static void cand_text(const ms_rule_cand *c, int n_in, int n_out, char *out, size_t len) {
    size_t k = 0;
    out[0] = '\0';
    for (int i = 0; i < n_in + n_out && k < len; i++) {
        char one[32];
        ms_placement_str(i < n_in ? c->in[i] : c->out[i - n_in], one, sizeof one);
        k += (size_t)snprintf(out + k, len - k, "%s%s",
                              i == 0      ? ""
                              : i == n_in ? " -> "
                                          : ", ",
                              one);
    }
}

/* The shapes of n inputs as "[2, 4] [4]" in out; returns the length written. */
static size_t shapes_text(const ms_shape *in, int n, char *out, size_t len) {
    size_t k = 0;
    out[0] = '\0';
    for (int i = 0; i < n && k < len; i++) {
        char one[48];
        ms_shape_str(in[i].d, in[i].ndim, one, sizeof one);
        k += (size_t)snprintf(out + k, len - k, "%s%s", i ? " " : "", one);
    }
    return k;
}

/* Operators whose attributes the probes below cannot guess (a window, a group count, a size):
 * the inputs and attributes `meshscope ops` shows their rules at, with what the attributes
 * mean. */
typedef struct op_example {
    const char *op;
    int n_in;
    ms_shape in[MS_OP_MAX_IN];
    ms_op_attrs a;
    const char *attrs;
} op_example;

static const op_example examples[] = {
    /* -- pool -- */
    {"max_pool1d", 1, {{3, {2, 4, 16}}}, {.i = {3, 2, 1}}, "i = kernel 3, stride 2, padding 1"},
    {"max_pool2d",
     1,
     {{4, {2, 4, 8, 8}}},
     {.i = {3, 3, 2, 2, 1, 1}},
     "i = kernel 3, 3, stride 2, 2, padding 1, 1"},
    {"avg_pool1d",
     1,
     {{3, {2, 4, 16}}},
     {.i = {3, 2, 1, 1}},
     "i = kernel 3, stride 2, padding 1, exclude_pad 1"},
    {"avg_pool2d",
     1,
     {{4, {2, 4, 8, 8}}},
     {.i = {2, 2, 2, 2, 0, 0, 0}},
     "i = kernel 2, 2, stride 2, 2, padding 0, 0, exclude_pad 0"},
    {"global_avg_pool", 1, {{4, {2, 4, 8, 8}}}, {.i = {0}}, "no attributes"},
    {"group_norm",
     3,
     {{4, {2, 8, 4, 4}}, {1, {8}}, {1, {8}}},
     {.i = {4}, .f = {1e-5f}},
     "i[0] groups 4, f[0] eps 1e-5"},
    {"resize",
     1,
     {{4, {2, 4, 8, 8}}},
     {.i = {1}, .f = {2, 2}},
     "i[0] mode 1 linear, f = scales 2, 2 (or i[1], i[2] a size)"},
    /* -- end pool -- */
};

/* The op's candidates at its example (nc, or 0 where it has none), its inputs and attributes
 * described in `shape`. */
static int probe_example(const ms_op_def *d, ms_rule_cand *cands, int *n_in, int *n_out,
                         char *shape, size_t len) {
    for (size_t e = 0; e < sizeof examples / sizeof *examples; e++) {
        const op_example *x = &examples[e];
        ms_shape out[MS_OP_MAX_OUT];
        ms_error err = {0};
        if (strcmp(x->op, d->name) || d->infer(&x->a, x->n_in, x->in, out, &err) != MS_OK) continue;
        memset(cands, 0, sizeof(ms_rule_cand) * MS_OP_MAX_CANDS);
        *n_in = x->n_in;
        *n_out = d->n_out > 0 ? d->n_out : 1;
        size_t k = shapes_text(x->in, x->n_in, shape, len);
        if (k < len) snprintf(shape + k, len - k, " (%s)", x->attrs);
        return d->rule(&x->a, x->n_in, x->in, 2, cands);
    }
    return 0;
}

/* The op's candidates on a mesh dim of 2 for the first probe that its shape function accepts
 * with default attributes, then with small ones: each input one of a few small shapes (so that a
 * matmul finds [4, 6] @ [6, 4] and a norm [4, 6] with a [6] weight); returns how many (0: none
 * fits), with the input shapes used in `shape`. */
static int probe_rule(const ms_op_def *d, ms_rule_cand *cands, int *n_in, int *n_out, char *shape,
                      size_t len) {
    static const ms_shape probes[] = {{2, {4, 6}},         {2, {6, 4}},       {1, {6}},
                                      {3, {2, 4, 6}},      {4, {2, 4, 2, 8}}, {4, {2, 4, 3, 8}},
                                      {5, {2, 4, 2, 2, 8}}};
    enum { NP = sizeof probes / sizeof *probes };
    int from_example = probe_example(d, cands, n_in, n_out, shape, len);
    if (from_example > 0) return from_example;
    int ni = d->n_in > 0 ? d->n_in : 2, combos = 1;
    for (int i = 0; i < ni; i++) combos *= NP;
    /* Default attributes first, then small integer attributes (a dim, a count, a flag) with
     * positive float ones (an epsilon, a rate, a theta), then every integer attribute 1 (a
     * convolution's strides, paddings, dilations and groups). */
    for (int v = 0; v < 20; v++) {
        ms_op_attrs a = {0};
        if (v > 0 && v < 19)
            a = (ms_op_attrs){.i = {(v - 1) % 9 / 3, (v - 1) % 3},
                              .f = {v < 10 ? 0.5f : 10000.0f, 1.0f}};
        for (int j = 0; v == 19 && j < (int)(sizeof a.i / sizeof a.i[0]); j++) a.i[j] = 1;
        for (int c = 0; c < combos; c++) {
            ms_shape in[MS_OP_MAX_IN], out[MS_OP_MAX_OUT];
            for (int i = 0, rem = c; i < ni; i++, rem /= NP) in[i] = probes[rem % NP];
            ms_error err = {0};
            if (d->infer(&a, ni, in, out, &err) != MS_OK) continue;
            memset(cands, 0, sizeof(ms_rule_cand) * MS_OP_MAX_CANDS);
            int nc = d->rule(&a, ni, in, 2, cands);
            if (nc <= 0) continue;
            *n_in = ni;
            *n_out = d->n_out > 0 ? d->n_out : 1;
            size_t k = shapes_text(in, ni, shape, len);
            if (v == 19 && k < len)
                snprintf(shape + k, len - k, " (every i = 1)");
            else if (v > 0 && k < len)
                snprintf(shape + k, len - k, " (i = %d, %d)", (int)a.i[0], (int)a.i[1]);
            return nc;
        }
    }
    return 0;
}

int ms_cmd_ops(int argc, char **argv) {
    bool json = false;
    const ms_option opts[] = {
        MS_FLAG("json", &json,
                "one JSON array: an object per operator (name, inputs, devices, rules)"),
    };
    const ms_opts_cmd cmd = {.name = "ops",
                             .synopsis = "[--json]",
                             .about = "Every operator with the devices it runs on and its SPMD "
                                      "rule along one mesh dim:\nthe placements its inputs must "
                                      "have and what its outputs then are (R replicate,\nS(d) "
                                      "shard, P partial).",
                             MS_OPTS_TABLE(opts)};
    int rc = ms_opts_run(&cmd, argc, argv, NULL, 0, NULL);
    if (rc != MS_OPTS_PROCEED) return rc;
    cJSON *all = json ? cJSON_CreateArray() : NULL;
    int n = ms_op_count();
    int host_only = 0;
    for (int op = 0; op < n; op++) {
        const char *names[4];
        host_only += op_devices(ms_op_get(op), names, 4) == 1;
    }
    if (!json)
        printf("%d operators (rules along one mesh dim of 2 ranks); %d run on the host only\n", n,
               host_only);
    ms_rule_cand *cands = calloc(MS_OP_MAX_CANDS, sizeof *cands);
    for (int op = 0; op < n; op++) {
        const ms_op_def *d = ms_op_get(op);
        int ni = 0, no = 0;
        char shape[224] = "", text[256];
        int nc = probe_rule(d, cands, &ni, &no, shape, sizeof shape);
        cJSON *o = NULL, *rules = NULL;
        const char *devs[4];
        int nd = op_devices(d, devs, 4);
        char dev_text[64] = "";
        for (int j = 0; j < nd; j++)
            snprintf(dev_text + strlen(dev_text), sizeof dev_text - strlen(dev_text), "%s%s",
                     j ? ", " : "", devs[j]);
        if (json) {
            o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", d->name);
            cJSON_AddNumberToObject(o, "inputs", d->n_in);
            cJSON_AddNumberToObject(o, "outputs", d->n_out);
            cJSON_AddBoolToObject(o, "builtin", op < MS_OP_BUILTIN_COUNT);
            cJSON *devices = cJSON_AddArrayToObject(o, "devices");
            for (int j = 0; j < nd; j++) cJSON_AddItemToArray(devices, cJSON_CreateString(devs[j]));
            if (nc) cJSON_AddStringToObject(o, "probe_shape", shape);
            rules = cJSON_AddArrayToObject(o, "rules");
            cJSON_AddItemToArray(all, o);
        } else if (nc) {
            printf("%-22s [%s] %d rule%s at inputs %s\n", d->name, dev_text, nc, nc == 1 ? "" : "s",
                   shape);
        } else {
            printf("%-22s [%s] rules depend on its attributes or integer inputs (see "
                   "engine/ops/op.h)\n",
                   d->name, dev_text);
        }
        for (int k = 0; k < nc; k++) {
            cand_text(&cands[k], ni, no, text, sizeof text);
            if (json)
                cJSON_AddItemToArray(rules, cJSON_CreateString(text));
            else
                printf("    %s\n", text);
        }
    }
    free(cands);
    if (json) {
        char *s = cJSON_Print(all);
        puts(s);
        cJSON_free(s);
        cJSON_Delete(all);
    }
    return 0;
}
