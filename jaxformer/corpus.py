"""Corpus side of the pre-training data: reading text (BERT format, .jsonl), the built-in corpus and the
WordPiece tokenizer. Text is streamed from disk; nothing here holds a corpus in memory.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence, Union

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

PathLike = Union[str, os.PathLike]
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # training order: [PAD] gets id 0
DEFAULT_CACHE_DIR = Path("~/.cache/jaxformer")
CACHE_ENV = "JAXFORMER_CACHE_DIR"  # overrides DEFAULT_CACHE_DIR: the built-in corpus and the trained tokenizers
# A longer line is skipped (and counted): a file without newlines (a disk image, /dev/zero's like) would otherwise be
# read into memory whole.
MAX_LINE_BYTES = 8 << 20


def default_cache_dir() -> Path:
    """Where the built-in corpus and trained tokenizers are cached: $JAXFORMER_CACHE_DIR or ~/.cache/jaxformer."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


class DataError(ValueError):
    """Bad corpus, vocabulary or data configuration; the message names the path, field or value."""


@dataclasses.dataclass
class CorpusStats:
    """Counters filled while reading a corpus; pass one to ``iter_documents`` to inspect them."""

    files: int = 0
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    undecodable_lines: int = 0  # lines with invalid UTF-8: skipped
    malformed_lines: int = 0  # .jsonl lines that are not JSON objects with a string "text": skipped
    overlong_lines: int = 0  # lines over MAX_LINE_BYTES: skipped

    def summary(self) -> str:
        return (f"{self.files} files, {self.documents} documents, {self.sentences} sentences, "
                f"{self.tokens} tokens; skipped {self.undecodable_lines} undecodable lines, "
                f"{self.malformed_lines} malformed jsonl lines, {self.overlong_lines} lines over "
                f"{MAX_LINE_BYTES >> 20} MiB")


# ----------------------------------------------------------------------------- corpus reading
# Simple sentence splitter: break after . ! ? when whitespace and then a capital letter, digit,
# quote or bracket follow. The negative look-behinds keep a few common abbreviations intact;
# other abbreviations ("Fig. 3") do get split, which is harmless for pre-training.
_SENTENCE_BREAK = re.compile(
    r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bvs\.)(?<!\bcf\.)(?<!\bMr\.)(?<!\bDr\.)(?<!\bMrs\.)"
    r"(?<=[.!?])\s+(?=[\"'(\[\u201c]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences (whitespace collapsed) with the regex above."""
    return [s for s in _SENTENCE_BREAK.split(" ".join(text.split())) if s]


def resolve_paths(paths: PathLike | Sequence[PathLike]) -> list[Path]:
    """Expand files, directories (recursive, sorted, hidden entries skipped) and glob patterns."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[Path] = []
    for p in paths:
        path = Path(p).expanduser()
        if path.is_dir():
            found = sorted(f for f in path.rglob("*") if f.is_file()
                           and not any(part.startswith(".") for part in f.relative_to(path).parts))
            if not found:
                raise DataError(f"corpus directory {path} contains no (non-hidden) files")
        elif path.is_file():
            found = [path]
        elif path.exists():  # a device, pipe or socket: no end to read up to
            raise DataError(f"corpus path {path} is not a regular file")
        elif glob.has_magic(str(p)):
            found = sorted(Path(f) for f in glob.glob(str(path), recursive=True) if os.path.isfile(f))
            if not found:
                raise DataError(f"corpus glob pattern {str(p)!r} matched no files")
        else:
            raise DataError(f"corpus path {path} does not exist")
        files.extend(found)
    if not files:
        raise DataError("no corpus paths given")
    return files


def _iter_lines(path: Path, stats: CorpusStats, start: int = 0, end: int | None = None,
                digest=None) -> Iterator[str]:
    """Stream the stripped lines of bytes [start, end) of `path` (the whole file by default; `start` at a line
    start); decoding per line lets us skip and count only the bad lines. `digest` (a hashlib object): fed every
    byte read."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            left = float("inf") if end is None else end - start
            while left > 0 and (raw := f.readline(int(min(MAX_LINE_BYTES + 1, left)))):
                left -= len(raw)
                if digest is not None:
                    digest.update(raw)
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):  # skip to the end of this line
                    while left > 0 and (rest := f.readline(int(min(MAX_LINE_BYTES, left)))):
                        left -= len(rest)
                        if digest is not None:
                            digest.update(rest)
                        if rest.endswith(b"\n"):
                            break
                    stats.overlong_lines += 1
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    stats.undecodable_lines += 1
                    continue
                yield line.lstrip("\ufeff").strip()
    except OSError as e:
        raise DataError(f"cannot read corpus file {path}: {e.strerror or e}") from e


