/* strategy.h - a parallel strategy: one value with every knob, its name, its JSON, and the
 * placement annotations it puts on a model's named values.
 *
 * An ms_strategy is a small value (the planner holds tens of thousands): the mesh degrees
 * dp x tp x pp x cp, sequence parallelism, the ZeRO stage, activation recompute, precision,
 * micro-batching, the pipeline schedule and the gradient bucket size. Everything that reads,
 * names, compares or judges a strategy goes through this header (the validator, which needs
 * the planner's memory estimate, is engine/plan/validate.h), so the CLI, the planner, the
 * advisor, the dashboard and the live switch agree on what a strategy is.
 *
 * The engine runs dp x tp x cp meshes (+ sp) as annotations. The built-in Megatron rules for
 * tp: attention: c_attn weight/bias sharded by heads (column-parallel), c_proj weight by rows
 * (row-parallel); MLP: c_fc column-parallel, c_proj row-parallel; the tied embedding
 * vocab-parallel. The residual stream is replicated over tp, or, with sp, sharded on the
 * sequence dim (so LayerNorm and dropout run on a slice of the sequence and the all-reduces
 * become reduce-scatter + all-gather pairs). LLaMA the same way: q, k, v (by heads), gate and up
 * column-parallel, o and down row-parallel with their outputs annotated P(sum) so the residual
 * add reduces them (one all-reduce each, a reduce-scatter under sp), the embedding lookup
 * vocab-parallel (P(sum) likewise) and lm_head vocab-parallel; kv heads that do not divide tp
 * are replicated while the query heads still split. Data parallelism shards the batch dim of inputs
 * and activations over dp. A third mesh dim, cp (context parallel), shards the sequence dim of
 * the inputs and the residual stream over its own group; the attention rule, which needs whole
 * sequences, makes the completion pass move qkv from sequence- to head-sharding with an
 * all-to-all (as DeepSpeed-Ulysses does). Everything else the completion pass infers from the
 * operators' SPMD rules. Explicit "placements" patterns from a strategy file are a separate
 * value (ms_placement_rules) passed alongside the strategy, tried before the built-in rules.
 */
#ifndef MS_STRATEGY_H
#define MS_STRATEGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/dist/mesh.h"
#include "engine/graph/graph.h"
#include "engine/model/model.h"

#define MS_STRATEGY_MAX_DEGREE 65536    /* one mesh dim */
#define MS_STRATEGY_MAX_RANKS  16777216 /* the product of the degrees */
#define MS_STRATEGY_MAX_STAGES 64       /* entries of pp_layers */
#define MS_STRATEGY_NAME_MAX   640      /* ms_strategy_name never needs more */
#define MS_STRATEGY_JSON_MAX   1024     /* ms_strategy_short_json never needs more */

typedef enum ms_recompute {
    MS_RECOMPUTE_NONE,
    MS_RECOMPUTE_FULL,      /* keep only each layer's input, run the layer forward again */
    MS_RECOMPUTE_SELECTIVE, /* keep the linear layers' activations, recompute attention's core */
    MS_RECOMPUTE_COUNT
} ms_recompute;

typedef enum ms_precision {
    MS_PRECISION_FP32,
    MS_PRECISION_BF16, /* bf16 weights, activations and gradients; fp32 master weights and moments
                        */
    MS_PRECISION_COUNT
} ms_precision;

typedef enum ms_schedule {
    MS_SCHEDULE_1F1B,        /* one forward one backward (PipeDream-Flush) */
    MS_SCHEDULE_GPIPE,       /* all forwards, then all backwards */
    MS_SCHEDULE_INTERLEAVED, /* 1F1B over virtual_stages model chunks per rank */
    MS_SCHEDULE_ZB_H1,       /* zero-bubble H1: weight gradients fill the bubble */
    MS_SCHEDULE_COUNT
} ms_schedule;

