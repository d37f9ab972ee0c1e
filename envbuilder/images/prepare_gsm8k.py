#!/usr/bin/env python3
"""GSM8K in the parquet layout verl's RL dataset and its GSM8K reward read; for an envbuild profile.

  prepare_gsm8k.py --out DIR                 from the Hugging Face hub, through $HF_ENDPOINT
                                             (a mirror works; $HF_TOKEN is sent when set)
  prepare_gsm8k.py --out DIR --from PATH     from local files: PATH is a folder holding
                                             train/test .parquet or .jsonl files with the raw
                                             `question` and `answer` fields, or one such file
                                             per split: --from train.jsonl --from test.jsonl
  --limit N                                  keep the first N rows of each split

The dataset (its repo, revision and files, the prompt's instruction, the answer's pattern) is
read from envbuild-scripts.json beside this file, as `envbuild render` wrote it for the profile.
Writes DIR/train.parquet and DIR/test.parquet, both or neither. Exit 0 done, 1 the download
failed, 2 bad input (a missing sidecar too).
"""

from __future__ import annotations

import argparse
import importlib
import json
import errno
import os
import pathlib
import re
import stat
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPMessage
from typing import IO, Protocol, TypedDict, Union, cast

# what a sidecar value may be: a kind (a key of KINDS) or a shape made of kinds (shape_problem)
Kind = Union[type, str, None]
Shape = Union[Kind, "frozenset[str]", "set[str]", "tuple[Kind, ...]", "list[Shape]", "dict[Kind, Shape]"]
Row = dict[str, object]

SIDECAR = "envbuild-scripts.json"  # written beside this file by `envbuild render`
KEY = "prepare_gsm8k"  # this script's part of it
MAX_SIDECAR_BYTES = 4 << 20  # the sidecar is ~10 KB: anything this large is not one
KINDS: dict[Kind, str] = {
    str: "a string",
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    None: "null",
    "text": "a non-empty string",
    "path": "a relative path of a .py file (letters, digits, _ and /; no '..', no leading /)",
    "module": "a dotted module name",
    "version": "a version (digits and dots)",
    "pattern": "a regular expression",
}
# the matrix's RELPATH (envbuilder/model/schema.py), held equal by a test: what render, overlays
# and `render --from` let a patch name, so a sidecar names nothing else
PATTERNS = {
    "path": r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.py",
    "module": r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
    "version": r"[0-9]+(\.[0-9]+)*",
}
SHAPE: dict[Kind, Shape] = {
    "profile": str,
    "repo": "text",
    "revision": "text",
    "files": {"train": "text", "test": "text"},
    "data_source": str,
    "instruction": str,
    "ability": str,
    "answer_pattern": "pattern",
}
SPLITS = ("train", "test")
MAX_BYTES = 256 * 1024 * 1024  # a GSM8K split is ~3 MB: anything this large is not it


class Spec(TypedDict):
    """This script's part of the sidecar, as SHAPE holds it."""

    profile: str
    repo: str
    revision: str
    files: dict[str, str]
    data_source: str
    instruction: str
    ability: str
    answer_pattern: str


# what is called of pyarrow (verl's dependency, imported only where it is used)
class Table(Protocol):
    def to_pylist(self) -> list[object]: ...


class TableClass(Protocol):
    def from_pylist(self, rows: list[Row]) -> Table: ...


class Arrow(Protocol):
    Table: TableClass


class Parquet(Protocol):
    def read_table(self, source: str, *, columns: list[str]) -> Table: ...
    def write_table(self, table: Table, where: str) -> None: ...


