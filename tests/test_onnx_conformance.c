/* test_onnx_conformance.c - ONNX's own backend test data (Debian: libonnx-testdata) through the
 * importer: every node test whose operator the importer maps, and every pytorch-converted or
 * pytorch-operator model whose operators are all mapped, runs forward on one rank in fp32 and
 * every output is compared with the reference (|got - want| <= atol + rtol |want|, rtol 1e-4,
 * atol 1e-5; NaN matches NaN).
 *
 * A test counts for the operator of its single node (node tests of several nodes, the
 * "_expanded" function bodies, count as "composite"), as an fp32 test when its graph's inputs,
 * outputs and initializers hold float32 tensors and no other float type (float64, float16,
 * bfloat16), string or non-tensor (integer and bool tensors may join them), else as a test of
 * other dtypes. A model the importer refuses with MS_ERR_UNSUPPORTED counts as refused, not
 * passed: allowed for other dtypes and for the folders of models, but a refused fp32 test of a
 * mapped operator fails the run, as does any other failure (a wrong value, a build or compile
 * error) of any test. `--markdown` prints the per-operator table and the refusals
 * (docs/onnx.md is made from it); `-v` prints every test. MS_ONNX_TESTDATA overrides the data
 * folder. Exits 77 when the data or ONNX support is absent. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/core/xalloc.h"
#include "engine/dist/dmesh.h"
#include "engine/graph/graph.h"
#include "engine/model/onnx_import.h"
#include "engine/runtime/ctx.h"

#ifdef MS_HAVE_ONNX
#include <onnx.pb-c.h>

#define RTOL   1e-4
#define ATOL   1e-5
#define MAX_IO 16

/* Per operator: its fp32 tests, and its tests of other element types. */
typedef struct op_count {
    char op[64];
    int pass, total, refused;       /* fp32 */
    int o_pass, o_total, o_refused; /* other dtypes */
} op_count;

typedef struct run_state {
    const char *root;
    bool markdown, verbose;
    op_count ops[256];
    int nops;
    int comp_pass, comp_total, comp_refused;
    int pt_pass, pt_total, pt_refused;
    int failures;
    int fp32_refused; /* fp32 single-node tests refused: a defect of a mapped operator */
    char refusals[400][512];
    int nref;
    char fp32_ref[100][512];
    int nfp32_ref;
    char failed[200][512];
    int nfailed;
} run_state;

/* dst = a + sep + b, cut to fit cap (paths and message lines). */
static void join(char *dst, size_t cap, const char *a, const char *sep, const char *b) {
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b), n = 0;
    const char *parts[3] = {a, sep, b};
    size_t lens[3] = {la, ls, lb};
    for (int i = 0; i < 3; i++) {
        size_t k = lens[i] < cap - 1 - n ? lens[i] : cap - 1 - n;
        memcpy(dst + n, parts[i], k);
        n += k;
    }
    dst[n] = 0;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted entries of dir starting with "test_" (caller frees). */
static int list_tests(const char *dir, char ***out) {
    DIR *d = opendir(dir);
    int n = 0, cap = 0;
    char **v = NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "test_", 5)) continue;
        if (n == cap) v = xrealloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 256));
        v[n++] = xstrdup(e->d_name);
    }
    if (d) closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    return n;
}

/* An element type: float32 (1), another integer or bool type (0), anything else (-1). */
static int elem_kind(int dtype) {
    switch (dtype) {
        case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
            return 1;
        case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8:
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT8:
        case ONNX__TENSOR_PROTO__DATA_TYPE__UINT16:
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT16:
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
        case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32:
        case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64:
        case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL:
            return 0;
        default:
            return -1;
    }
}

/* A graph value's type as elem_kind; -1 for what is not a tensor (sequences, optionals). */
static int value_kind(const Onnx__ValueInfoProto *vi) {
    const Onnx__TypeProto *t = vi->type;
    if (!t || t->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) return -1;
    return elem_kind(t->tensor_type->has_elem_type ? t->tensor_type->elem_type : 0);
}

/* An fp32 test: its graph's inputs, outputs and initializers hold float32 tensors, and every
 * float tensor among them is float32 (integer and bool ones may join them). */
