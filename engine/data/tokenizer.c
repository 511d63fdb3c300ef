/* tokenizer.c - byte-level encode/decode. */
#include "engine/data/tokenizer.h"

void ms_byte_encode(const uint8_t *bytes, size_t n, int32_t *ids) {
    for (size_t i = 0; i < n; i++) ids[i] = bytes[i];
}

ms_status ms_byte_decode(const int32_t *ids, size_t n, uint8_t *out, ms_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= MS_BYTE_VOCAB)
            return ms_fail(err, MS_ERR_INVALID,
                           "token %zu is %d, outside the byte vocabulary 0..255; was it produced "
                           "by a model with a larger vocab_size?",
                           i, (int)ids[i]);
        out[i] = (uint8_t)ids[i];
    }
    return MS_OK;
}
