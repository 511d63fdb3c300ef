/* config.c - parsing and validating config.json with cJSON; the GPT-2 parameter count. */
#include "engine/model/config.h"

#include "engine/io/json_text.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/io/fileio.h"

/* Upper bounds keep every derived size (the parameter count above all) inside int64 and
 * catch typos such as an extra zero long before an allocation would. */
#define MAX_LAYERS    512 /* published models stop near 128; explain compiles every layer */
#define MAX_HEADS     65536
#define MAX_EMBD      (1 << 20)
#define MAX_VOCAB     (1 << 24)
#define MAX_POSITIONS (1 << 24)

typedef struct field {
    const char *keys[3]; /* the canonical key first, then HF aliases; NULL-terminated */
} field;

bool ms_model_ties_embedding(const ms_model_config *c) {
    return c->model_type != MS_MODEL_LLAMA || c->tie_word_embeddings;
}

const char *ms_model_type_name(ms_model_type t) {
    return t == MS_MODEL_BERT ? "bert" : t == MS_MODEL_LLAMA ? "llama" : "gpt2";
}

/* The value of the first present (non-null) key among f's aliases, or NULL. Two aliases
 * that disagree are an error: silently preferring one would hide a broken file. */
static ms_status lookup(const cJSON *root, const field *f, const char *name, const cJSON **out,
                        const char **key, ms_error *err) {
    *out = NULL;
    *key = f->keys[0];
    for (int i = 0; i < 3 && f->keys[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, f->keys[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (*out && !cJSON_Compare(*out, v, 1)) {
            char a[64], b[64];
            ms_json_describe(*out, a, sizeof a);
            ms_json_describe(v, b, sizeof b);
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: $.%s is %s but its alias $.%s is %s; remove one of them", name,
                           *key, a, f->keys[i], b);
        }
        if (!*out) {
            *out = v;
            *key = f->keys[i];
        }
    }
    return MS_OK;
}

static ms_status get_int(const cJSON *root, const field *f, int max, const char *name, int *out,
                         ms_error *err) {
    const cJSON *v;
    const char *key;
    MS_CHECK(lookup(root, f, name, &v, &key, err));
    if (!v) {
        if (f->keys[1])
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: missing required key \"%s\" (also accepted: \"%s\"%s%s%s); add it "
                           "to the top-level object",
                           name, f->keys[0], f->keys[1], f->keys[2] ? ", \"" : "",
                           f->keys[2] ? f->keys[2] : "", f->keys[2] ? "\"" : "");
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: missing required key \"%s\"; add it to the top-level object", name,
                       f->keys[0]);
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= 1 && isfinite(d) && d == floor(d))) {
        char got[64];
        ms_json_describe(v, got, sizeof got);
        return ms_fail(err, MS_ERR_INVALID, "%s: $.%s: expected a positive integer, got %s", name,
                       key, got);
    }
    if (d > max)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.%s: %.0f is larger than the supported maximum %d; is it a typo?",
                       name, key, d, max);
    *out = (int)d;
    return MS_OK;
}

/* An optional number in [lo, hi) (or (lo, hi) when lo_open); `def` when absent or null. */
static ms_status get_real(const cJSON *root, const field *f, double def, double lo, bool lo_open,
                          double hi, const char *what, const char *name, double *out,
                          ms_error *err) {
    const cJSON *v;
    const char *key;
    MS_CHECK(lookup(root, f, name, &v, &key, err));
    if (!v) {
        *out = def;
        return MS_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(lo_open ? d > lo : d >= lo) || !(d < hi)) {
        char got[64];
        ms_json_describe(v, got, sizeof got);
        return ms_fail(err, MS_ERR_INVALID, "%s: $.%s: expected %s, got %s", name, key, what, got);
    }
    *out = d;
    return MS_OK;
}