extern const char *const ms_recompute_names[];      /* "none", "full", "selective" */
extern const char *const ms_recompute_name_parts[]; /* in names: "", "recompute", ... */
extern const char *const ms_precision_names[];      /* "fp32", "bf16" */
extern const char *const ms_schedule_names[];       /* "1f1b", "gpipe", ... */
const char *ms_recompute_name(ms_recompute r);      /* "none", "full", "selective" */
const char *ms_precision_name(ms_precision p);      /* "fp32", "bf16" */
const char *ms_schedule_name(ms_schedule s);        /* "1f1b", "gpipe", "interleaved", "zb-h1" */

/* --- the settings: one table -----------------------------------------------------------------
 * Every setting of a strategy is one row of MS_STRATEGY_SETTINGS. The row declares the struct
 * field, and the table built from it (ms_settings) drives everything else: the defaults, the
 * comparison, the name, the short JSON and its parser, the command-line flags of train, eval
 * and explain (the field with '_' as '-': micro_batches is --micro-batches) and the planner's
 * --evaluate keys (the field). Adding a setting is one row here plus what it does.
 *
 *   X(field, kind, default, lo, hi, words, name_fmt, name_words, flags, what, help)
 *
 *   field       the member, and the setting's one name (JSON key, flag, --evaluate key)
 *   kind        DEGREE (a mesh degree; a file may put it under "mesh"), INT, BOOL, ENUM (an
 *               index into words), MIB (a size in MiB), LAYERS (layer counts, one per stage)
 *   lo, hi      the accepted range (ENUM: indices)
 *   name_fmt    the setting's part of ms_strategy_name, printed over the value when it is not
 *               the default (ENUM: over name_words, or words when NULL; BOOL: as it is)
 *   flags       MS_SET_NAME_ALWAYS, MS_SET_JSON_ALWAYS: shown even at the default;
 *               MS_SET_BOOL_WORDS: an ENUM that also takes true / false (words[1] / words[0])
 *   what        what a value is, for messages ("a ZeRO stage")
 *   help        the command-line flag's one line of help
 */
#define MS_SET_NAME_ALWAYS 1u
#define MS_SET_JSON_ALWAYS 2u
#define MS_SET_BOOL_WORDS  4u