static bool graph_fp32(const Onnx__GraphProto *g) {
    bool f32 = false, other = false;
    for (size_t i = 0; i < g->n_input + g->n_output; i++) {
        int k = value_kind(i < g->n_input ? g->input[i] : g->output[i - g->n_input]);
        f32 |= k == 1, other |= k < 0;
    }
    for (size_t i = 0; i < g->n_initializer; i++) {
        int k = elem_kind(g->initializer[i]->data_type);
        f32 |= k == 1, other |= k < 0;
    }
    return f32 && !other;
}

/* The op types of the model at path (unique, into ops[max][64]); -1 if it does not parse.
 * *fp32: whether it is an fp32 test (graph_fp32). */
static int model_ops(const char *path, char ops[][64], int max, int *nodes, bool *fp32) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = xmalloc((size_t)len + 1);
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, got, buf);
    free(buf);
    if (!m || !m->graph) {
        if (m) onnx__model_proto__free_unpacked(m, NULL);
        return -1;
    }
    int n = 0;
    *nodes = (int)m->graph->n_node;
    *fp32 = graph_fp32(m->graph);
    for (size_t i = 0; i < m->graph->n_node; i++) {
        const char *op = m->graph->node[i]->op_type;
        bool seen = false;
        for (int k = 0; k < n; k++) seen |= !strcmp(ops[k], op);
        if (!seen && n < max) snprintf(ops[n++], 64, "%s", op);
    }
    onnx__model_proto__free_unpacked(m, NULL);
    return n;
}

/* One data set of one model. */
typedef struct case_job {
    const char *model, *set;
    char msg[1024];
    bool refused;
} case_job;

static int read_set(const char *set, const char *prefix, ms_onnx_tensor *t, int max) {
    int n = 0;
    for (; n < max; n++) {
        char p[1200];
        char idx[32];
        snprintf(idx, sizeof idx, "_%d.pb", n);
        char q[1200];
        join(q, sizeof q, set, "/", prefix);
        join(p, sizeof p, q, "", idx);
        ms_error err = {0};
        if (ms_onnx_read_tensor(p, &t[n], &err) != MS_OK) break;
    }
    return n;
}

static bool close_enough(double got, double want) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= ATOL + RTOL * fabs(want);
}

/* Compares output k (a kept value) with its reference. */
static void compare(case_job *j, ms_program *p, int v, const ms_onnx_tensor *want, int k,
                    ms_error *err) {
    ms_tensor got = {0};
    if (ms_program_value(p, v, &got, err) != MS_OK) {
        snprintf(j->msg, sizeof j->msg, "output %d: %s", k, err->msg);
        return;
    }
    int64_t n = ms_tensor_numel(&got);
    bool shape_ok = n == want->numel && (got.ndim == want->ndim || n == 1);
    for (int d = 0; shape_ok && d < want->ndim && n != 1; d++)
        shape_ok = got.shape[d] == want->shape[d];
    if (!shape_ok) {
        snprintf(j->msg, sizeof j->msg,
                 "output %d: shape (rank %d, %lld elements), want rank %d, "
                 "%lld elements",
                 k, got.ndim, (long long)n, want->ndim, (long long)want->numel);
    } else {
        const float *g = ms_tensor_f32(&got);
        for (int64_t i = 0; i < n; i++)
            if (!close_enough(g[i], want->data[i])) {
                snprintf(j->msg, sizeof j->msg, "output %d element %lld: %.9g, want %.9g", k,
                         (long long)i, (double)g[i], want->data[i]);
                break;
            }
    }
    ms_tensor_release(&got);
}

/* Opens the model and binds inputs as constants: the integer ones, or all of them. */
static ms_status open_bound(case_job *j, ms_onnx_tensor *in, int nin, bool all, ms_onnx_model **m,
                            ms_error *err) {
    MS_CHECK(ms_onnx_open(j->model, m, err));
    for (int k = 0; k < nin && k < ms_onnx_num_inputs(*m); k++)
        if (all || ms_onnx_input_is_index(*m, k))
            MS_CHECK(ms_onnx_bind_input(*m, ms_onnx_input_name(*m, k), &in[k], err));
    return MS_OK;
}