def iter_file_documents(path: Path, stats: CorpusStats, start: int = 0, end: int | None = None,
                        digest=None) -> Iterator[list[str]]:
    """The documents (lists of sentences) of one file, or of its bytes [start, end) when those are cut at document
    boundaries (`jaxformer.prepare.byte_ranges`); skipped lines are counted in `stats` (see `_iter_lines`)."""
    lines = _iter_lines(path, stats, start, end, digest)
    if path.suffix == ".jsonl":  # one JSON object per line, one document per line
        for line in lines:
            if not line:
                continue
            try:
                text = json.loads(line)["text"]
                if not isinstance(text, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError, IndexError):
                stats.malformed_lines += 1
                continue
            if sentences := split_sentences(text):
                yield sentences
        return
    doc: list[str] = []  # BERT format: one sentence per line, blank line between documents
    for line in lines:
        if line:
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def iter_documents(paths: PathLike | Sequence[PathLike],
                   stats: CorpusStats | None = None) -> Iterator[list[str]]:
    """Stream documents (lists of sentences) from files, directories or globs.

    Path errors are raised immediately; an empty corpus raises ``DataError`` once exhausted.
    Counters (including skipped undecodable lines) accumulate in ``stats`` if given.
    """
    files = resolve_paths(paths)
    stats = stats if stats is not None else CorpusStats()

    def generate() -> Iterator[list[str]]:
        found = 0
        for path in files:
            stats.files += 1
            for doc in iter_file_documents(path, stats):
                stats.documents += 1
                stats.sentences += len(doc)
                found += len(doc)
                yield doc
        if not found:
            raise DataError(f"corpus {', '.join(map(str, files))} contains no sentences")
    return generate()


# ----------------------------------------------------------------------------- built-in corpus
def _collect_stdlib_docs(out_path: str) -> None:
    """Dump (name, docstring) pairs of the standard library to ``out_path`` as JSON.

    Runs in a separate ``python -I`` process (its source is sent via ``inspect.getsource``) so
    that import side effects (prints, registered handlers, changed globals) never touch the
    caller. Modules that fail to import, open windows, or are tests/demos/entry points are skipped.
    """
    import contextlib, importlib, inspect, io, json, pkgutil, sys, warnings  # noqa: E401
    warnings.simplefilter("ignore")
    skip = {"antigravity", "this", "idlelib", "tkinter", "_tkinter", "turtle", "turtledemo",
            "test", "tests", "idle_test", "__main__", "ensurepip", "venv", "lib2to3"}
    names = sorted(n for n in sys.stdlib_module_names if n not in skip and not n.startswith("__"))
    docs, seen = [], set()

    def add(name, doc):
        if isinstance(doc, str) and len(doc) >= 40 and doc not in seen:
            seen.add(doc)
            docs.append((name, doc))

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        while names:
            name = names.pop(0)
            try:
                module = importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - any import failure just means "skip it"
                continue
            add(name, module.__doc__)
            for attr, obj in sorted(vars(module).items()):  # re-exports are deduplicated by add()
                add(f"{name}.{attr}", obj.__doc__ if callable(obj) else None)
                if inspect.isclass(obj):
                    for member, value in sorted(vars(obj).items()):
                        if callable(value) or isinstance(value, property):
                            add(f"{name}.{attr}.{member}", getattr(value, "__doc__", None))
            if hasattr(module, "__path__"):
                subs = sorted(m.name for m in pkgutil.iter_modules(module.__path__, name + "."))
                names[:0] = [s for s in subs if not set(s.split(".")) & skip]
        import pydoc_data.topics
        for key, text in sorted(pydoc_data.topics.topics.items()):
            add(f"topic:{key}", text)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(sorted(docs), f)