#define MS_STRATEGY_SETTINGS(X)                                                                    \
    X(dp, DEGREE, 1, 1, MS_STRATEGY_MAX_DEGREE, NULL, "dp%d", NULL,                                \
      MS_SET_NAME_ALWAYS | MS_SET_JSON_ALWAYS, "a degree", "data-parallel ranks (default 1)")      \
    X(tp, DEGREE, 1, 1, MS_STRATEGY_MAX_DEGREE, NULL, " x tp%d", NULL,                             \
      MS_SET_NAME_ALWAYS | MS_SET_JSON_ALWAYS, "a degree", "tensor-parallel ranks (default 1)")    \
    X(sp, BOOL, 0, 0, 1, NULL, " +sp", NULL, MS_SET_JSON_ALWAYS, "a switch",                       \
      "sequence parallelism in the tensor-parallel group")                                         \
    X(cp, DEGREE, 1, 1, MS_STRATEGY_MAX_DEGREE, NULL, " x cp%d", NULL, 0, "a degree",              \
      "context-parallel ranks (default 1)")                                                        \
    X(pp, DEGREE, 1, 1, MS_STRATEGY_MAX_DEGREE, NULL, " x pp%d", NULL, 0, "a degree",              \
      "pipeline stages (default 1; explain draws the schedule)")                                   \
    X(zero, INT, 0, 0, 3, NULL, " zero%d", NULL, 0, "a ZeRO stage",                                \
      "ZeRO stage over dp: 1 shards the optimizer state, 2 also the gradients, 3 also the "        \
      "parameters (default 0)")                                                                    \
    X(recompute, ENUM, MS_RECOMPUTE_NONE, 0, MS_RECOMPUTE_COUNT - 1, ms_recompute_names, " %s",    \
      ms_recompute_name_parts, MS_SET_BOOL_WORDS, "a recompute mode",                              \
      "activation recompute: full re-runs each layer's forward in backward, selective "            \
      "attention's core only (default none)")                                                      \
    X(recompute_layers, INT, 0, 0, 65535, NULL, " rc-layers%d", NULL, 0, "a layer count",          \
      "with full recompute: recompute only the first N layers of each pipeline chunk, keep the "   \
      "others' activations (Megatron's block method); 0: every layer (default 0)")                 \
    X(precision, ENUM, MS_PRECISION_FP32, 0, MS_PRECISION_COUNT - 1, ms_precision_names, " %s",    \
      NULL, 0, "a precision",                                                                      \
      "bf16: bf16 activations, weights and gradients (collectives move half the bytes), fp32 "     \
      "master weights and optimizer state (default fp32)")                                         \
    X(micro_batches, INT, 1, 1, 1 << 24, NULL, " m%d", NULL, 0, "a micro-batch count",             \
      "micro-batches per step; they divide each dp rank's batch (default 1)")                      \
    X(micro_batch, INT, 0, 1, 1 << 24, NULL, " mb%d", NULL, 0, "sequences per micro-batch",        \
      "sequences per micro-batch on one dp rank; alone, the count follows from the batch")         \
    X(schedule, ENUM, MS_SCHEDULE_1F1B, 0, MS_SCHEDULE_COUNT - 1, ms_schedule_names, " %s", NULL,  \
      0, "a pipeline schedule", "pipeline schedule (default 1f1b)")                                \
    X(virtual_stages, INT, 1, 1, 255, NULL, " v%d", NULL, 0, "model chunks per pipeline rank",     \
      "model chunks per pipeline rank, for the interleaved schedule (default 1)")                  \
    X(pp_layers, LAYERS, 0, 1, 65535, NULL, " layers=%s", NULL, 0, "layer counts",                 \
      "layers per pipeline stage, one count per stage (default: balanced by cost)")                \
    X(bucket_mb, MIB, 0, 0, 1 << 20, NULL, " bucket%gMB", NULL, 0, "a bucket size",                \
      "all-reduce gradients in buckets of this many MiB, issued during backward; 0: one per "      \
      "gradient at the end (default: 25 on a CUDA device when gradients are reduced over dp or "   \
      "cp, else 0)")                                                                               \
    X(head_replicated, BOOL, 0, 0, 1, NULL, " head-replicated", NULL, 0, "a switch",               \
      "keep the word embedding and the head whole on every tp rank instead of sharding their "     \
      "vocabulary over tp; needs tp 2 or more")                                                    \
    X(offload, BOOL, 0, 0, 1, NULL, " offload", NULL, 0, "a switch",                               \
      "ZeRO-Offload: fp32 master weights and Adam moments in host memory (pinned beside a GPU), "  \
      "AdamW on the host's cores; the gradients go to the host during backward, the host AdamW "   \
      "overlaps the next step's forward (without clipping: the backward)")

/* The C type of each kind (LAYERS: an array of MS_STRATEGY_MAX_STAGES). */
#define MS_SET_CTYPE_DEGREE int32_t
#define MS_SET_CTYPE_INT    int32_t
#define MS_SET_CTYPE_BOOL   bool
#define MS_SET_CTYPE_ENUM   uint8_t
#define MS_SET_CTYPE_MIB    float
#define MS_SET_CTYPE_LAYERS uint16_t
#define MS_SET_DIMS_DEGREE
#define MS_SET_DIMS_INT
#define MS_SET_DIMS_BOOL
#define MS_SET_DIMS_ENUM
#define MS_SET_DIMS_MIB
#define MS_SET_DIMS_LAYERS [MS_STRATEGY_MAX_STAGES]

