#!/usr/bin/env python3
"""Every option `corefit train --help`, `eval --help`, `predict --help` and `lr-find --help`
print is documented in docs/cli.md (as `--name`) and in the man page docs/corefit.1 (as
\\-\\-name), so that the help and the docs stay in step.

    cli_docs.py COREFIT SOURCE_DIR
    cli_docs.py --self-test COREFIT SOURCE_DIR   (a doc missing one option must fail)
"""
import re
import subprocess
import sys

COMMANDS = ("train", "lr-find", "eval", "predict")


def help_options(corefit, command):
    out = subprocess.run([corefit, command, "--help"], capture_output=True, text=True,
                         check=True).stdout
    # an option line: two spaces, the option (and "-h, " before --help)
    names = re.findall(r"^  (?:-h, )?(--[a-z0-9][a-z0-9-]*)", out, re.M)
    if len(names) < 3:
        raise SystemExit("corefit %s --help lists no options:\n%s" % (command, out))
    return [n for n in names if n != "--help"]


def missing(corefit, cli_md, man):
    man_plain = man.replace("\\-", "-")
    gaps = []
    for command in COMMANDS:
        for name in help_options(corefit, command):
            # a whole option name: not the start of a longer one (--plot in --plots)
            pat = re.escape(name) + r"(?![a-z0-9-])"
            if not re.search(pat, cli_md):
                gaps.append("docs/cli.md lacks %s %s" % (command, name))
            if not re.search(pat, man_plain):
                gaps.append("docs/corefit.1 lacks %s %s" % (command, name))
    return gaps


def main(argv):
    self_test = argv[1:2] == ["--self-test"]
    if self_test:
        argv = argv[:1] + argv[2:]
    corefit, src = argv[1], argv[2]
    cli_md = open(src + "/docs/cli.md", encoding="utf-8").read()
    man = open(src + "/docs/corefit.1", encoding="utf-8").read()
    if self_test:
        # the check must catch a doc that drops an option
        cut = re.sub(r"--aug(?![a-z0-9-])", "--xx", cli_md)
        gaps = missing(corefit, cut, man)
        if not any("--aug" in g for g in gaps):
            print("the check did not notice docs/cli.md without --aug")
            return 1
        print("ok: a doc without --aug is caught")
        return 0
    gaps = missing(corefit, cli_md, man)
    for g in gaps:
        print(g)
    if gaps:
        print("%d option(s) of --help undocumented" % len(gaps))
        return 1
    print("ok: every --help option of %s is in docs/cli.md and docs/corefit.1" % ", ".join(COMMANDS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
