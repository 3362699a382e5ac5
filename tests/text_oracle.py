#!/usr/bin/python3
"""Oracle for corefit's text tokenizer and vocabulary (src/data/text_*.c).

fastai's rules are copied from fastai/text/core.py (same regular expressions, same order); the
word splitter is the spaCy approximation of reference/fastai-text.md section 1, written with
python's `re`. The C code must produce exactly what this file produces.

    text_oracle.py rules FILE      one line per text: the text after the rules (JSON string)
    text_oracle.py tokens FILE     one line per text: its tokens (JSON list)
    text_oracle.py vocab TOKFILE [min_freq max_vocab]
                                   TOKFILE: the corpus's tokens in order, each followed by a
                                   NUL byte; prints fastai's make_vocab result as JSON
    text_oracle.py bench FILE...   tokenizes every fortune of the files (one process), prints
                                   texts, tokens, wall and CPU seconds
Texts in FILE are separated by a line holding only '\\x1e' (record separator), so that they
may hold newlines, CR and tabs.
"""
import collections
import html
import json
import re
import sys
import time
import unicodedata

SPECIAL = ['xxunk', 'xxpad', 'xxbos', 'xxeos', 'xxfld', 'xxrep', 'xxwrep', 'xxup', 'xxmaj']
UNK, PAD, BOS, EOS, FLD, TK_REP, TK_WREP, TK_UP, TK_MAJ = SPECIAL

# ---- fastai's rules (fastai/text/core.py) ----


def fix_html(x):
    x = x.replace('#39;', "'").replace('amp;', '&').replace('#146;', "'").replace(
        'nbsp;', ' ').replace('#36;', '$').replace('\\n', "\n").replace('quot;', "'").replace(
        '<br />', "\n").replace('\\"', '"').replace('<unk>', UNK).replace(' @.@ ', '.').replace(
        ' @-@ ', '-').replace('...', ' …')
    return html.unescape(x)


_re_rep = re.compile(r'(\S)(\1{2,})')


def replace_rep(t):
    def _replace_rep(m):
        c, cc = m.groups()
        return f' {TK_REP} {len(cc)+1} {c} '
    return _re_rep.sub(_replace_rep, t)


_re_wrep = re.compile(r'(?:\s|^)(\w+)\s+((?:\1\s+)+)\1(\s|\W|$)')


def replace_wrep(t):
    def _replace_wrep(m):
        c, cc, e = m.groups()
        return f' {TK_WREP} {len(cc.split())+2} {c} {e}'
    return _re_wrep.sub(_replace_wrep, t)


def spec_add_spaces(t):
    return re.sub(r'([/#\\])', r' \1 ', t)


def rm_useless_spaces(t):
    return re.sub(' {2,}', ' ', t)


_re_all_caps = re.compile(r'(\s|^)([A-Z]+[^a-z\s]*)(?=(\s|$))')


def replace_all_caps(t):
    def _replace_all_caps(m):
        tok = f'{TK_UP} ' if len(m.groups()[1]) > 1 else ''
        return f"{m.groups()[0]}{tok}{m.groups()[1].lower()}"
    return _re_all_caps.sub(_replace_all_caps, t)


_re_maj = re.compile(r'(\s|^)([A-Z][^A-Z\s]*)(?=(\s|$))')


def replace_maj(t):
    def _replace_maj(m):
        tok = f'{TK_MAJ} ' if len(m.groups()[1]) > 1 else ''
        return f"{m.groups()[0]}{tok}{m.groups()[1].lower()}"
    return _re_maj.sub(_replace_maj, t)


def lowercase(t, add_bos=True, add_eos=False):
    return (f'{BOS} ' if add_bos else '') + t.lower().strip() + (f' {EOS}' if add_eos else '')


RULES = [fix_html, replace_rep, replace_wrep, spec_add_spaces, rm_useless_spaces,
         replace_all_caps, replace_maj, lowercase]


def apply_rules(t):
    for r in RULES:
        t = r(t)
    return t

# ---- the word splitter: spaCy's English rules, approximated (reference section 1) ----


PREFIX = set('([{<"\'`$£€#*&…‘“«¿¡')
SUFFIX = set(')]}>"\',;:!?%…’”»')
APOS = "'’"
CLITIC_FORMS = {a + c for a in APOS for c in ('s', 'm', 're', 've', 'd', 'll')} | {
    'n' + a + 't' for a in APOS}
ABBREV = {'mr.', 'mrs.', 'ms.', 'dr.', 'prof.', 'st.', 'jr.', 'sr.', 'vs.', 'etc.', 'inc.',
          'ltd.', 'corp.', 'vol.', 'mt.', 'ft.', 'gov.', 'sen.', 'lt.', 'sgt.', 'capt.',
          'jan.', 'feb.', 'apr.', 'jun.', 'jul.', 'aug.', 'sep.', 'sept.', 'oct.', 'nov.',
          'dec.'}
_re_letter_dots = re.compile(r'(?:[a-z]\.)+')
PRONOUNS = {'i', 'you', 'he', 'she', 'it', 'we', 'they', 'who', 'what', 'there', 'that',
            'could', 'would', 'should', 'might', 'must'}
