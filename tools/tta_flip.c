/* corefit train --tta: the validation accuracy with flip test-time augmentation, the airbench
 * habit (and fastai's tta with one deterministic flipped pass): every validation image is
 * predicted as it is and mirrored left to right, and the two probability vectors are averaged.
 * One extra pass over the validation set, in this process, after the fit. The mirrored pass
 * mirrors the in-memory validation images in place and mirrors them back afterwards (exact: a
 * swap of pixels), so the learner's data is as before. */
#include "train.h"

#include <stdio.h>
#include <string.h>

/* Mirrors every image of ds (n, C, H, W) left to right, in place. */
static void mirror(cf_dataset *ds) {
    const int c = ds->sample_shape.dim[0], h = ds->sample_shape.dim[1], w = ds->sample_shape.dim[2];
    for (int64_t i = 0; i < ds->n; i++)
        for (int r = 0; r < c * h; r++) {
            float *row = ds->x + ((size_t)i * c * h + r) * w;
            for (int j = 0; j < w / 2; j++) {
                float t = row[j];
                row[j] = row[w - 1 - j];
                row[w - 1 - j] = t;
            }
        }
}

int cli_tta_flip(const char *cmd, cf_learner *learn, double *accuracy) {
    cf_dataset *ds = learn->dls ? learn->dls->valid_ds : NULL;
    if (!ds || ds->n < 1) return cli_error(CLI_USAGE, cmd, "--tta needs a validation set");
    if (ds->n_classes < 2 || ds->target_dim != 1 || ds->sample_shape.ndim != 3 || ds->masks)
        return cli_error(CLI_USAGE, cmd, "--tta is for image classifiers (%s)", ds->source);
    if (!ds->x || ds->samples)
        return cli_error(CLI_USAGE, cmd,
                         "--tta mirrors validation images held in memory (--idx, or --images "
                         "with --load memory); %s is streamed",
                         ds->source);
    cf_preds plain, mirrored;
    if (cf_get_preds(learn, &plain)) return cli_lib_error(cmd, "--tta: predictions");
    mirror(ds);
    cf_status st = cf_get_preds(learn, &mirrored);
    mirror(ds);
    if (st) {
        cf_preds_free(&plain);
        return cli_lib_error(cmd, "--tta: predictions of the mirrored images");
    }
    const int64_t n = plain.n;
    const int k = (int)(cf_tensor_numel(&plain.preds) / (size_t)n);
    int64_t right = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *p = plain.preds.data + i * k, *q = mirrored.preds.data + i * k;
        int best = 0;
        for (int j = 1; j < k; j++)
            if (p[j] + q[j] > p[best] + q[best]) best = j;
        right += best == (int)plain.targs.data[i];
    }
    *accuracy = (double)right / (double)n;
    cf_preds_free(&plain);
    cf_preds_free(&mirrored);
    return CLI_OK;
}