/* Byte offset -> 1-based line and column, for parse errors. */
static void line_col(const char *s, size_t off, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static ms_status parse_error(const char *json, size_t len, size_t off, const char *name,
                             const char *what, ms_error *err) {
    if (off > len) off = len;
    size_t line, col;
    line_col(json, off, &line, &col);
    /* Show a little of the text at the error, with control bytes made visible. */
    char near[24];
    size_t k = 0;
    for (size_t i = off; i < len && k < 16; i++, k++) {
        unsigned char c = (unsigned char)json[i];
        near[k] = (c >= 32 && c < 127) ? (char)c : '?';
    }
    near[k] = '\0';
    if (ms_json_depth_at(json, off) >= CJSON_NESTING_LIMIT)
        return ms_fail(
            err, MS_ERR_INVALID,
            "%s: malformed JSON: nested more than %d levels deep at byte %zu (line %zu); "
            "a config is a flat object",
            name, CJSON_NESTING_LIMIT, off, line);
    return ms_fail(err, MS_ERR_INVALID,
                   "%s: %s at byte %zu (line %zu, column %zu)%s%s%s; fix the syntax there (a "
                   "missing comma, quote or bracket?)",
                   name, what, off, line, col, k ? " near '" : " at the end of the file",
                   k ? near : "", k ? "'" : "");
}

/* LLaMA's own invariants: grouped kv heads, an even head size for the rotary pairs. */
static ms_status validate_llama(const ms_model_config *c, const char *name, ms_error *err) {
    if (c->n_kv_head < 1 || c->n_kv_head > c->n_head || c->n_head % c->n_kv_head)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: num_key_value_heads %d does not divide num_attention_heads %d (each "
                       "kv head serves a whole group of query heads); pick a divisor of %d",
                       name, c->n_kv_head, c->n_head, c->n_head);
    if (c->n_embd % c->n_head == 0 && (c->n_embd / c->n_head) % 2)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: head size hidden_size / num_attention_heads = %d is odd; rotary "
                       "embeddings rotate pairs, so pick sizes giving an even head size",
                       name, c->n_embd / c->n_head);
    if (c->intermediate_size < 1 || c->intermediate_size > MAX_EMBD * 8)
        return ms_fail(err, MS_ERR_INVALID, "%s: intermediate_size %d must be in [1, %d]", name,
                       c->intermediate_size, MAX_EMBD * 8);
    if (!(c->rope_theta > 1))
        return ms_fail(err, MS_ERR_INVALID, "%s: rope_theta %g must be above 1, typically 10000",
                       name, c->rope_theta);
    return MS_OK;
}

ms_status ms_config_validate(const ms_model_config *c, const char *name, ms_error *err) {
    if (!name) name = "config";
    struct {
        const char *key;
        int v, max;
    } ints[] = {{"n_layer", c->n_layer, MAX_LAYERS},
                {"n_head", c->n_head, MAX_HEADS},
                {"n_embd", c->n_embd, MAX_EMBD},
                {"vocab_size", c->vocab_size, MAX_VOCAB},
                {"n_positions", c->n_positions, MAX_POSITIONS}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ints[i].v < 1 || ints[i].v > ints[i].max)
            return ms_fail(err, MS_ERR_INVALID, "%s: %s is %d; it must be in [1, %d]", name,
                           ints[i].key, ints[i].v, ints[i].max);
    }
    if (c->model_type != MS_MODEL_GPT2 && c->model_type != MS_MODEL_BERT &&
        c->model_type != MS_MODEL_LLAMA)
        return ms_fail(err, MS_ERR_INVALID, "%s: model_type %d is not gpt2, bert or llama", name,
                       (int)c->model_type);
    if (c->model_type == MS_MODEL_LLAMA) MS_CHECK(validate_llama(c, name, err));
    if (!(c->layer_norm_epsilon > 0 && c->layer_norm_epsilon < 1))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: layer_norm_epsilon is %g; it must be in (0, 1), typically 1e-5", name,
                       c->layer_norm_epsilon);
    const double p[3] = {c->resid_pdrop, c->attn_pdrop, c->embd_pdrop};
    const char *pk[3] = {"resid_pdrop", "attn_pdrop", "embd_pdrop"};
    for (int i = 0; i < 3; i++)
        if (!(p[i] >= 0 && p[i] < 1))
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: %s is %g; a dropout probability must be in [0, 1)", name, pk[i],
                           p[i]);
    if (c->n_embd % c->n_head != 0) {
        int lo = c->n_embd / c->n_head * c->n_head, hi = lo + c->n_head;
        char alt[64] = "";
        if (lo > 0) snprintf(alt, sizeof alt, "%d or ", lo);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: n_embd %d is not divisible by n_head %d (each head gets n_embd / "
                       "n_head dimensions); set n_embd to a multiple of n_head (e.g. %s%d) or "
                       "pick an n_head that divides %d",
                       name, c->n_embd, c->n_head, alt, hi, c->n_embd);
    }
    return MS_OK;
}

