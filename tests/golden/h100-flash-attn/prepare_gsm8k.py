#!/usr/bin/env python3
"""GSM8K in the parquet layout verl's RL dataset and its GSM8K reward read; rendered by envbuild
for profile h100.

  prepare_gsm8k.py --out DIR                 from the Hugging Face hub, through $HF_ENDPOINT
                                             (a mirror works; $HF_TOKEN is sent when set)
  prepare_gsm8k.py --out DIR --from PATH     from local files: PATH is a folder holding
                                             train/test .parquet or .jsonl files with the raw
                                             `question` and `answer` fields, or one such file
                                             per split: --from train.jsonl --from test.jsonl
  --limit N                                  keep the first N rows of each split

Writes DIR/train.parquet and DIR/test.parquet, both or neither. Exit 0 done, 1 the download
failed, 2 bad input.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request

SPEC = json.loads("{\"ability\": \"math\", \"answer_pattern\": \"#### (\\\\-?[0-9\\\\.\\\\,]+)\", \"data_source\": \"openai/gsm8k\", \"files\": {\"test\": \"main/test-00000-of-00001.parquet\", \"train\": \"main/train-00000-of-00001.parquet\"}, \"instruction\": \"Let\\u0027s think step by step and output the final answer after \\\"####\\\".\", \"name\": \"gsm8k\", \"repo\": \"openai/gsm8k\", \"revision\": \"main\", \"rows\": {\"test\": 1319, \"train\": 7473}, \"source\": \"hf_card, hf_files, verl_preprocess, verl_reward\"}")
SPLITS = ("train", "test")
MAX_BYTES = 256 * 1024 * 1024  # a GSM8K split is ~3 MB: anything this large is not it


class Failure(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def answer_of(text):
    """The final number of a GSM8K answer (or a model's response): the last `#### N`."""
    found = re.findall(SPEC["answer_pattern"], text or "")
    return found[-1].replace(",", "").replace("$", "") if found else None


def row(split, index, question, answer):
    truth = answer_of(answer)
    if not isinstance(question, str) or not question.strip() or truth is None:
        raise Failure(f"{split} row {index} has no question or no final '#### N' in its answer; "
                      "GSM8K rows have `question` and `answer` fields (pass the dataset's own "
                      "files).", 2)
    return {
        "data_source": SPEC["data_source"],
        "prompt": [{"role": "user", "content": question + " " + SPEC["instruction"]}],
        "ability": SPEC["ability"],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def read_rows(path):
    """[{question, answer}, ...] from a .parquet or .jsonl file."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise Failure(f"{path} is larger than {MAX_BYTES >> 20} MiB: not a GSM8K split.", 2)
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(path, columns=["question", "answer"]).to_pylist()
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except Failure:
        raise
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        raise Failure(f"cannot read {path}: {e}. Pass GSM8K's own parquet or jsonl files.", 2)
    except Exception as e:  # pyarrow's own errors (ArrowInvalid, ...)
        raise Failure(f"cannot read {path}: {type(e).__name__}: {e}. Pass GSM8K's own parquet "
                      "or jsonl files.", 2)


def local_files(sources):
    """{split: path} from --from arguments (a folder, or one file per split)."""
    found = {}
    for src in sources:
        if os.path.isdir(src):
            names = sorted(os.listdir(src))
            for split in SPLITS:
                hits = [n for n in names if n.startswith(split) and n.endswith((".parquet", ".jsonl"))]
                if hits and split not in found:
                    found[split] = os.path.join(src, hits[0])
        elif os.path.isfile(src):
            split = next((s for s in SPLITS if os.path.basename(src).startswith(s)), None)
            if split is None:
                raise Failure(f"{src}: a file's name must start with train or test.", 2)
            found[split] = src
        else:
            raise Failure(f"{src} does not exist.", 2)
    missing = [s for s in SPLITS if s not in found]
    if missing:
        raise Failure(f"no {' or '.join(missing)} file in {', '.join(sources)} (names starting "
                      "with train/test, ending .parquet or .jsonl).", 2)
    return found


def download(tmp):
    """{split: path} of the dataset's parquet files, fetched through HF_ENDPOINT."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    headers = {"User-Agent": "envbuild-prepare-gsm8k"}
    if os.environ.get("HF_TOKEN"):
        headers["Authorization"] = "Bearer " + os.environ["HF_TOKEN"]
    out = {}
    for split in SPLITS:
        url = "/".join([endpoint.rstrip("/"), "datasets", SPEC["repo"], "resolve",
                        SPEC["revision"], SPEC["files"][split]])
        path = os.path.join(tmp, split + ".parquet")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=60) as r, open(path, "wb") as fh:
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
            raise Failure(f"cannot download {url}: {getattr(e, 'reason', e)}. Set HF_ENDPOINT to "
                          "a Hugging Face mirror that answers, or pass --from with local files.", 1)
        out[split] = path
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for train.parquet and test.parquet")
    ap.add_argument("--from", dest="sources", action="append", default=[],
                    help="local GSM8K files (a folder, or one file per split)")
    ap.add_argument("--limit", type=int, default=0, help="keep the first N rows of each split")
    args = ap.parse_args(argv)
    try:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise Failure("pyarrow is not installed (it comes with verl's dependencies); run this "
                          "inside the image or its environment.", 2)
        if args.limit < 0:
            raise Failure("--limit must be >= 0.", 2)
        os.makedirs(args.out, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".gsm8k-", dir=args.out) as tmp:
            files = local_files(args.sources) if args.sources else download(tmp)
            staged = []
            for split in SPLITS:
                raw = read_rows(files[split])
                if args.limit:
                    raw = raw[:args.limit]
                if not raw:
                    raise Failure(f"{files[split]} holds no rows.", 2)
                rows = [row(split, i, r.get("question"), r.get("answer")) for i, r in enumerate(raw)]
                path = os.path.join(tmp, split + ".out.parquet")
                pq.write_table(pa.Table.from_pylist(rows), path)
                staged.append((path, os.path.join(args.out, split + ".parquet"), len(rows)))
            for src, dst, _ in staged:  # both files are complete before either is moved in
                os.replace(src, dst)
        print(", ".join(f"{os.path.basename(dst)}: {n} rows" for _, dst, n in staged)
              + f" -> {args.out}")
        return 0
    except Failure as e:
        print(f"prepare_gsm8k: {e}", file=sys.stderr)
        return e.code
    except OSError as e:
        print(f"prepare_gsm8k: cannot write {args.out}: {e.strerror}.", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