static ms_status run_program(case_job *j, ms_ctx *ctx, ms_onnx_model *m, ms_graph *g,
                             const int *outs, ms_onnx_tensor *in, int nin, ms_onnx_tensor *want,
                             int nwant, ms_error *err) {
    int shape[1] = {1};
    ms_mesh mesh;
    ms_dmesh *dm = NULL;
    ms_program *p = NULL;
    MS_CHECK(ms_mesh_init(&mesh, 1, shape, NULL, NULL, err));
    if (ms_dmesh_create(ctx, &mesh, &dm, err) != MS_OK) {
        ms_mesh_free(&mesh);
        return err->code;
    }
    ms_compile_opts co = {.seed = 1};
    ms_status st = ms_program_compile(g, dm, &co, &p, err);
    for (int i = 0; st == MS_OK && i < ms_program_num_params(p); i++) {
        ms_param_view pv;
        st = ms_program_param(p, i, &pv);
        int64_t n;
        const float *vals = ms_onnx_initializer(m, pv.name, &n);
        if (st == MS_OK && !vals) st = ms_fail(err, MS_ERR_INTERNAL, "no values for %s", pv.name);
        if (st == MS_OK) st = ms_program_load_param(p, i, vals, err);
    }
    for (int k = 0; st == MS_OK && k < nin && k < ms_onnx_num_inputs(m); k++) {
        int v = ms_graph_find(g, ms_onnx_input_name(m, k));
        if (v < 0 || !ms_graph_is_input(g, v)) continue; /* bound: a parameter or constant */
        float *f = xmalloc(sizeof(float) * (size_t)(in[k].numel + 1));
        for (int64_t i = 0; i < in[k].numel; i++) f[i] = (float)in[k].data[i];
        st = ms_program_feed(p, v, f, err);
        free(f);
    }
    if (st == MS_OK) st = ms_program_forward(p, NULL, err);
    for (int k = 0; st == MS_OK && k < nwant && !j->msg[0]; k++)
        if (outs[k] >= 0) compare(j, p, outs[k], &want[k], k, err);
    ms_program_destroy(p);
    ms_dmesh_destroy(dm);
    ms_mesh_free(&mesh);
    return st;
}

static ms_status run_case(ms_ctx *ctx, void *arg, ms_error *err) {
    case_job *j = arg;
    ms_onnx_tensor in[MAX_IO] = {0}, want[MAX_IO] = {0};
    int nin = read_set(j->set, "input", in, MAX_IO),
        nwant = read_set(j->set, "output", want, MAX_IO);
    ms_onnx_model *m = NULL;
    ms_graph *g = NULL;
    int outs[MAX_IO];
    ms_status st = MS_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        ms_onnx_close(m);
        ms_graph_destroy(g);
        m = NULL;
        g = ms_graph_create();
        ms_error_clear(err);
        st = open_bound(j, in, nin, attempt == 1, &m, err);
        int batch = 1;
        for (int k = 0; st == MS_OK && k < ms_onnx_num_inputs(m) && k < nin; k++)
            if (ms_onnx_input_has_batch(m, k) && in[k].ndim) batch = (int)in[k].shape[0];
        if (st == MS_OK) st = ms_onnx_build(m, batch, g, outs, MAX_IO, err);
        if (st == MS_OK || !strstr(err->msg, "must be a constant")) break;
    }
    if (st == MS_OK && ms_onnx_num_outputs(m) != nwant)
        st = ms_fail(err, MS_ERR_INVALID, "%d outputs, %d references", ms_onnx_num_outputs(m),
                     nwant);
    int first = -1; /* an output of no elements is no value (-1): its reference must be empty */
    for (int k = 0; st == MS_OK && k < nwant && !j->msg[0]; k++) {
        if (outs[k] >= 0 && first < 0) first = outs[k];
        if (outs[k] < 0 && want[k].numel)
            snprintf(j->msg, sizeof j->msg, "output %d: empty, want %lld elements", k,
                     (long long)want[k].numel);
    }
    if (st == MS_OK && first >= 0 && !j->msg[0]) {
        ms_graph_set_output(g, first);
        for (int k = 0; k < nwant; k++)
            if (outs[k] >= 0) ms_graph_keep(g, outs[k]);
        st = run_program(j, ctx, m, g, outs, in, nin, want, nwant, err);
    }
    if (st != MS_OK) {
        j->refused = st == MS_ERR_UNSUPPORTED;
        snprintf(j->msg, sizeof j->msg, "%s", err->msg);
    }
    ms_onnx_close(m);
    ms_graph_destroy(g);
    for (int k = 0; k < MAX_IO; k++) ms_onnx_tensor_free(&in[k]), ms_onnx_tensor_free(&want[k]);
    return MS_OK;
}