static const field F_LAYER = {{"n_layer", "num_hidden_layers", NULL}};
static const field F_HEAD = {{"n_head", "num_attention_heads", NULL}};
static const field F_EMBD = {{"n_embd", "hidden_size", NULL}};
static const field F_VOCAB = {{"vocab_size", NULL, NULL}};
static const field F_POS = {{"n_positions", "max_position_embeddings", "n_ctx"}};
static const field F_EPS = {{"layer_norm_epsilon", "layer_norm_eps", NULL}};
static const field F_RESID = {{"resid_pdrop", "hidden_dropout_prob", NULL}};
static const field F_ATTN = {{"attn_pdrop", "attention_probs_dropout_prob", NULL}};
static const field F_EMBDP = {{"embd_pdrop", NULL, NULL}};

/* --- keys besides the ones read above ------------------------------------------------------
 * A config may hold only keys meshscope knows: one it reads, one whose value it checks against
 * the model it builds, or one Hugging Face writes that changes nothing here. Any other key (a
 * typo such as "n_layers", a feature such as rotary embeddings) is refused: ignoring it would
 * train a different model than the file describes. docs/configs.md lists the three kinds. */

static const field *const READ_FIELDS[] = {&F_LAYER, &F_HEAD,  &F_EMBD, &F_VOCAB, &F_POS,
                                           &F_EPS,   &F_RESID, &F_ATTN, &F_EMBDP};

/* Hugging Face keys that change nothing in the model meshscope builds. */
static const char *const IGNORED_KEYS[] = {
    /* provenance and runtime switches */
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict", "gradient_checkpointing",
    /* tokenizer ids: the byte tokenizer has no special tokens */
    "bos_token_id", "eos_token_id", "pad_token_id", "tokenizer_class",
    /* heads and pipelines meshscope does not build */
    "task_specific_params", "id2label", "label2id", "problem_type", "classifier_dropout",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout",
    /* fp16 upcasting: meshscope computes attention in fp32 */
    "reorder_and_upcast_attn",
    /* one segment is fed, and its constant embedding is what the position embedding learns */
    "type_vocab_size"};

static bool is_gelu(const cJSON *v, const ms_model_config *c) {
    (void)c;
    static const char *const gelus[] = {"gelu",        "gelu_new",      "gelu_fast",
                                        "gelu_python", "gelu_accurate", "gelu_pytorch_tanh"};
    for (size_t i = 0; cJSON_IsString(v) && i < sizeof gelus / sizeof gelus[0]; i++)
        if (!strcmp(v->valuestring, gelus[i])) return true;
    return false;
}
static bool is_true(const cJSON *v, const ms_model_config *c) {
    (void)c;
    return cJSON_IsTrue(v);
}
static bool is_false(const cJSON *v, const ms_model_config *c) {
    (void)c;
    return cJSON_IsFalse(v);
}
static bool is_mlp_width(const cJSON *v, const ms_model_config *c) {
    return cJSON_IsNumber(v) && v->valuedouble == 4.0 * c->n_embd;
}
static bool is_absolute(const cJSON *v, const ms_model_config *c) {
    (void)c;
    return cJSON_IsString(v) && !strcmp(v->valuestring, "absolute");
}
static bool is_init_std(const cJSON *v, const ms_model_config *c) {
    (void)c;
    return cJSON_IsNumber(v) && fabs(v->valuedouble - 0.02) < 1e-12;
}
/* GPT-2 is causal whatever is_decoder says; BERT would become causal. */
static bool not_decoder(const cJSON *v, const ms_model_config *c) {
    return cJSON_IsFalse(v) || c->model_type == MS_MODEL_GPT2;
}

