/* fastai's to_fp16 / to_fp32 as bfloat16 mixed precision (MixedPrecision's semantics): the
 * model's GEMMs and convolutions take bf16 operands with fp32 sums where the kernel table has bf16
 * kernels; the weights, gradients and optimizer state never leave fp32. */
#include "corefit/learn.h"

#include <stdatomic.h>
#include <stdio.h>

cf_status cf_learner_to_bf16(cf_learner *learn) {
    if (!learn || !learn->model)
        return cf_fail(CF_ERR_INVALID, "cf_learner_to_bf16: no learner or model");
    if (!cf_bf16_compute()) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            fprintf(stderr,
                    "corefit: to_bf16: no bfloat16 kernels at the %s level (best on this CPU: "
                    "%s); training stays in fp32\n",
                    cf_isa_name(cf_isa_active()), cf_isa_name(cf_isa_best()));
        return CF_OK;
    }
    cf_linear_set_bf16(learn->model->root, true);
    cf_conv_set_bf16(learn->model->root, true);
    cf_lstm_set_bf16(learn->model->root, true);
    return CF_OK;
}

cf_status cf_learner_to_fp32(cf_learner *learn) {
    if (!learn || !learn->model)
        return cf_fail(CF_ERR_INVALID, "cf_learner_to_fp32: no learner or model");
    cf_linear_set_bf16(learn->model->root, false);
    cf_conv_set_bf16(learn->model->root, false);
    cf_lstm_set_bf16(learn->model->root, false);
    return CF_OK;
}