/* Runs every data set of the test in dir; 1 passed, 0 failed, -1 refused. */
static int run_test(run_state *s, const char *dir, const char *name) {
    char model[1100];
    join(model, sizeof model, dir, "/", "model.onnx");
    char **sets;
    int nsets = 0, res = 1;
    DIR *d = opendir(dir);
    struct dirent *e;
    sets = xmalloc(sizeof *sets * 64);
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "test_data_set_", 14) && nsets < 64)
            sets[nsets++] = xstrdup(e->d_name);
    if (d) closedir(d);
    for (int i = 0; i < nsets && res == 1; i++) {
        char set[1200];
        join(set, sizeof set, dir, "/", sets[i]);
        case_job j = {.model = model, .set = set};
        ms_launch_opts lo = {.backend = MS_BACKEND_THREADS, .nranks = 1, .seed = 1};
        ms_error err = {0};
        if (ms_launch(&lo, run_case, &j, &err) != MS_OK)
            snprintf(j.msg, sizeof j.msg, "%s", err.msg);
        if (j.msg[0]) {
            res = j.refused ? -1 : 0;
            char *at = strstr(j.msg, s->root); /* messages name files from the data folder */
            if (at) memmove(at, at + strlen(s->root) + 1, strlen(at + strlen(s->root) + 1) + 1);
            if (j.refused && s->nref < 400) join(s->refusals[s->nref++], 512, name, ": ", j.msg);
            if (!j.refused && s->nfailed < 200)
                join(s->failed[s->nfailed++], 512, name, ": ", j.msg);
        }
    }
    for (int i = 0; i < nsets; i++) free(sets[i]);
    free(sets);
    if (nsets == 0) res = 0;
    if (s->verbose) printf("%-60s %s\n", name, res > 0 ? "pass" : res < 0 ? "refused" : "FAIL");
    if (res == 0) s->failures++;
    return res;
}

static op_count *count_of(run_state *s, const char *op) {
    for (int i = 0; i < s->nops; i++)
        if (!strcmp(s->ops[i].op, op)) return &s->ops[i];
    op_count *c = &s->ops[s->nops++];
    memset(c, 0, sizeof *c);
    snprintf(c->op, sizeof c->op, "%s", op);
    return c;
}

/* The tests under sub: node tests count per operator (fp32 or other dtypes); the others per
 * folder. An fp32 single-node test refused is a defect of its operator. */
static void run_folder(run_state *s, const char *sub, bool node) {
    char dir[1024];
    join(dir, sizeof dir, s->root, "/", sub);
    char **names;
    int n = list_tests(dir, &names);
    for (int i = 0; i < n; i++) {
        char tdir[1200], model[1300], ops[32][64];
        join(tdir, sizeof tdir, dir, "/", names[i]);
        join(model, sizeof model, tdir, "/", "model.onnx");
        bool fp32 = false;
        int nodes = 0, nops = model_ops(model, ops, 32, &nodes, &fp32);
        bool mapped = nops > 0;
        for (int k = 0; k < nops; k++) mapped &= ms_onnx_op_supported(ops[k]);
        bool single = node && nodes == 1;
        free(names[i]);
        if (!mapped) continue;
        int nref = s->nref;
        int r = run_test(s, tdir, tdir + strlen(dir) + 1);
        if (single && fp32) {
            op_count *c = count_of(s, ops[0]);
            c->total++, c->pass += r > 0, c->refused += r < 0;
            if (r < 0) { /* listed apart: a defect, not an allowed refusal */
                s->fp32_refused++;
                if (s->nref > nref && s->nfp32_ref < 100)
                    memcpy(s->fp32_ref[s->nfp32_ref++], s->refusals[nref], 512);
                s->nref = nref;
            }
        } else if (single) {
            op_count *c = count_of(s, ops[0]);
            c->o_total++, c->o_pass += r > 0, c->o_refused += r < 0;
        } else if (node) {
            s->comp_total++, s->comp_pass += r > 0, s->comp_refused += r < 0;
        } else {
            s->pt_total++, s->pt_pass += r > 0, s->pt_refused += r < 0;
        }
    }
    free(names);
}