/* Keys whose value must be the one meshscope builds (null means the default, which is). */
typedef struct checked_key {
    const char *key;
    bool (*ok)(const cJSON *v, const ms_model_config *c);
    const char *why; /* what meshscope builds, and the fix */
} checked_key;

#define GELU_WHY                                                                                   \
    "meshscope's MLP uses GELU (computed in its tanh form); set \"gelu_new\" or another GELU, "    \
    "or remove the key"
#define MLP_WHY "meshscope's MLP is 4 * n_embd wide; set 4 * n_embd or null, or remove the key"
static const checked_key CHECKED_KEYS[] = {
    {"activation_function", is_gelu, GELU_WHY},
    {"hidden_act", is_gelu, GELU_WHY},
    {"tie_word_embeddings", is_true,
     "meshscope always ties the output layer to the token embedding; set true or remove the key"},
    {"n_inner", is_mlp_width, MLP_WHY},
    {"intermediate_size", is_mlp_width, MLP_WHY},
    {"scale_attn_weights", is_true,
     "meshscope divides attention scores by sqrt(head size); set true or remove the key"},
    {"scale_attn_by_inverse_layer_idx", is_false,
     "meshscope does not scale attention by the layer index; set false or remove the key"},
    {"add_cross_attention", is_false,
     "meshscope's blocks have no cross-attention; set false or remove the key"},
    {"is_encoder_decoder", is_false,
     "meshscope builds encoder-only or decoder-only models; set false or remove the key"},
    {"is_decoder", not_decoder,
     "meshscope's BERT attends in both directions; set false or remove the key"},
    {"position_embedding_type", is_absolute,
     "meshscope learns absolute position embeddings; set \"absolute\" or remove the key"},
    {"initializer_range", is_init_std,
     "meshscope initialises weights with standard deviation 0.02; set 0.02 or remove the key"},
};

#define N_IGNORED (sizeof IGNORED_KEYS / sizeof IGNORED_KEYS[0])
#define N_CHECKED (sizeof CHECKED_KEYS / sizeof CHECKED_KEYS[0])
#define N_READ    (sizeof READ_FIELDS / sizeof READ_FIELDS[0])

/* Every key meshscope knows, for the closest-key suggestion; returns the count. */
static size_t known_keys(const char **out) {
    size_t n = 0;
    out[n++] = "model_type";
    for (size_t i = 0; i < N_READ; i++)
        for (int k = 0; k < 3 && READ_FIELDS[i]->keys[k]; k++) out[n++] = READ_FIELDS[i]->keys[k];
    for (size_t i = 0; i < N_CHECKED; i++) out[n++] = CHECKED_KEYS[i].key;
    for (size_t i = 0; i < N_IGNORED; i++) out[n++] = IGNORED_KEYS[i];
    return n;
}

static ms_status refuse_keys_but(const cJSON *root, const char *name, const char *const *known,
                                 size_t n, ms_error *err) {
    for (const cJSON *k = root->child; k; k = k->next) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++) found = !strcmp(k->string, known[i]);
        if (found) continue;
        char safe[MS_SAFE_LEN];
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: unknown key \"%s\" (the closest known key is \"%s\"); meshscope "
                       "refuses keys it does not know, since ignoring one could build another "
                       "model than the file describes (docs/configs.md lists the keys)",
                       name, ms_safe_str(safe, sizeof safe, k->string),
                       ms_closest_word(k->string, known, n));
    }
    return MS_OK;
}

static ms_status refuse_unknown_keys(const cJSON *root, const char *name, ms_error *err) {
    const char *known[1 + 3 * N_READ + N_CHECKED + N_IGNORED];
    size_t n = known_keys(known);
    return refuse_keys_but(root, name, known, n, err);
}

