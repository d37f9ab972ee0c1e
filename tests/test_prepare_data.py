"""The rendered prepare_gsm8k.py: GSM8K from a Hugging Face endpoint (a loopback mirror here) or
from local files, into the parquet layout verl reads; and the run script that calls it when the
data is missing. The real tier checks the rows against verl's own GSM8K reward function."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import resolved
from envbuilder.render.files import render_files, write_dir
from envbuilder.render.context import BuildContext
from httpfixtures import FileServer

TRAIN = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
        "<<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
        "babysitting. How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned "
        "0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    },
    {
        "question": "A shop sold 1,200 apples on Monday and 1,250 on Tuesday. How many in total?",
        "answer": "1200 + 1250 = <<1200+1250=2450>>2450\n#### 2,450",
    },
]
TEST = [
    {
        "question": "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning "
        "and bakes muffins for her friends every day with four. She sells the remainder "
        "at the farmers' market daily for $2 per fresh duck egg. How much in dollars does "
        "she make every day at the farmers' market?",
        "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = "
        "$<<9*2=18>>18 every day at the farmer's market.\n#### 18",
    },
    {
        "question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many "
        "bolts in total does it take?",
        "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is "
        "2+1=<<2+1=3>>3 bolts of fabric\n#### 3",
    },
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("render") / "p40"
    write_dir(out, render_files(BuildContext.of(resolved("p40"))))
    return out


def run(script: Path, *args, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GSM8K_"))}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True, env=full, timeout=120
    )


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def parquet_bytes(rows: list[dict], tmp: Path) -> bytes:
    path = tmp / "x.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


def read(out: Path, split: str) -> list[dict]:
    return pq.read_table(out / f"{split}.parquet").to_pylist()


def test_local_jsonl_becomes_verls_layout(rendered, tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    write_jsonl(src / "train.jsonl", TRAIN)
    write_jsonl(src / "test.jsonl", TEST)
    r = run(rendered / "prepare_gsm8k.py", "--out", tmp_path / "data", "--from", src)
    assert r.returncode == 0, r.stderr
    train = read(tmp_path / "data", "train")
    assert len(train) == 3 and len(read(tmp_path / "data", "test")) == 2
    first = train[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["prompt"] == [
        {
            "role": "user",
            "content": TRAIN[0]["question"] + " Let's think "
            'step by step and output the final answer after "####".',
        }
    ]
    assert first["reward_model"] == {"style": "rule", "ground_truth": "72"}
    assert first["extra_info"]["split"] == "train" and first["extra_info"]["index"] == 0
    assert train[2]["reward_model"]["ground_truth"] == "2450"  # commas dropped, as verl does


def test_the_hub_path_goes_through_hf_endpoint_so_a_mirror_serves_it(rendered, tmp_path):
    base = "datasets/openai/gsm8k/resolve/main/main/"
    files = {
        base + "train-00000-of-00001.parquet": parquet_bytes(TRAIN, tmp_path),
        base + "test-00000-of-00001.parquet": parquet_bytes(TEST, tmp_path),
    }
    with FileServer(files) as srv:
        r = run(
            rendered / "prepare_gsm8k.py",
            "--out",
            tmp_path / "data",
            "--limit",
            "2",
            env={"HF_ENDPOINT": srv.url("").rstrip("/"), "HF_TOKEN": "hf_secret"},
        )
        auth = [q.authorization for q in srv.log]
    assert r.returncode == 0, r.stderr
    assert len(read(tmp_path / "data", "train")) == 2  # --limit
    assert read(tmp_path / "data", "test")[1]["reward_model"]["ground_truth"] == "3"
    assert auth and all(a == "Bearer hf_secret" for a in auth)


def test_an_endpoint_that_does_not_answer_is_exit_1_and_writes_nothing(rendered, tmp_path):
    from httpfixtures import free_port

    r = run(
        rendered / "prepare_gsm8k.py",
        "--out",
        tmp_path / "data",
        env={"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"},
    )
    assert r.returncode == 1
    assert "cannot download" in r.stderr and "HF_ENDPOINT" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == []


def test_rows_without_a_final_answer_are_bad_input_and_nothing_is_half_written(rendered, tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    write_jsonl(src / "train.jsonl", TRAIN)
    write_jsonl(src / "test.jsonl", [{"question": "q?", "answer": "no final number here"}])
    r = run(rendered / "prepare_gsm8k.py", "--out", tmp_path / "data", "--from", src)
    assert r.returncode == 2 and "test row 0" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == []  # not even train


def test_a_file_that_is_not_data_is_exit_2(rendered, tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    (src / "train.parquet").write_bytes(b"\xff\xfenot parquet")
    write_jsonl(src / "test.jsonl", TEST)
    r = run(rendered / "prepare_gsm8k.py", "--out", tmp_path / "data", "--from", src)
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_the_run_script_prepares_missing_data_then_launches(rendered, tmp_path):
    """The real run script, with `python3` a stub that runs the rendered scripts for real (from
    ENVBUILD_HOME) and records the trainer's arguments instead of training."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    record = tmp_path / "trainer-args.json"
    stub = bin_ / "python3"
    stub.write_text(f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if args[:2] == ["-m", "verl.trainer.main_ppo"]:
    open({str(record)!r}, "w").write(json.dumps(args[2:]))
    sys.exit(0)
if args and args[0].endswith("preflight.py"):
    sys.exit(0)
os.execv({sys.executable!r}, [{sys.executable!r}] + args)
""")
    stub.chmod(0o755)
    src = tmp_path / "raw data"  # a space in the path survives the script's quoting
    src.mkdir()
    write_jsonl(src / "train.jsonl", TRAIN)
    write_jsonl(src / "test.jsonl", TEST)
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GSM8K_"))}
    env.update(
        PATH=f"{bin_}:{env['PATH']}", DATA_DIR=str(data), ENVBUILD_HOME=str(rendered), GSM8K_FROM=str(src)
    )
    r = subprocess.run(
        ["bash", str(rendered / "run_ppo_gsm8k.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "preparing it from" in r.stderr
    assert len(read(data, "train")) == 3
    args = json.loads(record.read_text())
    assert f"data.train_files={data}/train.parquet" in args


@pytest.mark.pypi
def test_verls_own_gsm8k_reward_scores_the_prepared_rows(rendered, tmp_path, real_pypi):
    """The ground truths are what verl's reward compares against: a right answer in the format
    the instruction asks for scores 1.0, a wrong one 0, with verl 0.4.1's own compute_score."""
    import zipfile

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--index-url",
            real_pypi,
            "-d",
            tmp_path,
            "verl==0.4.1",
        ],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
            "PIP_CONFIG_FILE": os.devnull,
        },
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("verl-0.4.1-*.whl"))
    source = zipfile.ZipFile(wheel).read("verl/utils/reward_score/gsm8k.py").decode()
    scope: dict = {}
    exec(compile(source, "verl/utils/reward_score/gsm8k.py", "exec"), scope)
    src = tmp_path / "raw"
    src.mkdir()
    write_jsonl(src / "train.jsonl", TRAIN)
    write_jsonl(src / "test.jsonl", TEST)
    assert run(rendered / "prepare_gsm8k.py", "--out", tmp_path / "d", "--from", src).returncode == 0
    for row, raw in zip(read(tmp_path / "d", "train"), TRAIN):
        truth = row["reward_model"]["ground_truth"]
        final = raw["answer"].rsplit("####", 1)[1].strip()
        assert scope["compute_score"](f"Reasoning...\n#### {final}", truth) == 1.0
        assert scope["compute_score"]("#### 99999", truth) == 0