SPLIT_WORDS = {'gonna': ['gon', 'na'], 'gotta': ['got', 'ta'], 'wanna': ['wan', 'na'],
               'cannot': ['can', 'not']}
SPECIAL_SET = set(SPECIAL)
# letters (and non-decimal numerals) are [^\W\d_]; digits of the infixes are ASCII
_re_infix = re.compile(r'(?<=[^\W\d_])[-–—~](?=[^\W\d_])'
                       r'|(?<=[^\W\d_]),(?=[^\W\d_])'
                       r'|(?<=[0-9])[-+*^](?=[0-9])'
                       r'|(?<=[^\W_])[:<>=](?=[^\W\d_])'
                       r'|…')


def is_symbol(c):
    """Other symbols (emoji, ©, ™, ...) split like punctuation, as spaCy's ICONS; not °."""
    return c != '°' and unicodedata.category(c) == 'So'


def is_exception(s):
    return s in SPECIAL_SET or s in CLITIC_FORMS or s in ABBREV or bool(
        _re_letter_dots.fullmatch(s))


def clitics(s):
    if s in SPLIT_WORDS:
        return SPLIT_WORDS[s]
    if len(s) > 3 and s[-3] == 'n' and s[-2] in APOS and s[-1] == 't':
        return [s[:-3], s[-3:]]
    if len(s) > 2 and s[-2] in APOS and s[-1] == 's':
        return [s[:-2], s[-2:]]
    for c in ('m', 're', 've', 'd', 'll'):
        n = len(c) + 1
        if len(s) > n and s[-n] in APOS and s.endswith(c):
            stem = s[:-n]
            if (c == 'm' and stem == 'i') or (c != 'm' and stem in PRONOUNS):
                return [stem, s[-n:]]
    return [s]


def infixes(s):
    out, start = [], 0
    for m in _re_infix.finditer(s):
        if m.start() > start:
            out.append(s[start:m.start()])
        out.append(m.group())
        start = m.end()
    if start < len(s):
        out.append(s[start:])
    return out


def split_chunk(s):
    pre, suf = [], []
    while len(s) > 1 and not is_exception(s):
        if s[0] in PREFIX or is_symbol(s[0]):
            pre.append(s[0])
            s = s[1:]
        elif s[-1] in SUFFIX or is_symbol(s[-1]) or s[-1] == '.':
            suf.append(s[-1])
            s = s[:-1]
        else:
            break
    out = pre
    if is_exception(s):
        out.append(s)
    else:
        for piece in clitics(s):
            out.extend(infixes(piece))
    out.extend(reversed(suf))
    return out


def split_words(t):
    toks = []
    for m in re.finditer(r'\s+|\S+', t):
        s = m.group()
        if s[0].isspace():
            if s[0] == ' ':
                s = s[1:]
            if s:
                toks.append(s)
        else:
            toks.extend(split_chunk(s))
    return [x.replace(' ', '\u2581') for x in toks]  # fastai's replace_space


def tokenize(t):
    return split_words(apply_rules(t))

# ---- fastai's make_vocab (fastai/text/data.py) ----


def make_vocab(count, min_freq=3, max_vocab=60000):
    vocab = [o for o, c in count.most_common(max_vocab) if c >= min_freq]
    for o in reversed(SPECIAL):
        if o in vocab:
            vocab.remove(o)
        vocab.insert(0, o)
    vocab = vocab[:max_vocab]
    return vocab + ['xxfake' for _ in range(0, 8 - len(vocab) % 8)]


def read_texts(path):
    with open(path, encoding='utf-8', newline='') as f:
        data = f.read()
    return data.split('\n\x1e\n') if data else []


def fortunes(path):
    """The quotations of a fortune file: texts separated by lines holding only '%'."""
    with open(path, encoding='utf-8', newline='') as f:
        data = f.read()
    out, cur = [], []
    for line in data.split('\n'):
        if line == '%':
            out.append('\n'.join(cur))
            cur = []
        else:
            cur.append(line)
    if cur and any(cur):
        out.append('\n'.join(cur))
    return out


def main():
    mode = sys.argv[1]
    out = sys.stdout
    if mode == 'rules':
        for t in read_texts(sys.argv[2]):
            out.write(json.dumps(apply_rules(t)) + '\n')
    elif mode == 'tokens':
        for t in read_texts(sys.argv[2]):
            out.write(json.dumps(tokenize(t)) + '\n')
    elif mode == 'vocab':
        with open(sys.argv[2], encoding='utf-8', newline='') as f:
            count = collections.Counter(f.read().split('\0')[:-1])
        args = [int(a) for a in sys.argv[3:5]]
        out.write(json.dumps(make_vocab(count, *args)) + '\n')
    elif mode == 'bench':
        texts = [t for p in sys.argv[2:] for t in fortunes(p)]
        start, cpu = time.perf_counter(), time.process_time()
        n_tok = sum(len(tokenize(t)) for t in texts)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        out.write(f'{len(texts)} texts {n_tok} tokens {took:.3f} s {cpu:.3f} cpu\n')
    else:
        sys.exit(f'text_oracle.py: unknown mode {mode}')


if __name__ == '__main__':
    main()
