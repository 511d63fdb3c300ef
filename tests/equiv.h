/* equiv.h - a distributed training run checked against one rank.
 *
 * mt_equiv_check trains a few steps under a strategy (optionally switching live to `then1`
 * before step 1 and `then2` before step 2) and checks every step's loss, the validation loss
 * and every final parameter against a run of the same trainer on one rank with the whole batch
 * at once: losses within 1e-5 relative, all parameters within 1e-5 relative as one vector. The
 * parameters are gathered on world rank 0 as each chunk holds them, so the tied word embedding
 * is checked in both of its copies (first and last stage) under pp. With pp > 1 it also checks
 * that the arenas held equal the schedule's in-flight bound.
 *
 * The model is a 4-layer GPT-2 or BERT (n_embd 32, 4 heads, vocabulary 256), batch 8 x 8
 * tokens, 3 steps of AdamW with clipping (mt_equiv_config, mt_equiv_opts, mt_equiv_data).
 */
#ifndef MS_TESTS_EQUIV_H
#define MS_TESTS_EQUIV_H

#include <stdbool.h>

#include "engine/data/dataset.h"
#include "engine/model/config.h"
#include "engine/train/trainer.h"
#include "tests/testkit.h"

ms_model_config mt_equiv_config(bool bert);
ms_train_opts mt_equiv_opts(void);
/* The training text (a repeated sentence); close it with ms_text_data_close. */
ms_status mt_equiv_data(ms_text_data *d, ms_error *err);

/* strategy, then1 and then2 are JSON (then1, then2 may be NULL); world ranks run it (mt_run:
 * threads, or the MPI world). Fails the current cmocka test on a difference. */
void mt_equiv_check(bool bert, const char *strategy, const char *then1, const char *then2,
                    int world);
/* What a run is checked against: the reference strategy (run on one rank) and tolerances. */
typedef struct mt_equiv_tol {
    const char *ref; /* JSON of the one-rank reference run */
    double loss;     /* every step's loss and the validation loss, relative */
    double params;   /* all parameters as one vector, relative */
    double worst;    /* the largest single parameter difference, absolute */
    bool differ;     /* the parameters must also differ from the reference's somewhere */
} mt_equiv_tol;
/* One rank in fp32, 1e-5 relative: what every strategy must reproduce. */
mt_equiv_tol mt_equiv_exact(void);
void mt_equiv_check_tol(const ms_model_config *cfg, const char *strategy, const char *then1,
                        const char *then2, int world, const mt_equiv_tol *tol);

/* The GPT under strategy on world ranks whose devices are of kind `device` (the fenced device:
 * memory the host cannot touch) against the same strategy and world on the CPU, bit for bit:
 * every step's loss, the validation loss and every final parameter, compared on world rank 0.
 * model: NULL for mt_equiv_config(false). */
void mt_equiv_check_device(const ms_model_config *model, const char *strategy, int world,
                           ms_device_kind device);

/* cfg (NULL: the GPT of mt_equiv_config) under strategy (with live switches to then1, then2
 * as in mt_equiv_check) against strategy ref, both on world ranks of `device`, bit for bit: two
 * strategies that must compute the same numbers (offload against none). serial:
 * ms_train_opts.offload_serial. */
void mt_equiv_check_pair(const ms_model_config *cfg, const char *ref, const char *strategy,
                         const char *then1, const char *then2, int world, ms_device_kind device,
                         bool serial);
/* The same without gradient clipping (ms_train_opts.clip 0) in both runs, no switches. */
void mt_equiv_check_pair_noclip(const ms_model_config *cfg, const char *ref, const char *strategy,
                                int world, ms_device_kind device);

/* A trainer of the GPT (mt_equiv_config) under strategy JSON with options o (NULL:
 * mt_equiv_opts) over data d; NULL after recording the failure on r. */
ms_trainer *mt_equiv_trainer(mt_rank *r, const char *strategy, const ms_train_opts *o,
                             const ms_text_data *d, ms_error *err);

/* The same for another model (the batch, steps and data stay). */
void mt_equiv_check_model(const ms_model_config *cfg, const char *strategy, const char *then1,
                          const char *then2, int world);
/* The run of `cfg` under strategy against a one-rank run of `ref_cfg`: a model that must train
 * exactly as another (a user operator in place of a built-in one). */
void mt_equiv_check_against(const ms_model_config *ref_cfg, const ms_model_config *cfg,
                            const char *strategy, int world);

#endif
