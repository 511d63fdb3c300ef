/* tokenizer.h - the byte-level tokenizer: every byte is its own token (vocab 256).
 *
 * No merges and no unknown tokens, so any file trains without preprocessing and decoding is
 * exact; the cost is longer sequences than a BPE would give.
 */
#ifndef MS_TOKENIZER_H
#define MS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"

#define MS_BYTE_VOCAB 256

/* ids[i] = bytes[i] (0..255). ids has room for n values (caller-owned). */
void ms_byte_encode(const uint8_t *bytes, size_t n, int32_t *ids);

/* out[i] = ids[i]; fails with MS_ERR_INVALID naming the position of the first id outside
 * 0..255 (out is then partially written). out has room for n bytes (caller-owned). */
ms_status ms_byte_decode(const int32_t *ids, size_t n, uint8_t *out, ms_error *err);

#endif