#define MS_SET_FIELD(field, kind, ...) MS_SET_CTYPE_##kind field MS_SET_DIMS_##kind;
typedef struct ms_strategy {
    MS_STRATEGY_SETTINGS(MS_SET_FIELD)
} ms_strategy;
#undef MS_SET_FIELD

#define MS_SET_ID(field, ...) MS_SET_##field,
typedef enum ms_setting_id { MS_STRATEGY_SETTINGS(MS_SET_ID) MS_SET_COUNT } ms_setting_id;
#undef MS_SET_ID
_Static_assert(MS_SET_COUNT <= 32, "a setting mask is 32 bits");

typedef enum ms_setting_kind {
    MS_SET_KIND_DEGREE,
    MS_SET_KIND_INT,
    MS_SET_KIND_BOOL,
    MS_SET_KIND_ENUM,
    MS_SET_KIND_MIB,
    MS_SET_KIND_LAYERS,
} ms_setting_kind;

/* One row of the table, as data. */
typedef struct ms_setting {
    const char *name; /* the field's name: JSON key and --evaluate key */
    ms_setting_kind kind;
    size_t offset; /* of the field in ms_strategy */
    double dflt, lo, hi;
    const char *const *words; /* ENUM: the accepted words, index order */
    const char *name_fmt;
    const char *const *name_words; /* ENUM: the words name_fmt prints; NULL: words */
    unsigned flags;
    const char *what, *help;
} ms_setting;

extern const ms_setting ms_settings[MS_SET_COUNT];

/* The setting called `name` (exact), or NULL. */
const ms_setting *ms_setting_find(const char *name);
/* The setting's command-line flag without the dashes: its name with '_' as '-'. */
const char *ms_setting_flag(const ms_setting *st, char *buf, size_t n);
/* The argument st's flag shows in --help (buf holds an ENUM's words; NULL for a BOOL). */
const char *ms_setting_metavar(const ms_setting *st, char *buf, size_t n);
/* Sets st in s from text: a number, a word (ENUM), true / false / on / off / 1 / 0 (BOOL; NULL
 * means true), or counts separated by ',' or ':' (LAYERS). On bad text writes what was expected
 * to msg ("an integer in 0..3") and returns false, s untouched. */
bool ms_setting_set_text(ms_strategy *s, const ms_setting *st, const char *text, char *msg,
                         size_t cap);
/* st's value in s as a number (BOOL 0 / 1, ENUM its index; LAYERS the first count, 0 when
 * balanced by cost). */
double ms_setting_value(const ms_strategy *s, const ms_setting *st);
/* st's value in s as a user reads it: a number, a word (ENUM), on / off (BOOL), the layer
 * counts "3,1" or "balanced" (LAYERS). Returns buf. */
const char *ms_setting_text(const ms_strategy *s, const ms_setting *st, char *buf, size_t n);
/* Whether a and b agree on st. */
bool ms_setting_equal(const ms_strategy *a, const ms_strategy *b, const ms_setting *st);
/* Copies st's value from src to dst. */
void ms_setting_copy(ms_strategy *dst, const ms_strategy *src, const ms_setting *st);
/* After some settings were given (bit MS_SET_x of `given`): a micro-batch size given without a
 * count leaves the count to follow from the batch (micro_batches 0). */
void ms_strategy_settle(ms_strategy *s, uint32_t given);

/* Checks the mesh degrees of a run (flags, strategy files, live switches): each at least 1,
 * their product at most MS_MESH_MAX_RANKS (computed without overflow) and, when world > 0,
 * equal to it. On success *ranks (may be NULL) is the product; errors name every degree. */
ms_status ms_strategy_check_degrees(int dp, int tp, int cp, int world, int *ranks, ms_error *err);

/* Every knob at its default: dp = tp = pp = cp = 1, one micro-batch, 1F1B, fp32, no ZeRO, no
 * recompute, no sp, no buckets, the head vocab-parallel. The one place defaults live. */
void ms_strategy_defaults(ms_strategy *s);

