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

const char *ms_recompute_name(ms_recompute r); /* "none", "full", "selective" */
const char *ms_precision_name(ms_precision p); /* "fp32", "bf16" */
const char *ms_schedule_name(ms_schedule s);   /* "1f1b", "gpipe", "interleaved", "zb-h1" */

typedef struct ms_strategy {
    int32_t dp, tp, pp, cp; /* mesh degrees, each >= 1; cp > 1 adds the engine's third dim */
    int32_t zero;           /* ZeRO stage 0-3 over the dp group (cp ranks keep whole copies) */
    int32_t micro_batches;  /* micro-batches per step; 0: global batch / (dp x micro_batch) */
    int32_t micro_batch;    /* sequences per micro-batch on one dp rank; 0: from micro_batches */
    int32_t virtual_stages; /* model chunks per pipeline rank (interleaved schedule); 1: none */
    float bucket_mb;        /* gradient all-reduce bucket in MiB; 0: one per gradient */
    uint8_t recompute;      /* ms_recompute */
    uint8_t precision;      /* ms_precision */
    uint8_t schedule;       /* ms_schedule */
    bool sp;                /* sequence parallelism over the tp group */
    bool vocab_replicated;  /* the tied embedding / LM head replicated over tp (default: sharded) */
    bool offload; /* ZeRO-Offload: fp32 master weights and Adam moments in host memory, AdamW
                   * on the host's cores (engine/train/offload.h) */
    uint16_t pp_layers[MS_STRATEGY_MAX_STAGES]; /* layers per stage; all 0: balanced by cost */
} ms_strategy;

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

/* The name: "dp2 x tp2 +sp" for a plain dp/tp/cp/sp strategy (the text logs, tests and the
 * dashboard show), "dp2 x tp2 +sp x cp2"; then every other non-default knob in a fixed order,
 * space separated: " x pp4", " zero1", " recompute" / " selective-recompute", " bf16",
 * " m8" (micro-batches), " mb2" (micro-batch size), " gpipe" / " interleaved" / " zb-h1",
 * " v2" (virtual stages), " layers=7,7,5,5", " bucket25MB", " head-replicated", " offload". Writes
 * at most n bytes (MS_STRATEGY_NAME_MAX always suffices) and returns buf. */
char *ms_strategy_name(const ms_strategy *s, char *buf, size_t n);

/* The control API's short form: {"dp": 2, "tp": 2, "sp": false}, "cp" and "pp" when > 1, then
 * every non-default knob ("zero", "recompute", "precision", "micro_batches", "micro_batch",
 * "schedule", "virtual_stages", "pp_layers", "bucket_mb", "vocab_parallel", "offload"). Parsing it
 * gives back an equal strategy. MS_STRATEGY_JSON_MAX bytes always suffice; returns buf. */
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
} ms_placement_rules;

/* --- reading strategies ---------------------------------------------------------------------- */

/* The one parser, for strategy files, --switch and the dashboard's POST bodies. Two forms:
 *   short  {"dp": 2, "tp": 2, "sp": false, "zero": 1, ...}           (degrees at the top)
 *   file   {"mesh": {"dp": 2, "tp": 2, "pp": 1, "cp": 1}, "sp": false, ...,
 *           "placements": {"h.*.mlp.c_fc.weight": "[R, S(1)]", ...}}
 * Knobs: sp (bool), zero (0-3), recompute ("none", "full", "selective"; true / false mean full
 * / none), precision ("fp32", "bf16"), micro_batches (>= 1), micro_batch (>= 1; alone it sets
 * the size and the count follows from the batch), schedule ("1f1b", "gpipe", "interleaved",
 * "zb-h1"), virtual_stages (>= 1), pp_layers (one positive count per stage), bucket_mb (> 0),
 * vocab_parallel (bool), offload (bool). Unset knobs take their defaults.
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
} ms_sharding;

/* The ms_shard_fn for ms_compile_opts (user = an ms_sharding). */
bool ms_strategy_shard(void *user, const char *name, const ms_shape *shape, int mesh_ndim,
                       ms_placements *pl);

/* The ms_compile_opts.recompute bits for s's recompute mode: full recomputes every transformer
 * block (MS_REGION_BLOCK), selective the core of attention (MS_REGION_ATTENTION). */
unsigned ms_strategy_recompute_regions(const ms_strategy *s);

bool ms_glob_match(const char *pattern, const char *s);

/* --- the job a strategy is judged against ---------------------------------------------------- */

typedef struct ms_job_shape {
    int world; /* ranks the job runs on */
    int batch; /* global batch, sequences per step */
    int seq;   /* tokens per sequence */
} ms_job_shape;

#endif
