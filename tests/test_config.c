/* test_config.c - config.json parsing: real GPT-2/BERT files, HF aliases, defaults, every error
 * message (file name, JSON path, the fix), the GPT-2 parameter count; which keys are read,
 * checked, ignored or refused, and the JSON text helpers behind those messages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/io/json_text.h"
#include "engine/model/config.h"
#include "tests/testkit.h"

/* The config.json of Hugging Face's "gpt2" (GPT-2 small), abridged only of task params. */
static const char gpt2_small[] = "{\n"
                                 "  \"activation_function\": \"gelu_new\",\n"
                                 "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
                                 "  \"attn_pdrop\": 0.1,\n"
                                 "  \"bos_token_id\": 50256,\n"
                                 "  \"embd_pdrop\": 0.1,\n"
                                 "  \"eos_token_id\": 50256,\n"
                                 "  \"initializer_range\": 0.02,\n"
                                 "  \"layer_norm_epsilon\": 1e-05,\n"
                                 "  \"model_type\": \"gpt2\",\n"
                                 "  \"n_ctx\": 1024,\n"
                                 "  \"n_embd\": 768,\n"
                                 "  \"n_head\": 12,\n"
                                 "  \"n_layer\": 12,\n"
                                 "  \"n_positions\": 1024,\n"
                                 "  \"resid_pdrop\": 0.1,\n"
                                 "  \"summary_activation\": null,\n"
                                 "  \"task_specific_params\": {\"text-generation\": "
                                 "{\"do_sample\": true, \"max_length\": 50}},\n"
                                 "  \"vocab_size\": 50257\n"
                                 "}\n";

static const char bert_base[] = "{\"architectures\": [\"BertForMaskedLM\"],\n"
                                "\"attention_probs_dropout_prob\": 0.1,\n"
                                "\"hidden_act\": \"gelu\", \"hidden_dropout_prob\": 0.1,\n"
                                "\"hidden_size\": 768, \"intermediate_size\": 3072,\n"
                                "\"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 512,\n"
                                "\"model_type\": \"bert\", \"num_attention_heads\": 12,\n"
                                "\"num_hidden_layers\": 12, \"pad_token_id\": 0,\n"
                                "\"type_vocab_size\": 2, \"vocab_size\": 30522}";

static ms_status parse(const char *json, ms_model_config *c, ms_error *err) {
    return ms_config_from_string(json, strlen(json), NULL, c, err);
}

/* Parses json, expects MS_ERR_INVALID and a message containing want. */
static void expect_error(const char *json, const char *want) {
    ms_model_config c;
    ms_error err = {0};
    ms_status st = parse(json, &c, &err);
    if (st != MS_ERR_INVALID) fail_msg("expected an error for %s, got status %d", json, st);
    if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
    /* Every message names the file first. */
    assert_int_equal(strncmp(err.msg, "config.json: ", 13), 0);
}