/* Defaults with the mesh dp x tp (+ sp) (x cp). Errors: a degree outside 1..65536. Whether
 * the strategy suits a job is the validator's question (engine/plan/validate.h). */
ms_status ms_strategy_init(ms_strategy *s, int dp, int tp, int cp, bool sp, ms_error *err);

/* dp x tp x pp x cp, or -1 when a degree is < 1 or the product exceeds MS_STRATEGY_MAX_RANKS
 * (computed without overflow). */
int ms_strategy_ranks(const ms_strategy *s);

/* The micro-batch size and count for a global batch of `batch` sequences: an unset (0) field
 * follows from batch = dp x size x count. False when they do not divide (out untouched then). */
bool ms_strategy_micro(const ms_strategy *s, int batch, int *size, int *count);

/* Same strategy: every knob equal (pp_layers compared over all stages). */
bool ms_strategy_equal(const ms_strategy *a, const ms_strategy *b);

/* The name: each setting's name_fmt in table order, where it is not at its default (dp and tp
 * always): "dp2 x tp2 +sp x cp2 x pp4 zero1 recompute bf16 m8 interleaved v2 bucket25MB
 * head-replicated offload". micro_batches is shown where it is not 1, or explicitly 1 beside a
 * size. Writes at most n bytes (MS_STRATEGY_NAME_MAX always suffices) and returns buf. */
char *ms_strategy_name(const ms_strategy *s, char *buf, size_t n);

/* The control API's short form: {"dp": 2, "tp": 2, "sp": false}, then every setting not at its
 * default, in table order, under its own name. Parsing it gives back an equal strategy.
 * MS_STRATEGY_JSON_MAX bytes always suffice; returns buf. */
char *ms_strategy_short_json(const ms_strategy *s, char *buf, size_t n);

/* --- placement rules: explicit annotations from a strategy file ------------------------------ */

#define MS_STRATEGY_MAX_RULES 64

typedef struct ms_placement_rule {
    char pattern[96]; /* glob: '*' matches any run of characters */
    ms_placements pl; /* one entry per engine mesh dim (dp, tp[, cp]) */
} ms_placement_rule;

typedef struct ms_placement_rules {
    int n;
    ms_placement_rule r[MS_STRATEGY_MAX_RULES];
    /* The rules are the whole layout: the model's own hints (the def's shard hook, the built-in
     * language models' Megatron rules) are not read; only these rules and the inputs' rows over
     * dp (over cp, the built-in models' sequence dim) annotate the graph, and the completion pass
     * places everything else. What the automatic search compiles and what its rules run under. */
    bool no_hints;
    /* The strategy file said "placements": "auto", or "*": "auto" beside pins: the job finds
     * the rules before the ranks start (engine/plan/auto_place.h); until then the rules are
     * the pins (n is 0 for "auto" alone). */
    bool auto_place;
} ms_placement_rules;

/* --- reading strategies ---------------------------------------------------------------------- */

/* The one parser, for strategy files, --switch and the dashboard's POST bodies. Two forms:
 *   short  {"dp": 2, "tp": 2, "sp": false, "zero": 1, ...}           (degrees at the top)
 *   file   {"mesh": {"dp": 2, "tp": 2, "pp": 1, "cp": 1}, "sp": false, ...,
 *           "placements": {"h.*.mlp.c_fc.weight": "[R, S(1)]", ...}}
 * or "placements": "auto" (rules->auto_place: the job searches for the tensor-parallel layout,
 * engine/plan/auto_place.h), or pins and "*": "auto" in one object (the search places the rest
 * around the pins), or rules and "*": "complete" (no_hints: the rules are the whole layout, the
 * completion pass places the rest; how a searched layout is written out).
 * Settings: every row of MS_STRATEGY_SETTINGS under its name, in its range; recompute also
 * takes true / false (full / none); a micro_batch alone sets the size and the count follows
 * from the batch. Unset settings take their defaults. The former key "vocab_parallel" is
 * refused naming its replacement, "head_replicated" (of the opposite sense).
 * Refused, each naming `name` and the JSON path: malformed JSON, text after the value, a
 * duplicate key, an unknown key (with the closest known one), a wrong type or value, degrees
 * outside 1..65536 or multiplying past MS_STRATEGY_MAX_RANKS, degrees both in "mesh" and at
 * the top. "placements" (glob patterns over value names, one placement per engine mesh dim) go
 * to *rules; with rules == NULL they are refused. Whether the strategy suits a job (world,
 * heads, batch, what the engine runs) is the validator's to say. *s is written only on
 * success; rules->n is 0 after a failure. */