_RST_ROLE = re.compile(r":[\w:.-]+:`~?([^`<]*?)\s*(?:<[^>]*>)?`")  # :func:`name <target>` -> name
_RST_LITERAL = re.compile(r"`+([^`]*)`+|\*{1,2}([^*\s][^*]*?)\*{1,2}")
_UNDERLINE = re.compile(r"^([=\-~*^#+\"'])\1{2,}$")
# Whole lines that are code (dropped, ending the paragraph) vs code-ish fragments inside prose
# (the sentence holding one is dropped, so a paragraph is not cut in the middle).
_CODE_LINE = re.compile(r"^(>>>|\.\.\.|\$ |%|@|def |class |import |from \S+ import |return |raise |"
                        r"[\w.]+\(.*\)\s*(->.*)?:?$)|::=")
_CODE_BITS = re.compile(r"==|!=| = |[{}]|->|\w\[\w*\]")


def _letter_ratio(text: str) -> float:
    body = text.replace(" ", "")
    return sum(c.isalpha() for c in body) / max(1, len(body))


def _sentences_of_docstring(text: str) -> list[str]:
    """Clean one docstring/topic into prose sentences (code, doctests, RST markup removed)."""
    sentences: list[str] = []
    para: list[str] = []
    skip_deeper_than = None  # indentation of a line that introduced a code block

    def flush() -> None:
        if not para:
            return
        prose = _RST_LITERAL.sub(lambda m: m.group(1) or m.group(2), _RST_ROLE.sub(r"\1", " ".join(para)))
        for s in split_sentences(prose):
            # Drop fragments: too short, code-like, or too few letters to be prose.
            if len(s.split()) >= 4 and not _CODE_BITS.search(s) and _letter_ratio(s) >= 0.75:
                sentences.append(s)
        para.clear()

    for raw in inspect.cleandoc(text).splitlines():
        line, indent = raw.strip(), len(raw) - len(raw.lstrip())
        if not line:
            flush()
            continue
        if skip_deeper_than is not None and indent > skip_deeper_than:
            continue  # inside an example / literal block
        skip_deeper_than = None
        if _UNDERLINE.match(line):
            para[-1:] = []  # the heading above an RST underline is not a sentence
            flush()
        elif _CODE_LINE.search(line) or line.startswith(".. ") or _letter_ratio(line) < 0.6:
            flush()
            skip_deeper_than = indent if line.startswith(".. ") else None
        else:
            para.append(line)
            if line.endswith(":"):  # "for example:" / "::" introduce an indented code block
                skip_deeper_than = indent
    flush()
    return sentences


def builtin_corpus(cache_dir: PathLike | None = None) -> Path:
    """Path of a BERT-format corpus made of this Python's stdlib docstrings and pydoc topics.

    Built offline on first use (a few seconds) and cached as
    ``<cache_dir>/builtin_corpus_py{major}{minor}.txt`` (default ``default_cache_dir()``); written
    to a temp file and moved into place atomically. Deterministic for a given Python build.
    """
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    out = cache / f"builtin_corpus_py{sys.version_info.major}{sys.version_info.minor}.txt"
    if out.is_file() and out.stat().st_size > 0:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="tmp-corpus-") as tmp:
        raw = Path(tmp) / "docstrings.json"
        code = inspect.getsource(_collect_stdlib_docs) + f"\n_collect_stdlib_docs({str(raw)!r})\n"
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp, env=env, timeout=600,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        if proc.returncode != 0 or not raw.is_file():
            raise DataError(f"building the built-in corpus in {cache} failed: "
                            f"{proc.stderr.decode(errors='replace')[-500:]}")
        part = Path(tmp) / out.name
        with open(part, "w", encoding="utf-8") as f:
            for _name, text in json.loads(raw.read_text(encoding="utf-8")):
                if sentences := _sentences_of_docstring(text):
                    f.write("\n".join(sentences) + "\n\n")
        os.replace(part, out)
    return out


