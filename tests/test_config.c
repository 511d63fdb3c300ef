/* test_config.c - config.json parsing: real GPT-2/BERT files, HF aliases, defaults, every error
 * message (file name, JSON path, the fix), and the GPT-2 parameter count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
                 "$.n_layer: 1000000000 is larger than the supported maximum 4096");
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
                 "\"n_positions\": 1, \"model_type\": \"llama\"}",
                 "$.model_type: expected \"gpt2\" or \"bert\", got \"llama\"");
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

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(gpt2_small_config), cmocka_unit_test(bert_aliases_and_defaults),
    cmocka_unit_test(value_errors),      cmocka_unit_test(structure_errors),
    cmocka_unit_test(validate_built),    cmocka_unit_test(load_files),
};
MT_MAIN("config", tests)