ms_status ms_strategy_parse_json(const char *json, size_t len, const char *name, ms_strategy *s,
                                 ms_placement_rules *rules, ms_error *err);

/* ms_strategy_parse_json over a file (at most 1 MiB); a missing, unreadable or directory path
 * is named as such. rules may be NULL (placements are then refused). */
ms_status ms_strategy_load(const char *path, ms_strategy *s, ms_placement_rules *rules,
                           ms_error *err);

/* --- annotating a model ---------------------------------------------------------------------- */

/* The mesh "dp=D,tp=T" (",cp=C" when cp > 1) over world ranks 0..ranks-1 (what the engine
 * runs: pp is not a mesh dim here). dp is its first dim, the one ZeRO shards over. */
#define MS_STRATEGY_DP_DIM 0
ms_status ms_strategy_mesh(const ms_strategy *s, ms_mesh *out, ms_error *err);

/* What ms_strategy_shard reads through its user pointer; both borrowed. */
typedef struct ms_sharding {
    const ms_strategy *s;
    const ms_placement_rules *rules; /* may be NULL: only the built-in rules */
    /* LLaMA's kv heads (0: unknown), for callers' bookkeeping: the rules read the kv heads
     * off k_proj's shape (replicated over tp when they do not divide it, the query heads and
     * o_proj still split). */
    int kv_heads;
    /* The model (its shard hook, its inputs), or NULL: the built-in language models' rules */
    const ms_model_def *def;
} ms_sharding;

/* The ms_shard_fn for ms_compile_opts (user = an ms_sharding): the strategy file's glob rules
 * first, then the model's shard hook, then its inputs' rows over dp; without a def, the
 * built-in language models' rules (ms_lm_shard). Rules with no_hints: the rules, then only the
 * inputs' rows over dp (and the built-in models' inputs' sequence over cp). */
bool ms_strategy_shard(void *user, const char *name, const ms_shape *shape, int mesh_ndim,
                       ms_placements *pl);

/* Megatron's layout for the built-in language models' names (Hugging Face style): inputs and
 * the residual stream over dp (and cp), the attention and MLP weights split over tp. */
bool ms_lm_shard(const ms_strategy *s, const char *name, const ms_shape *shape, int mesh_ndim,
                 ms_placements *pl);

/* The ms_compile_opts.recompute bits for s's recompute mode: full recomputes every transformer
 * block (MS_REGION_BLOCK), selective the core of attention (MS_REGION_ATTENTION). */
unsigned ms_strategy_recompute_regions(const ms_strategy *s);

/* The compile options a strategy decides, the one place each setting becomes one: placements
 * through sh (which must outlive the compile; its s is set to s), ZeRO, recompute, precision,
 * buckets, offload's deferred parameter sync and zb-h1's split weight gradients. The caller
 * adds what the run decides (micro-batches, seed, loss scale, in-flight bound). */
ms_compile_opts ms_strategy_compile_opts(const ms_strategy *s, ms_sharding *sh);

bool ms_glob_match(const char *pattern, const char *s);

/* --- the job a strategy is judged against ---------------------------------------------------- */

typedef struct ms_job_shape {
    int world; /* ranks the job runs on */
    int batch; /* global batch, sequences per step */
    int seq;   /* tokens per sequence */
} ms_job_shape;

#endif