# ----------------------------------------------------------------------------- tokenizer
SpecialIds = collections.namedtuple("SpecialIds", "pad unk cls sep mask")


def special_token_ids(tokenizer: Tokenizer) -> SpecialIds:
    """Ids of [PAD] [UNK] [CLS] [SEP] [MASK]; ``DataError`` naming any that are missing."""
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    if missing := [t for t, i in ids.items() if i is None]:
        raise DataError(f"tokenizer vocabulary lacks special tokens {missing}")
    return SpecialIds(*ids.values())


def _bert_tokenizer(vocab: dict[str, int] | None, lowercase: bool) -> Tokenizer:
    """BERT's WordPiece pipeline; ``vocab=None`` for one still to be trained (specials first)."""
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    cls, sep = ((vocab or {}).get(t, SPECIAL_TOKENS.index(t)) for t in ("[CLS]", "[SEP]"))
    tok.post_processor = processors.TemplateProcessing(  # for users of tok.encode(a, b)
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def _write_atomic(path: Path, text: str) -> None:
    """Readers never see a half-written file: write a temp file, then rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _load_vocab(path: Path, lowercase: bool) -> Tokenizer:
    """A BERT ``vocab.txt`` (WordPiece) or a ``tokenizer.json``, checked for the special tokens."""
    if path.is_dir():
        raise DataError(f"vocabulary {path} is a directory; give a vocab.txt or tokenizer.json file")
    if not path.is_file():
        raise DataError(f"vocabulary file {path} does not exist")
    if path.suffix == ".json":
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception on a bad file
            raise DataError(f"cannot load tokenizer {path}: {e}") from e
        special_token_ids(tok)  # the examples need all five special tokens
        return tok
    table: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                table.setdefault(line.rstrip("\r\n"), i)
    except UnicodeDecodeError as e:
        raise DataError(f"vocabulary file {path} is not UTF-8 text (byte {e.start}: {e.reason}); give a BERT "
                        "vocab.txt (one token per line) or a tokenizer.json") from None
    except OSError as e:
        raise DataError(f"cannot read vocabulary file {path}: {e.strerror or e}") from e
    if missing := [t for t in SPECIAL_TOKENS if t not in table]:
        raise DataError(f"vocabulary {path} lacks special tokens {missing}")
    return _bert_tokenizer(table, lowercase)


_DIGESTS: dict[tuple, str] = {}  # corpus_digest's results in this process, by the files' names, sizes and times


def corpus_digest(files: Sequence[Path]) -> str:
    """SHA-256 of the corpus files' contents, in order (the key of a trained tokenizer and of a prepared set in the
    cache). Read once per process while the files keep their sizes and modification times."""
    try:
        key = tuple((str(Path(p).resolve()), s.st_size, s.st_mtime_ns) for p in files for s in [Path(p).stat()])
    except OSError as e:
        raise DataError(f"cannot read corpus file {e.filename}: {e.strerror or e}") from e
    if key not in _DIGESTS:
        _DIGESTS[key] = _digest(files)
    return _DIGESTS[key]


def _digest(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(f"{path.stat().st_size}\n".encode())
        try:
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        except OSError as e:
            raise DataError(f"cannot read corpus file {path}: {e.strerror or e}") from e
    return h.hexdigest()


def _canonical(tok: Tokenizer, lowercase: bool) -> Tokenizer:
    """`tok`'s vocabulary with canonical ids: the special tokens first, then the others in sorted order. A
    WordPiece model looks tokens up by text, so only the ids change; the trainer numbers tokens in an order that
    depends on hash maps (different in every process), this order depends on the token set alone."""
    vocab = tok.get_vocab()
    others = sorted(t for t in vocab if t not in SPECIAL_TOKENS)
    return _bert_tokenizer({t: i for i, t in enumerate([*SPECIAL_TOKENS, *others])}, lowercase)


def _train(files: Sequence[Path], vocab_size: int, lowercase: bool) -> Tokenizer:
    tok = _bert_tokenizer(None, lowercase)
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##")
    tok.train_from_iterator((s for doc in iter_documents(files) for s in doc), trainer=trainer)
    return _canonical(tok, lowercase)


def load_or_train_tokenizer(vocab: PathLike | None = None,
                            corpus_paths: PathLike | Sequence[PathLike] | None = None,
                            vocab_size: int = 8192, lowercase: bool = True,
                            save_dir: PathLike | None = None, cache: PathLike | None | bool = None) -> Tokenizer:
    """Load a BERT ``vocab.txt`` / ``tokenizer.json``, or train a WordPiece tokenizer.

    Training uses ``corpus_paths`` (default: the built-in corpus) and saves ``tokenizer.json`` plus
    ``tokenizer.meta.json`` (corpus files, sizes, mtimes, vocab_size, lowercase) in ``save_dir``;
    a later call with the same inputs reloads it instead of retraining. Reuse matters: WordPiece
    training in ``tokenizers`` is not bit-reproducible across processes (hash-map order; e.g.
    huggingface/tokenizers#1794), so a trained tokenizer is also kept in
    ``<cache>/tokenizers/<key>.json`` (``cache`` default: ``default_cache_dir()``; False: no cache),
    keyed by the corpus's contents (``corpus_digest``), ``vocab_size`` and ``lowercase``, and reused by
    every later run on the same text. A loaded vocabulary is also written to ``save_dir/tokenizer.json``,
    so ``save_dir`` always holds the tokenizer in use. ``lowercase`` does not apply to ``tokenizer.json``
    files (they carry their normalizer).
    """
    save = Path(save_dir).expanduser() if save_dir is not None else None
    if vocab is not None:
        path = Path(vocab).expanduser()
        tok = _load_vocab(path, lowercase)
        target = save / "tokenizer.json" if save else None
        if target and not (target.is_file() and target.samefile(path)):
            save.mkdir(parents=True, exist_ok=True)
            (save / "tokenizer.meta.json").unlink(missing_ok=True)  # it vouched for a trained tokenizer
            _write_atomic(save / "tokenizer.json", tok.to_str())
        return tok
    if vocab_size < 16:
        raise DataError(f"vocab_size must be >= 16, got {vocab_size!r}")
    files = resolve_paths(corpus_paths if corpus_paths is not None else builtin_corpus())
    meta = json.dumps({"files": [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
                       "vocab_size": vocab_size, "lowercase": lowercase})
    if save and (save / "tokenizer.json").is_file() and (save / "tokenizer.meta.json").is_file() \
            and (save / "tokenizer.meta.json").read_text(encoding="utf-8") == meta:
        return Tokenizer.from_file(str(save / "tokenizer.json"))
    cached = None
    if cache is not False:
        key = json.dumps({"corpus_sha256": corpus_digest(files), "vocab_size": vocab_size, "lowercase": lowercase,
                          "trainer": "wordpiece, min_frequency 2, canonical ids"})
        cached = (Path(cache).expanduser() if cache else default_cache_dir()) / "tokenizers" / \
            f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    tok = None
    if cached is not None and cached.is_file():
        try:
            tok = Tokenizer.from_file(str(cached))
        except Exception:  # noqa: BLE001 - a damaged cache entry is retrained and replaced
            tok = None
    if tok is None:
        tok = _train(files, vocab_size, lowercase)
        if cached is not None:
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                _write_atomic(cached, tok.to_str())
            except OSError:  # a read-only cache only costs the reuse
                pass
    if save:
        save.mkdir(parents=True, exist_ok=True)
        (save / "tokenizer.meta.json").unlink(missing_ok=True)  # no stale meta vouching for new file
        _write_atomic(save / "tokenizer.json", tok.to_str())
        _write_atomic(save / "tokenizer.meta.json", meta)  # last: it vouches for tokenizer.json
    return tok