class Failure(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def read_regular(path: pathlib.Path, limit: int) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes, OSError otherwise:
    a FIFO is never waited on, a device such as /dev/zero never read without end."""
    fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    finally:
        os.close(fd)


def kind_ok(value: object, kind: Kind) -> bool:
    """`value` is of `kind`, a key of KINDS (a string: one that UTF-8 can write)."""
    if kind is None or kind is bool:
        return value is None if kind is None else isinstance(value, bool)
    if kind is int or kind is float:
        return isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
        if kind == "pattern":
            re.compile(value)
    except (UnicodeError, re.error, RecursionError, OverflowError):
        return False
    if isinstance(kind, str) and kind in PATTERNS:
        return re.fullmatch(PATTERNS[kind], value) is not None
    return kind is str or value != ""


def shape_problem(value: object, shape: Shape, where: str) -> str | None:
    """What in `value` is not as `shape` says, as a phrase naming the place; None when all is.
    A shape is a kind (KINDS), a set of the strings allowed, a tuple (either shape), [item]
    (a list of items), [first, second] (a list of exactly these), {key: shape} (an object with
    these keys; others are left alone) or {str: shape} (an object whose every value is shape)."""
    if isinstance(shape, tuple):
        if any(shape_problem(value, s, where) is None for s in shape):
            return None
        what = " or ".join(KINDS.get(s, "another shape") for s in shape)
    elif isinstance(shape, (set, frozenset)):
        if isinstance(value, str) and value in shape:
            return None
        what = "one of " + ", ".join(sorted(shape))
    elif isinstance(shape, list):
        if isinstance(value, list) and len(shape) in (1, len(value)):
            items: list[object] = value
            for i, item in enumerate(items):
                problem = shape_problem(item, shape[0] if len(shape) == 1 else shape[i], f"{where}[{i}]")
                if problem:
                    return problem
            return None
        what = "a list" if len(shape) == 1 else f"a list of {len(shape)}"
    elif isinstance(shape, dict):
        if isinstance(value, dict):
            fields: dict[object, object] = value
            missing = [k for k in shape if k is not str and k not in fields]
            if missing:
                return f"has no {missing[0]!r} in its {where!r} part"
            pairs: list[tuple[object, Shape]]
            pairs = [(k, shape[str]) for k in fields] if str in shape else list(shape.items())
            for k, s in pairs:
                problem = shape_problem(k, str, f"{where} key") or shape_problem(fields[k], s, f"{where}.{k}")
                if problem:
                    return problem
            return None
        what = "an object"
    else:
        if kind_ok(value, shape):
            return None
        what = KINDS[shape]
    shown = "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else ascii(value)
    return f"has {where} = {shown[:80]}, not {what}"


def load_data(key: str, shape: dict[Kind, Shape]) -> dict[str, object] | None:
    """This script's part (`key`) of the sidecar beside it, as `shape` says it is, or None, said
    on stderr, when the file is missing or no regular file, is no JSON object, lacks a field or
    holds a value that is not what it should be."""
    path = pathlib.Path(__file__).resolve().with_name(SIDECAR)
    try:
        data: object = json.loads(read_regular(path, MAX_SIDECAR_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        why = f"cannot be read ({type(e).__name__}: {e})"
    else:
        doc: dict[object, object] = data if isinstance(data, dict) else {}
        part = doc.get(key)
        if not isinstance(part, dict):
            why = f"holds no {key!r} object"
        else:
            problem = shape_problem(part, shape, key)
            if problem is None:
                return part
            why = problem
    print(
        f"{key}: {path} {why}. This script reads the profile's data from the {SIDECAR} that "
        f"`envbuild render` writes beside it: render the profile again and keep the two together.",
        file=sys.stderr,
    )
    return None


def answer_of(spec: Spec, text: str | None) -> str | None:
    """The final number of a GSM8K answer (or a model's response): the last `#### N`."""
    found: list[object] = re.findall(spec["answer_pattern"], text or "")
    return str(found[-1]).replace(",", "").replace("$", "") if found else None


def text_or_empty(value: object) -> str:
    """`value or ""` when that is a string; the TypeError re raises on anything else."""
    if not value:
        return ""
    if isinstance(value, str):
        return value
    raise TypeError(f"expected string or bytes-like object, got {type(value).__name__!r}")


def field(r: object, name: str) -> object:
    """r.get(name) of a row (a JSON object); the AttributeError of .get on anything else."""
    if isinstance(r, dict):
        found: object = r.get(name)
        return found
    raise AttributeError(f"{type(r).__name__!r} object has no attribute 'get'")


def row(spec: Spec, split: str, index: int, question: object, answer: object) -> Row:
    truth = answer_of(spec, text_or_empty(answer))
    if not isinstance(question, str) or not question.strip() or truth is None:
        raise Failure(
            f"{split} row {index} has no question or no final '#### N' in its answer; GSM8K rows "
            "have `question` and `answer` fields (pass the dataset's own files).",
            2,
        )
    return {
        "data_source": spec["data_source"],
        "prompt": [{"role": "user", "content": question + " " + spec["instruction"]}],
        "ability": spec["ability"],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def read_rows(path: str) -> list[object]:
    """[{question, answer}, ...] from a .parquet or .jsonl file."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise Failure(f"{path} is larger than {MAX_BYTES >> 20} MiB: not a GSM8K split.", 2)
        if path.endswith(".parquet"):
            pq = cast(Parquet, importlib.import_module("pyarrow.parquet"))

            return list(pq.read_table(path, columns=["question", "answer"]).to_pylist())
        with open(path, encoding="utf-8") as fh:
            rows: list[object] = [json.loads(line) for line in fh if line.strip()]
            return rows
    except Failure:
        raise
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        raise Failure(f"cannot read {path}: {e}. Pass GSM8K's own parquet or jsonl files.", 2) from e
    except Exception as e:  # pyarrow's own errors (ArrowInvalid, ...)
        raise Failure(
            f"cannot read {path}: {type(e).__name__}: {e}. Pass GSM8K's own parquet or jsonl files.", 2
        ) from e


def local_files(sources: list[str]) -> dict[str, str]:
    """{split: path} from --from arguments (a folder, or one file per split)."""
    found: dict[str, str] = {}
    for src in sources:
        if os.path.isdir(src):
            names = sorted(os.listdir(src))
            for split in SPLITS:
                hits = [n for n in names if n.startswith(split) and n.endswith((".parquet", ".jsonl"))]
                if hits and split not in found:
                    found[split] = os.path.join(src, hits[0])
        elif os.path.isfile(src):
            named = next((s for s in SPLITS if os.path.basename(src).startswith(s)), None)
            if named is None:
                raise Failure(f"{src}: a file's name must start with train or test.", 2)
            found[named] = src
        else:
            raise Failure(f"{src} does not exist.", 2)
    missing = [s for s in SPLITS if s not in found]
    if missing:
        raise Failure(
            f"no {' or '.join(missing)} file in {', '.join(sources)} (names starting with "
            "train/test, ending .parquet or .jsonl).",
            2,
        )
    return found


def redacted(text: str) -> str:
    """`text` with a URL's user:password@ as ***@, up to the authority's last '@' (envbuild's
    text.redact, copied: this script runs alone with the standard library)."""
    return re.sub(r"(://)[^/?#\s]*@", r"\1***@", text)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """Redirects that keep Authorization only on the endpoint's own scheme, host and port:
    urllib's own handler sends HF_TOKEN (or a mirror's password) wherever a mirror redirects."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(new.full_url) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new


def endpoint_auth(endpoint: str) -> tuple[str, dict[str, str]]:
    """(HF_ENDPOINT without its user:password@, the headers to send it): a mirror's userinfo as
    Basic auth (urllib takes `user:pw@host` for the host name), else HF_TOKEN as a Bearer."""
    import base64

    headers = {"User-Agent": "envbuild-prepare-gsm8k"}
    parts = urllib.parse.urlsplit(endpoint)
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        host = parts.netloc.rpartition("@")[2]
        endpoint = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    elif os.environ.get("HF_TOKEN"):
        headers["Authorization"] = "Bearer " + os.environ["HF_TOKEN"]
    return endpoint, headers


def download(spec: Spec, tmp: str) -> dict[str, str]:
    """{split: path} of the dataset's parquet files, fetched through HF_ENDPOINT."""
    endpoint, headers = endpoint_auth(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    opener = urllib.request.build_opener(_SameOriginAuth)
    out: dict[str, str] = {}
    for split in SPLITS:
        url = "/".join(
            [
                endpoint.rstrip("/"),
                "datasets",
                spec["repo"],
                "resolve",
                spec["revision"],
                spec["files"][split],
            ]
        )
        path = os.path.join(tmp, split + ".parquet")
        try:
            request = urllib.request.Request(url, headers=headers)
            with opener.open(request, timeout=60) as r, open(path, "wb") as fh:
                total = 0
                while True:
                    chunk = r.read(1 << 16)
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > MAX_BYTES:
                        raise Failure(f"{url} sends more than {MAX_BYTES >> 20} MiB: not GSM8K.", 1)
                    fh.write(chunk)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise Failure(
                redacted(f"cannot download {url}: {getattr(e, 'reason', e)}")
                + ". Set HF_ENDPOINT to a Hugging Face mirror that answers, or pass --from with local files.",
                1,
            ) from e
        out[split] = path
    return out


class Args(argparse.Namespace):
    out: str
    sources: list[str]
    limit: int


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for train.parquet and test.parquet")
    ap.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        help="local GSM8K files (a folder, or one file per split)",
    )
    ap.add_argument("--limit", type=int, default=0, help="keep the first N rows of each split")
    args = ap.parse_args(argv, namespace=Args())
    part = load_data(KEY, SHAPE)
    if part is None:
        return 2
    spec = cast(Spec, part)  # (load_data held it to SHAPE, which Spec spells)
    try:
        try:
            pa = cast(Arrow, importlib.import_module("pyarrow"))
            pq = cast(Parquet, importlib.import_module("pyarrow.parquet"))
        except ImportError:
            raise Failure(
                "pyarrow is not installed (it comes with verl's dependencies); run this inside the "
                "image or its environment.",
                2,
            ) from None
        if args.limit < 0:
            raise Failure("--limit must be >= 0.", 2)
        os.makedirs(args.out, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".gsm8k-", dir=args.out) as tmp:
            files = local_files(args.sources) if args.sources else download(spec, tmp)
            staged = []
            for split in SPLITS:
                raw = read_rows(files[split])
                if args.limit:
                    raw = raw[: args.limit]
                if not raw:
                    raise Failure(f"{files[split]} holds no rows.", 2)
                rows = [
                    row(spec, split, i, field(r, "question"), field(r, "answer")) for i, r in enumerate(raw)
                ]
                path = os.path.join(tmp, split + ".out.parquet")
                pq.write_table(pa.Table.from_pylist(rows), path)
                staged.append((path, os.path.join(args.out, split + ".parquet"), len(rows)))
            for src, dst, _ in staged:  # both files are complete before either is moved in
                os.replace(src, dst)
        print(", ".join(f"{os.path.basename(dst)}: {n} rows" for _, dst, n in staged) + f" -> {args.out}")
        return 0
    except Failure as e:
        print(redacted(f"prepare_gsm8k: {e}"), file=sys.stderr)
        return e.code
    except OSError as e:
        print(f"prepare_gsm8k: cannot write {args.out}: {e.strerror}.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