static ms_status check_values(const cJSON *root, const ms_model_config *c, const char *name,
                              const checked_key *keys, size_t n, ms_error *err) {
    for (size_t i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i].key);
        if (!v || cJSON_IsNull(v) || (keys[i].ok && keys[i].ok(v, c))) continue;
        char got[64];
        ms_json_describe(v, got, sizeof got);
        return ms_fail(err, MS_ERR_INVALID, "%s: $.%s is %s, but %s", name, keys[i].key, got,
                       keys[i].why);
    }
    return MS_OK;
}

static ms_status check_fixed_values(const cJSON *root, const ms_model_config *c, const char *name,
                                    ms_error *err) {
    return check_values(root, c, name, CHECKED_KEYS, N_CHECKED, err);
}

/* --- LLaMA: Hugging Face LlamaConfig keys ---------------------------------------------------- */

static const field L_LAYER = {{"num_hidden_layers", NULL, NULL}};
static const field L_HEAD = {{"num_attention_heads", NULL, NULL}};
static const field L_KV = {{"num_key_value_heads", NULL, NULL}};
static const field L_EMBD = {{"hidden_size", NULL, NULL}};
static const field L_INTER = {{"intermediate_size", NULL, NULL}};
static const field L_POS = {{"max_position_embeddings", NULL, NULL}};
static const field L_EPS = {{"rms_norm_eps", NULL, NULL}};
static const field L_THETA = {{"rope_theta", NULL, NULL}};

static bool is_silu(const cJSON *v, const ms_model_config *c) {
    (void)c;
    return cJSON_IsString(v) && !strcmp(v->valuestring, "silu");
}
static bool is_zero(const cJSON *v, const ms_model_config *c) {
    (void)c;
    return cJSON_IsNumber(v) && v->valuedouble == 0;
}
static bool is_one(const cJSON *v, const ms_model_config *c) {
    (void)c;
    return cJSON_IsNumber(v) && v->valuedouble == 1;
}
static bool is_head_dim(const cJSON *v, const ms_model_config *c) {
    return cJSON_IsNumber(v) && c->n_head > 0 && v->valuedouble == c->n_embd / c->n_head;
}

static const checked_key LLAMA_CHECKED[] = {
    {"hidden_act", is_silu, "LLaMA's MLP is SwiGLU (SiLU gate); set \"silu\" or remove the key"},
    {"attention_bias", is_false,
     "meshscope's LLaMA projections have no bias; set false or remove the key"},
    {"mlp_bias", is_false, "meshscope's LLaMA MLP has no bias; set false or remove the key"},
    {"attention_dropout", is_zero,
     "meshscope's LLaMA has no attention dropout; set 0.0 or remove the key"},
    {"pretraining_tp", is_one, "it only changes numerics of the reference code; set 1"},
    {"head_dim", is_head_dim,
     "meshscope's heads are hidden_size / num_attention_heads wide; set that or remove the key"},
    {"rope_scaling", NULL, "meshscope's rotary embedding is unscaled; set null or remove the key"},
    {"initializer_range", is_init_std,
     "meshscope initialises weights with standard deviation 0.02; set 0.02 or remove the key"},
};
#define N_LLAMA_CHECKED (sizeof LLAMA_CHECKED / sizeof LLAMA_CHECKED[0])

static ms_status llama_keys(const cJSON *root, const char *name, ms_error *err) {
    static const field *const read[] = {&L_LAYER, &L_HEAD, &L_KV,    &L_EMBD, &L_INTER,
                                        &L_POS,   &L_EPS,  &L_THETA, &F_VOCAB};
    const char *known[3 + 9 + N_LLAMA_CHECKED + N_IGNORED];
    size_t n = 0;
    known[n++] = "model_type";
    known[n++] = "tie_word_embeddings";
    known[n++] = "attention_op";
    for (size_t i = 0; i < 9; i++) known[n++] = read[i]->keys[0];
    for (size_t i = 0; i < N_LLAMA_CHECKED; i++) known[n++] = LLAMA_CHECKED[i].key;
    for (size_t i = 0; i < N_IGNORED; i++) known[n++] = IGNORED_KEYS[i];
    return refuse_keys_but(root, name, known, n, err);
}