static int cmp_op(const void *a, const void *b) {
    return strcmp(((const op_count *)a)->op, ((const op_count *)b)->op);
}

static void report(run_state *s) {
    qsort(s->ops, (size_t)s->nops, sizeof s->ops[0], cmp_op);
    op_count all = {0};
    for (int i = 0; i < s->nops; i++) {
        const op_count *c = &s->ops[i];
        all.pass += c->pass, all.total += c->total, all.refused += c->refused;
        all.o_pass += c->o_pass, all.o_total += c->o_total, all.o_refused += c->o_refused;
    }
    if (s->markdown) {
        printf("| operator | fp32 passed / total | other dtypes passed / total | other dtypes "
               "refused |\n|---|---|---|---|\n");
        for (int i = 0; i < s->nops; i++) {
            const op_count *c = &s->ops[i];
            char fp[32] = "-", ot[32] = "-", orf[16] = "-";
            if (c->total) snprintf(fp, sizeof fp, "%d / %d", c->pass, c->total);
            if (c->o_total) snprintf(ot, sizeof ot, "%d / %d", c->o_pass, c->o_total);
            if (c->o_total) snprintf(orf, sizeof orf, "%d", c->o_refused);
            printf("| %s | %s | %s | %s |\n", c->op, fp, ot, orf);
        }
        printf("| **all single-node tests** | **%d / %d** | %d / %d | %d |\n\n", all.pass,
               all.total, all.o_pass, all.o_total, all.o_refused);
        printf("Composite node tests (several nodes, all mapped): %d / %d passed, %d refused.\n\n",
               s->comp_pass, s->comp_total, s->comp_refused);
        printf("pytorch-converted and pytorch-operator models (all operators mapped): %d / %d "
               "passed, %d refused.\n\n",
               s->pt_pass, s->pt_total, s->pt_refused);
        printf("### Refused tests\n\n");
        for (int i = 0; i < s->nref; i++) printf("- `%s`\n", s->refusals[i]);
        printf("\n");
    } else {
        printf("onnx conformance: single-node fp32 %d / %d passed (%d refused), other dtypes "
               "%d / %d (%d refused), composite %d / %d, pytorch %d / %d (%d refused)\n",
               all.pass, all.total, all.refused, all.o_pass, all.o_total, all.o_refused,
               s->comp_pass, s->comp_total, s->pt_pass, s->pt_total, s->pt_refused);
    }
    for (int i = 0; i < s->nfp32_ref; i++) fprintf(stderr, "REFUSED fp32 %s\n", s->fp32_ref[i]);
    for (int i = 0; i < s->nfailed; i++) fprintf(stderr, "FAIL %s\n", s->failed[i]);
}

int main(int argc, char **argv) {
    static run_state s;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--markdown")) s.markdown = true;
        if (!strcmp(argv[i], "-v")) s.verbose = true;
    }
    if (!ms_onnx_op_supported("Relu")) {
        printf("skipped: this build has no ONNX import (MS_ENABLE_ONNX)\n");
        return 77;
    }
    s.root = getenv("MS_ONNX_TESTDATA") ? getenv("MS_ONNX_TESTDATA")
                                        : "/usr/share/libonnx-testdata/data";
    char node[1024];
    join(node, sizeof node, s.root, "/", "node");
    if (!is_dir(node)) {
        printf("skipped: no ONNX backend test data at %s (Debian: libonnx-testdata)\n", s.root);
        return 77;
    }
    run_folder(&s, "node", true);
    run_folder(&s, "pytorch-converted", false);
    run_folder(&s, "pytorch-operator", false);
    report(&s);
    return s.failures || s.fp32_refused ? 1 : 0;
}

#else

int main(void) {
    printf("skipped: this build has no ONNX import (MS_ENABLE_ONNX)\n");
    return 77;
}

#endif
