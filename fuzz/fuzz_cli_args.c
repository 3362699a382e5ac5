/* libFuzzer target: the command line's option parser (tools/args.c) on arbitrary arguments.
 * The input is split at NUL bytes into argv; the option table has every kind of option the
 * subcommands use (flags, strings, integers and doubles with ranges, 64-bit seeds). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../tools/args.c"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    cli_messages = fopen("/dev/null", "w"); /* usage messages are expected, by the million */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { MAX_ARGS = 32 };
    char buf[4096];
    if (size >= sizeof buf) size = sizeof buf - 1;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = "train";
    for (size_t at = 0; at <= size && argc < MAX_ARGS; at += strlen(buf + at) + 1)
        argv[argc++] = buf + at;
    argv[argc] = NULL;

    bool flag = false;
    const char *str = NULL;
    int epochs = 1;
    double lr = 1e-3;
    uint64_t seed = 0;
    cli_opt opts[] = {
        {"--flag", OPT_FLAG, &flag, NULL, "a flag", 1, 0, false},
        {"--out", OPT_STR, &str, "FILE", "a string", 1, 0, false},
        {"--epochs", OPT_INT, &epochs, "N", "an integer", 1, 1000, false},
        {"--lr", OPT_DOUBLE, &lr, "X", "a double", 1e-9, 10, false},
        {"--seed", OPT_U64, &seed, "S", "a seed", 1, 0, false},
        {NULL, OPT_FLAG, NULL, NULL, NULL, 0, 0, false},
    };
    const char *pos[4];
    int n_pos = 0;
    int rc = cli_parse("train", argc, argv, 1, opts, pos, 4, &n_pos);
    if (rc == CLI_OK) {
        /* what the parser accepted respects the ranges and the positional limit */
        if (epochs < 1 || epochs > 1000 || !(lr >= 1e-9 && lr <= 10) || n_pos > 4) __builtin_trap();
    }
    return 0;
}