/* "attention_op": the name of an operator registered before the model is built. */
static ms_status get_attention_op(const cJSON *root, const char *name, ms_model_config *c,
                                  ms_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "attention_op");
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsString(v) || !v->valuestring[0] ||
        strlen(v->valuestring) >= sizeof c->attention_op) {
        char got[64];
        ms_json_describe(v, got, sizeof got);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.attention_op: expected the name of a registered operator (1 to "
                       "%zu characters), got %s",
                       name, sizeof c->attention_op - 1, got);
    }
    snprintf(c->attention_op, sizeof c->attention_op, "%s", v->valuestring);
    return MS_OK;
}

static ms_status llama_from_tree(const cJSON *root, const char *name, ms_model_config *c,
                                 ms_error *err) {
    MS_CHECK(llama_keys(root, name, err));
    MS_CHECK(get_int(root, &L_LAYER, MAX_LAYERS, name, &c->n_layer, err));
    MS_CHECK(get_int(root, &L_HEAD, MAX_HEADS, name, &c->n_head, err));
    MS_CHECK(get_int(root, &L_EMBD, MAX_EMBD, name, &c->n_embd, err));
    MS_CHECK(get_int(root, &L_INTER, MAX_EMBD * 8, name, &c->intermediate_size, err));
    MS_CHECK(get_int(root, &F_VOCAB, MAX_VOCAB, name, &c->vocab_size, err));
    MS_CHECK(get_int(root, &L_POS, MAX_POSITIONS, name, &c->n_positions, err));
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads");
    c->n_kv_head = c->n_head;
    if (kv && !cJSON_IsNull(kv))
        MS_CHECK(get_int(root, &L_KV, MAX_HEADS, name, &c->n_kv_head, err));
    MS_CHECK(get_real(root, &L_EPS, 1e-6, 0, true, 1, "a number in (0, 1), e.g. 1e-6", name,
                      &c->layer_norm_epsilon, err));
    MS_CHECK(get_real(root, &L_THETA, 10000, 1, true, 1e12, "a number above 1, e.g. 10000", name,
                      &c->rope_theta, err));
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (tie && !cJSON_IsNull(tie) && !cJSON_IsBool(tie)) {
        char got[64];
        ms_json_describe(tie, got, sizeof got);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $.tie_word_embeddings: expected true or false, got %s", name, got);
    }
    c->tie_word_embeddings = cJSON_IsTrue(tie);
    MS_CHECK(get_attention_op(root, name, c, err));
    MS_CHECK(check_values(root, c, name, LLAMA_CHECKED, N_LLAMA_CHECKED, err));
    return ms_config_validate(c, name, err);
}