def test_hf_token_goes_only_to_the_endpoints_own_host_across_redirects(rendered, tmp_path):
    """A mirror that redirects to a CDN on another host (here: another port) gets the token; the
    CDN does not (urllib's own handler forwards Authorization wherever it is sent)."""
    from faultserver import FaultServer

    base = "datasets/openai/gsm8k/resolve/main/main/"
    names = [base + "train-00000-of-00001.parquet", base + "test-00000-of-00001.parquet"]
    blobs = [parquet_bytes(TRAIN, tmp_path), parquet_bytes(TEST, tmp_path)]
    with FileServer({f"cdn/{n}": b for n, b in zip(names, blobs)}) as cdn:
        with FaultServer({}) as mirror:
            mirror.script = {n: [("redirect", cdn.url(f"cdn/{n}"))] for n in names}
            r = run(
                rendered / "prepare_gsm8k.py",
                "--out",
                tmp_path / "data",
                env={"HF_ENDPOINT": mirror.url("").rstrip("/"), "HF_TOKEN": "hf_secret"},
            )
            sent_mirror = [q.authorization for q in mirror.log]
        sent_cdn = [q.authorization for q in cdn.log]
    assert r.returncode == 0, r.stderr
    assert sent_mirror and all(a == "Bearer hf_secret" for a in sent_mirror)
    assert len(sent_cdn) == 2 and sent_cdn == [None, None]


def test_an_endpoints_password_is_sent_as_basic_auth_and_never_printed(rendered, tmp_path):
    """HF_ENDPOINT=http://user:password@mirror: the password (with a raw '@') goes to the mirror
    as Basic auth, and a failure names the endpoint without it."""
    import base64

    base = "datasets/openai/gsm8k/resolve/main/main/"
    files = {
        base + "train-00000-of-00001.parquet": parquet_bytes(TRAIN, tmp_path),
        base + "test-00000-of-00001.parquet": parquet_bytes(TEST, tmp_path),
    }
    password = "Re@Tail77:x!"
    with FileServer(files) as srv:
        endpoint = srv.url("").rstrip("/").replace("://", f"://alice:{password}@")
        r = run(rendered / "prepare_gsm8k.py", "--out", tmp_path / "data", env={"HF_ENDPOINT": endpoint})
        sent = [q.authorization for q in srv.log]
    assert r.returncode == 0, r.stderr
    assert "Tail77" not in r.stdout + r.stderr
    want = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    assert sent and all(a == want for a in sent)
    # a mirror that does not answer: exit 1, the endpoint named as ***@
    from httpfixtures import free_port

    r = run(
        rendered / "prepare_gsm8k.py",
        "--out",
        tmp_path / "data2",
        env={"HF_ENDPOINT": f"http://alice:{password}@127.0.0.1:{free_port()}"},
    )
    assert r.returncode == 1 and "cannot download http://127.0.0.1:" in r.stderr, r.stderr  # (bare)
    assert "Tail77" not in r.stdout + r.stderr and "Traceback" not in r.stderr