static void gpt2_small_config(void **state) {
    (void)state;
    ms_model_config c;
    ms_error err = {0};
    if (parse(gpt2_small, &c, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(c.model_type, MS_MODEL_GPT2);
    assert_int_equal(c.n_layer, 12);
    assert_int_equal(c.n_head, 12);
    assert_int_equal(c.n_embd, 768);
    assert_int_equal(c.vocab_size, 50257);
    assert_int_equal(c.n_positions, 1024);
    assert_float_equal(c.layer_norm_epsilon, 1e-5, 1e-12);
    assert_float_equal(c.resid_pdrop, 0.1, 1e-12);
    assert_float_equal(c.attn_pdrop, 0.1, 1e-12);
    assert_float_equal(c.embd_pdrop, 0.1, 1e-12);
    /* The published size of GPT-2 small (tied LM head). */
    assert_int_equal(ms_gpt2_param_count(&c), 124439808);
    assert_string_equal(ms_model_type_name(c.model_type), "gpt2");
    /* GPT-2 medium: 24 layers, 1024 wide, 16 heads -> 354,823,168. */
    c.n_layer = 24;
    c.n_embd = 1024;
    c.n_head = 16;
    assert_int_equal(ms_gpt2_param_count(&c), 354823168);
    assert_int_equal(ms_config_validate(&c, "medium", &err), MS_OK);
}

static void bert_aliases_and_defaults(void **state) {
    (void)state;
    ms_model_config c;
    ms_error err = {0};
    if (parse(bert_base, &c, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(c.model_type, MS_MODEL_BERT);
    assert_int_equal(c.n_layer, 12);
    assert_int_equal(c.n_head, 12);
    assert_int_equal(c.n_embd, 768);
    assert_int_equal(c.vocab_size, 30522);
    assert_int_equal(c.n_positions, 512);
    assert_float_equal(c.layer_norm_epsilon, 1e-12, 1e-20);
    assert_float_equal(c.resid_pdrop, 0.1, 1e-12);
    assert_float_equal(c.attn_pdrop, 0.1, 1e-12);
    assert_string_equal(ms_model_type_name(c.model_type), "bert");

    /* Only the required keys: everything else takes its default. */
    const char *min = "{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64, \"vocab_size\": 256, "
                      "\"n_positions\": 128}";
    if (parse(min, &c, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(c.model_type, MS_MODEL_GPT2);
    assert_float_equal(c.layer_norm_epsilon, 1e-5, 1e-12);
    assert_true(c.resid_pdrop == 0 && c.attn_pdrop == 0 && c.embd_pdrop == 0);
    /* Null optional values are defaults too (HF writes nulls). */
    const char *nulls = "{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64, \"vocab_size\": 256, "
                        "\"n_positions\": 128, \"model_type\": null, \"attn_pdrop\": null}";
    if (parse(nulls, &c, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_true(c.attn_pdrop == 0);
    /* Two aliases with the same value are fine. */
    const char *both = "{\"n_layer\": 2, \"num_hidden_layers\": 2, \"n_head\": 4, \"n_embd\": 64, "
                       "\"vocab_size\": 256, \"n_ctx\": 128}";
    if (parse(both, &c, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(c.n_positions, 128);
    /* Not NUL-terminated: only len bytes are read. */
    char buf[256];
    size_t n = strlen(min);
    memcpy(buf, min, n);
    memset(buf + n, 'x', 16);
    assert_int_equal(ms_config_from_string(buf, n, NULL, &c, &err), MS_OK);
}

static void value_errors(void **state) {
    (void)state;
    expect_error("{\"n_layer\": 12, \"n_head\": \"four\", \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "config.json: $.n_head: expected a positive integer, got \"four\"");
    expect_error("{\"n_layer\": 0, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "$.n_layer: expected a positive integer, got 0");
    expect_error("{\"n_layer\": 2.5, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "$.n_layer: expected a positive integer, got 2.5");
    expect_error("{\"num_hidden_layers\": -3, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "$.num_hidden_layers: expected a positive integer, got -3");
    expect_error("{\"n_layer\": [1], \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "$.n_layer: expected a positive integer, got an array");
    expect_error("{\"n_layer\": 1e9, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "$.n_layer: 1000000000 is larger than the supported maximum 512");
    expect_error("{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1, \"layer_norm_epsilon\": -1}",
                 "$.layer_norm_epsilon: expected a number in (0, 1), e.g. 1e-5, got -1");
    expect_error("{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1, \"resid_pdrop\": 1.5}",
                 "$.resid_pdrop: expected a probability in [0, 1), got 1.5");
    expect_error("{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1, \"attn_pdrop\": \"0.1\"}",
                 "$.attn_pdrop: expected a probability in [0, 1), got \"0.1\"");
    expect_error("{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1, \"model_type\": \"t5\"}",
                 "$.model_type: expected \"gpt2\", \"bert\" or \"llama\", got \"t5\"");
    expect_error("{\"n_layer\": 2, \"num_hidden_layers\": 3, \"n_head\": 4, \"n_embd\": 768, "
                 "\"vocab_size\": 1, \"n_positions\": 1}",
                 "$.n_layer is 2 but its alias $.num_hidden_layers is 3; remove one");
}

static void structure_errors(void **state) {
    (void)state;
    /* Missing required keys name the key and its aliases. */
    expect_error("{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 768, \"n_positions\": 1}",
                 "missing required key \"vocab_size\"");
    expect_error("{\"n_layer\": 2, \"n_embd\": 768, \"vocab_size\": 1, \"n_positions\": 1}",
                 "missing required key \"n_head\" (also accepted: \"num_attention_heads\")");
    expect_error("{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1}",
                 "missing required key \"n_positions\" (also accepted: "
                 "\"max_position_embeddings\", \"n_ctx\")");
    /* n_embd must split evenly across heads; the message says why and how to fix it. */
    expect_error("{\"n_layer\": 2, \"n_head\": 12, \"n_embd\": 770, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "n_embd 770 is not divisible by n_head 12");
    expect_error("{\"n_layer\": 2, \"n_head\": 12, \"n_embd\": 770, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "set n_embd to a multiple of n_head (e.g. 768 or 780)");
    /* Syntax errors give the byte offset, line and column. */
    expect_error("{\"n_layer\": 2,\n  \"n_head\" 4}",
                 "malformed JSON at byte 26 (line 2, column 12)");
    expect_error("{\"n_layer\": 2,", "malformed JSON");
    expect_error("{\"a\": 1} trailing", "unexpected text after the value at byte 9");
    expect_error("[1, 2]", "$: expected a JSON object at the top level, got an array");
    expect_error("  ", "malformed JSON");
    ms_model_config c;
    ms_error err = {0};
    assert_int_equal(ms_config_from_string("", 0, "x.json", &c, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "x.json: the file is empty"));
    /* Deep nesting is refused by the parser, not a stack overflow. */
    char *deep = malloc(20001);
    memset(deep, '[', 20000);
    deep[20000] = '\0';
    assert_int_equal(parse(deep, &c, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "malformed JSON: nested more than 1000 levels deep"));
    free(deep);
    /* A NUL byte (cJSON would take it for whitespace) marks a binary file. */
    const char nul[] = "{\"n_layer\": 2,\0 \"n_head\": 4}";
    assert_int_equal(ms_config_from_string(nul, sizeof nul - 1, NULL, &c, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "contains a NUL byte at offset 14"));
    /* 1e400 overflows to infinity in the parser: still "not a positive integer". */
    expect_error("{\"n_layer\": 1e400, \"n_head\": 4, \"n_embd\": 768, \"vocab_size\": 1, "
                 "\"n_positions\": 1}",
                 "$.n_layer: expected a positive integer, got inf");
}

static void validate_built(void **state) {
    (void)state;
    ms_error err = {0};
    ms_model_config c = {.model_type = MS_MODEL_GPT2,
                         .n_layer = 2,
                         .n_head = 3,
                         .n_embd = 64,
                         .vocab_size = 256,
                         .n_positions = 64,
                         .layer_norm_epsilon = 1e-5};
    assert_int_equal(ms_config_validate(&c, "cli", &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "cli: n_embd 64 is not divisible by n_head 3"));
    c.n_head = 4;
    assert_int_equal(ms_config_validate(&c, "cli", &err), MS_OK);
    c.attn_pdrop = 1.0;
    assert_int_equal(ms_config_validate(&c, "cli", &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "attn_pdrop is 1; a dropout probability must be in [0, 1)"));
    c.attn_pdrop = 0;
    c.n_layer = 0;
    assert_int_equal(ms_config_validate(&c, "cli", &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "n_layer is 0"));
}

static void load_files(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], big[256], missing[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(big, sizeof big, "%s/big.json", dir);
    snprintf(missing, sizeof missing, "%s/nope.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(gpt2_small, f);
    fclose(f);
    ms_model_config c;
    ms_error err = {0};
    if (ms_config_load(path, &c, &err) != MS_OK) fail_msg("%s", err.msg);
    assert_int_equal(ms_gpt2_param_count(&c), 124439808);

    assert_int_equal(ms_config_load(missing, &c, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, missing));
    assert_non_null(strstr(err.msg, "No such file"));

    /* Over the 1 MiB cap: refused before parsing. */
    f = fopen(big, "w");
    assert_non_null(f);
    fputc('{', f);
    for (int i = 0; i < (1 << 20); i++) fputc(' ', f);
    fputc('}', f);
    fclose(f);
    assert_int_equal(ms_config_load(big, &c, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, big));
    assert_non_null(strstr(err.msg, "limit"));

    /* Errors from a file are prefixed with its path. */
    f = fopen(path, "w");
    fputs("{\"n_layer\": 12, \"n_head\": \"four\", \"n_embd\": 768, \"vocab_size\": 1, "
          "\"n_positions\": 1}",
          f);
    fclose(f);
    assert_int_equal(ms_config_load(path, &c, &err), MS_ERR_INVALID);
    char want[320];
    snprintf(want, sizeof want, "%s: $.n_head: expected a positive integer, got \"four\"", path);
    assert_string_equal(err.msg, want);
    /* A folder is not a config. */
    assert_int_equal(ms_config_load(dir, &c, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "not a regular file"));
    unlink(path);
    unlink(big);
    rmdir(dir);
}

/* The smallest valid config plus `extra` members ("" or ", \"key\": value, ..."). */
static ms_status parse_with(const char *extra, ms_model_config *c, ms_error *err) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 64, \"vocab_size\": 256, "
             "\"n_positions\": 128%s}",
             extra);
    return parse(json, c, err);
}

static void expect_refused(const char *extra, const char *want) {
    ms_model_config c;
    ms_error err = {0};
    if (parse_with(extra, &c, &err) != MS_ERR_INVALID)
        fail_msg("%s: expected a refusal, got %s", extra, err.msg);
    if (!strstr(err.msg, want)) fail_msg("%s: message '%s' lacks '%s'", extra, err.msg, want);
}

static void expect_accepted(const char *extra) {
    ms_model_config c;
    ms_error err = {0};
    if (parse_with(extra, &c, &err) != MS_OK) fail_msg("%s: %s", extra, err.msg);
    assert_int_equal(c.n_layer, 2);
}

/* Keys that would change the model are refused unless they say what meshscope builds; a typo
 * names the key it probably meant; keys Hugging Face writes that change nothing are ignored. */
static void hardening_config_keys(void **state) {
    (void)state;
    expect_refused(", \"n_layers\": 12", "unknown key \"n_layers\"");
    expect_refused(", \"n_layers\": 12", "the closest known key is \"n_layer\"");
    expect_refused(", \"num_hiden_layers\": 12", "closest known key is \"num_hidden_layers\"");
    expect_refused(", \"rope_theta\": 10000", "unknown key \"rope_theta\"");
    expect_refused(", \"activation_function\": \"relu\"",
                   "$.activation_function is \"relu\", but meshscope's MLP uses GELU");
    expect_refused(", \"hidden_act\": \"silu\"", "$.hidden_act is \"silu\"");
    expect_refused(", \"tie_word_embeddings\": false",
                   "$.tie_word_embeddings is false, but meshscope always ties the output layer");
    expect_refused(", \"n_inner\": 1000", "$.n_inner is 1000, but meshscope's MLP is 4 * n_embd");
    expect_refused(", \"scale_attn_by_inverse_layer_idx\": true", "by the layer index");
    expect_refused(", \"add_cross_attention\": true", "no cross-attention");
    expect_refused(", \"position_embedding_type\": \"relative_key\"", "absolute position");
    expect_refused(", \"initializer_range\": 0.01", "standard deviation 0.02");
    expect_refused(", \"model_type\": \"bert\", \"is_decoder\": true", "both directions");
    /* What meshscope builds, said explicitly, or left to the default (null). */
    expect_accepted(", \"activation_function\": \"gelu_new\", \"tie_word_embeddings\": true, "
                    "\"n_inner\": 256, \"scale_attn_weights\": true, "
                    "\"scale_attn_by_inverse_layer_idx\": false, \"initializer_range\": 0.02");
    expect_accepted(", \"activation_function\": \"gelu_pytorch_tanh\", \"n_inner\": null");
    expect_accepted(", \"model_type\": \"bert\", \"hidden_act\": \"gelu\", \"is_decoder\": false, "
                    "\"intermediate_size\": 256, \"position_embedding_type\": \"absolute\"");
    expect_accepted(", \"is_decoder\": true"); /* GPT-2 is causal either way */
    /* Ignored: provenance, tokenizer ids, heads meshscope does not build. */
    expect_accepted(", \"architectures\": [\"GPT2LMHeadModel\"], \"transformers_version\": "
                    "\"4.40.0\", \"use_cache\": true, \"bos_token_id\": 50256, \"pad_token_id\": "
                    "null, \"summary_type\": \"cls_index\", \"id2label\": {\"0\": \"A\"}, "
                    "\"type_vocab_size\": 2, \"reorder_and_upcast_attn\": false");
    /* A key from a file is shown escaped: no terminal control reaches the message. */
    ms_model_config c;
    ms_error err = {0};
    assert_int_equal(parse_with(", \"\\u001b[31mred\\u001b[0m\": 1", &c, &err), MS_ERR_INVALID);
    mt_expect_escaped(err.msg, "unknown key \"\\x1B[31mred\\x1B[0m\"");
    assert_int_equal(parse_with(", \"activation_function\": \"\\u001b]0;x\\u0007\"", &c, &err),
                     MS_ERR_INVALID);
    mt_expect_escaped(err.msg, "is \"\\x1B]0;x\\x07\"");
}

/* A repeated key is refused wherever it is, with its path; cJSON would keep only the first. */
static void hardening_config_duplicates(void **state) {
    (void)state;
    expect_refused(", \"n_layer\": 12", "config.json: $.n_layer appears twice");
    expect_refused(", \"task_specific_params\": {\"gen\": {\"max_length\": 1, \"max_length\": 2}}",
                   "$.task_specific_params.gen.max_length appears twice");
    expect_refused(", \"id2label\": {\"0\": \"A\", \"0\": \"B\"}",
                   "$.id2label[\"0\"] appears twice");
    expect_accepted(", \"id2label\": {\"0\": \"A\", \"1\": \"A\"}");
}

/* The JSON helpers on their own: duplicate paths through arrays, the closest word. */
static void hardening_json_helpers(void **state) {
    (void)state;
    char path[128];
    cJSON *j = cJSON_Parse("{\"a\": [1, {\"b\": 1}, {\"c\": {\"d\": 1, \"e\": 2, \"d\": 3}}]}");
    assert_true(ms_json_find_duplicate_key(j, path, sizeof path));
    assert_string_equal(path, "$.a[2].c.d");
    cJSON_Delete(j);
    j = cJSON_Parse("{\"a\": {\"x\": 1}, \"b\": {\"x\": 1}, \"c\": [{\"x\": 1}, {\"x\": 2}]}");
    assert_false(ms_json_find_duplicate_key(j, path, sizeof path));
    cJSON_Delete(j);
    j = cJSON_Parse("{\"\\u001b k\": 1, \"\\u001b k\": 2}");
    assert_true(ms_json_find_duplicate_key(j, path, sizeof path));
    assert_string_equal(path, "$[\"\\x1B k\"]");
    cJSON_Delete(j);
    /* A path longer than the buffer is cut; the duplicate is still found. */
    j = cJSON_Parse(
        "{\"aaaaaaaaaaaaaaaaaaaa\": {\"bbbbbbbbbbbbbbbbbbbbbbb\": {\"z\": 1, \"z\": 1}}}");
    char tiny[16];
    assert_true(ms_json_find_duplicate_key(j, tiny, sizeof tiny));
    assert_int_equal(strlen(tiny), sizeof tiny - 1);
    cJSON_Delete(j);

    const char *const words[] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
    assert_string_equal(ms_closest_word("n_layers", words, 5), "n_layer");
    assert_string_equal(ms_closest_word("n_haed", words, 5), "n_head"); /* a swap counts 1 */
    assert_string_equal(ms_closest_word("vocabsize", words, 5), "vocab_size");
    assert_string_equal(ms_closest_word("n_position", words, 5), "n_positions");
    assert_null(ms_closest_word("x", words, 0));
}

/* eval's result line: a JSON number, or for a loss that is not finite null and an error (with a
 * failing status), never printf's "nan". */
static void hardening_json_loss_line(void **state) {
    (void)state;
    char line[256];
    ms_error err = {0};
    assert_int_equal(ms_json_loss_line(2.5, line, sizeof line, &err), MS_OK);
    assert_string_equal(line, "{\"loss\": 2.500000}");
    const double bad[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ms_json_loss_line(bad[i], line, sizeof line, &err), MS_ERR_INVALID);
        assert_int_equal(strncmp(line, "{\"loss\": null, \"error\": \"the loss is ", 36), 0);
        assert_null(strstr(line, "nan,"));
        cJSON *v = cJSON_Parse(line); /* valid JSON, and the error is the status's message */
        assert_non_null(v);
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(v, "loss")));
        assert_string_equal(cJSON_GetObjectItem(v, "error")->valuestring, err.msg);
        cJSON_Delete(v);
    }
    assert_non_null(strstr(err.msg, "NaN or infinite weights"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(hardening_config_keys),  cmocka_unit_test(hardening_config_duplicates),
    cmocka_unit_test(hardening_json_helpers), cmocka_unit_test(hardening_json_loss_line),
    cmocka_unit_test(gpt2_small_config),      cmocka_unit_test(bert_aliases_and_defaults),
    cmocka_unit_test(value_errors),           cmocka_unit_test(structure_errors),
    cmocka_unit_test(validate_built),         cmocka_unit_test(load_files),
};
MT_MAIN("config", tests)
