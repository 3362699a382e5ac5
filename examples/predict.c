/* fastai's load_learner and predict in another program: the learner exported by
 * cf_learner_export (or `corefit train`) comes back with its classes, image size and
 * normalisation, and classifies image files as it was trained to see them.
 *
 *   example_predict MODEL.safetensors IMAGE...
 *
 * Prints one line per image: the file, the predicted class and its probability. */
#include <corefit.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.safetensors IMAGE...\n", argv[0]);
        return 2;
    }
    cf_learner *learn = NULL;
    if (cf_load_learner(argv[1], &learn) != CF_OK) {
        fprintf(stderr, "error: %s\n", cf_last_error());
        return 1;
    }
    const cf_dataset *ds = learn->dls->train_ds; /* the classes the model was trained on */
    float *probs = malloc((size_t)learn->recipe.n_out * sizeof *probs);
    int rc = probs ? 0 : 1;
    for (int i = 2; i < argc && rc == 0; i++) {
        int cls;
        if (cf_predict_image_file(learn, argv[i], probs, &cls) != CF_OK) {
            fprintf(stderr, "error: %s\n", cf_last_error());
            rc = 1;
        } else {
            printf("%s\t%s\t%.4f\n", argv[i], ds->vocab ? ds->vocab[cls] : "?", probs[cls]);
        }
    }
    free(probs);
    cf_learner_free(learn);
    return rc;
}
