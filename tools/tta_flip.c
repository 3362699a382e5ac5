/* corefit train --tta: the validation accuracy with flip test-time augmentation, the airbench
 * habit (fastai's tta with one deterministic flipped pass): cf_tta's flip pass predicts every
 * validation image as it is and mirrored left to right, and beta 0.5 averages the two
 * probability vectors. One extra pass over the validation set, in this process, after the fit. */
#include "train.h"

#include <stdio.h>

int cli_tta_flip(const char *cmd, cf_learner *learn, double *accuracy) {
    const cf_dataset *ds = learn->dls ? learn->dls->valid_ds : NULL;
    if (!ds || ds->n < 1) return cli_error(CLI_USAGE, cmd, "--tta needs a validation set");
    if (ds->n_classes < 2 || ds->target_dim != 1 || ds->sample_shape.ndim != 3 || ds->masks)
        return cli_error(CLI_USAGE, cmd, "--tta is for image classifiers (%s)", ds->source);
    cf_preds p;
    if (cf_tta(learn, &p, .flip_pass = true, .beta = 0.5))
        return cli_lib_error(cmd, "--tta: predictions of the plain and mirrored images");
    const int64_t n = p.n;
    const int k = (int)(cf_tensor_numel(&p.preds) / (size_t)n);
    int64_t right = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *row = p.preds.data + i * k;
        int best = 0;
        for (int j = 1; j < k; j++)
            if (row[j] > row[best]) best = j;
        right += best == (int)p.targs.data[i];
    }
    *accuracy = (double)right / (double)n;
    cf_preds_free(&p);
    return CLI_OK;
}