static ms_status from_tree(const cJSON *root, const char *name, ms_model_config *c, ms_error *err) {
    if (!cJSON_IsObject(root)) {
        char got[64];
        ms_json_describe(root, got, sizeof got);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: $: expected a JSON object at the top level, got %s", name, got);
    }
    memset(c, 0, sizeof *c);
    c->model_type = MS_MODEL_GPT2;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(mt) && strcmp(mt->valuestring, "llama") == 0) {
        c->model_type = MS_MODEL_LLAMA;
        return llama_from_tree(root, name, c, err);
    }
    MS_CHECK(refuse_unknown_keys(root, name, err));
    if (mt && !cJSON_IsNull(mt)) {
        if (cJSON_IsString(mt) && strcmp(mt->valuestring, "gpt2") == 0) {
            c->model_type = MS_MODEL_GPT2;
        } else if (cJSON_IsString(mt) && strcmp(mt->valuestring, "bert") == 0) {
            c->model_type = MS_MODEL_BERT;
        } else {
            char got[64];
            ms_json_describe(mt, got, sizeof got);
            return ms_fail(err, MS_ERR_INVALID,
                           "%s: $.model_type: expected \"gpt2\", \"bert\" or \"llama\", got %s",
                           name, got);
        }
    }
    MS_CHECK(get_int(root, &F_LAYER, MAX_LAYERS, name, &c->n_layer, err));
    MS_CHECK(get_int(root, &F_HEAD, MAX_HEADS, name, &c->n_head, err));
    MS_CHECK(get_int(root, &F_EMBD, MAX_EMBD, name, &c->n_embd, err));
    MS_CHECK(get_int(root, &F_VOCAB, MAX_VOCAB, name, &c->vocab_size, err));
    MS_CHECK(get_int(root, &F_POS, MAX_POSITIONS, name, &c->n_positions, err));
    MS_CHECK(get_real(root, &F_EPS, 1e-5, 0, true, 1, "a number in (0, 1), e.g. 1e-5", name,
                      &c->layer_norm_epsilon, err));
    const char *prob = "a probability in [0, 1)";
    MS_CHECK(get_real(root, &F_RESID, 0, 0, false, 1, prob, name, &c->resid_pdrop, err));
    MS_CHECK(get_real(root, &F_ATTN, 0, 0, false, 1, prob, name, &c->attn_pdrop, err));
    MS_CHECK(get_real(root, &F_EMBDP, 0, 0, false, 1, prob, name, &c->embd_pdrop, err));
    MS_CHECK(check_fixed_values(root, c, name, err));
    return ms_config_validate(c, name, err);
}

ms_status ms_config_from_string(const char *json, size_t len, const char *name,
                                ms_model_config *out, ms_error *err) {
    if (!name) name = "config.json";
    if (len == 0)
        return ms_fail(err, MS_ERR_INVALID, "%s: the file is empty; expected a JSON object", name);
    /* cJSON takes NUL bytes for whitespace; in a config they mean a binary or corrupt file. */
    const char *nul = memchr(json, '\0', len);
    if (nul)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: contains a NUL byte at offset %zu; a config.json is UTF-8 text", name,
                       (size_t)(nul - json));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return parse_error(json, len, end ? (size_t)(end - json) : 0, name, "malformed JSON", err);
    /* cJSON stops after the first value; anything but whitespace after it is an error. */
    size_t off = (size_t)(end - json);
    while (off < len &&
           (json[off] == ' ' || json[off] == '\t' || json[off] == '\n' || json[off] == '\r'))
        off++;
    ms_status st;
    char dup[128];
    if (off < len) {
        st = parse_error(json, len, off, name, "malformed JSON: unexpected text after the value",
                         err);
    } else if (ms_json_find_duplicate_key(root, dup, sizeof dup)) {
        st = ms_fail(err, MS_ERR_INVALID,
                     "%s: %s appears twice; a repeated key is ambiguous (JSON readers disagree on "
                     "which value wins), so keep one",
                     name, dup);
    } else {
        ms_model_config c;
        st = from_tree(root, name, &c, err);
        if (st == MS_OK) *out = c;
    }
    cJSON_Delete(root);
    return st;
}

ms_status ms_config_load(const char *path, ms_model_config *out, ms_error *err) {
    uint8_t *buf;
    size_t len;
    MS_CHECK(ms_read_file(path, MS_CONFIG_MAX_BYTES, &buf, &len, err));
    ms_status st = ms_config_from_string((const char *)buf, len, path, out, err);
    free(buf);
    return st;
}

int64_t ms_gpt2_param_count(const ms_model_config *c) {
    const int64_t C = c->n_embd, L = c->n_layer, V = c->vocab_size, P = c->n_positions;
    const int64_t block = 2 * C               /* ln_1 weight, bias */
                          + C * 3 * C + 3 * C /* attn.c_attn */
                          + C * C + C         /* attn.c_proj */
                          + 2 * C             /* ln_2 */
                          + C * 4 * C + 4 * C /* mlp.c_fc */
                          + 4 * C * C + C;    /* mlp.c_proj */
    return V * C + P * C + L * block + 2 * C; /* wte (tied lm_head), wpe, blocks, ln_f */
}
