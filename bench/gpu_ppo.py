#!/usr/bin/env python3
"""The rendered `run_ppo_gsm8k.sh` itself, on a GPU machine without network (the GPU tier).

verl's trainer (`python -m verl.trainer.main_ppo` through Ray, the vLLM async rollout server,
the FSDP actor/critic/reference workers) runs exactly as the rendered script starts it, on a
randomly initialised model of the profile's shape and GSM8K-shaped data, for a first
validation and two PPO steps. The record is the log, a timeline and nvidia-smi's memory.

  setup  --parts DIR --site DIR
         cat DIR/part-* | tar x, then pip install --no-deps --no-index --target SITE every wheel
         (sha256-checked against the bundle's SHA256SUMS first)
  run    --render DIR --site DIR --out OUTDIR --case NAME [--card-gib G] [--extra 'k=v ...']
         [--emulate] [--timeout S] [--train-rows N] [--val-rows N] [--work DIR]
         --emulate runs another card's profile: its preflight may refuse only the card's compute
         capability, and a copy of the render naming the device's runs
         writes OUTDIR/NAME.log (every line prefixed with seconds since launch) and
         OUTDIR/NAME.json (always, also on failure or timeout); NAME is a plain name, and WORK
         (default /tmp/envbuild-ppo/NAME) a new or empty folder or one this script made
         (bench/benchsafe.py's marker: it deletes only in its own folders; else exit 2)
         [--n-gpus G] GPUs a node, the run script's N_GPUS (default 1)
         [--nodes N --launcher FILE] N Ray nodes on this host (default 1: the script starts its
         own Ray). FILE is what `envbuild launch ray PROFILE --nodes N --gpus-per-node G
         --head-ip 127.0.0.1` printed for the render: its export lines and its `ray start` lines
         (bash expands them) start node i with GPUs i*G..(i+1)*G-1 (CUDA_VISIBLE_DEVICES), a
         temp dir and ports of its own (node_words) and NVLink multicast off (MULTICAST_OFF);
         once every GPU joined, the run script runs on the head with RAY_ADDRESS and NNODES,
         and at the end, also on timeout, the processes marked with the run's
         ENVBUILD_GPU_PPO_MARK (never found by name) are stopped. Exit 2 where G x N exceeds
         the GPUs nvidia-smi lists (or N does not divide them without --n-gpus), the render or
         the launcher is for another world, or there is no GPU and no --dry-run.
         [--dry-run] everything but the launch (and, with --nodes, Ray): the record's `layout`
         holds each node's command and environment; [--no-prepare] skips the model, the data,
         the patches and the audit (a dry run without torch, a stand-in run script)
         The record's smi.per_gpu holds each GPU's peak and per-phase peaks (smi.peak_mib and
         smi.phase_peak_mib: their sum, per nvidia-smi sweep) and its share of the plan's peak.
  selftest
         checks the log parser, the override diff, the card scaling, the per-GPU memory split
         and the launcher's parsing and node layout (no GPU, stdlib only)

Standard library only at the top level: the heavy imports (torch, transformers, tokenizers,
pyarrow) happen in child processes under PYTHONPATH=SITE (`make-model`, `make-data`).
"""

from __future__ import annotations

import argparse
import atexit
import glob
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections import deque

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import benchsafe  # noqa: E402  (bench/benchsafe.py: the folders it may delete, stdlib only)

SCRIPT = "gpu_ppo.py"  # (its folders' marker names it)
GIB = 1024**3

# ---------------------------------------------------------------------------------------------
# log parsing (pure)
# ---------------------------------------------------------------------------------------------

# first occurrence of each marker, in the order a healthy run prints them. verl 0.9.1:
# main_ppo.py prints "ray init kwargs"; v1/trainer_base.py logs (INFO, its default level) the
# engine/worker-group lines and "all initialize finished, ready to fit"; vllm_async_server.py
# logs "Initializing a V1 LLM engine with config" once the OpenAI server's state is built
# (engine loaded, compiled, CUDA graphs captured); vLLM itself prints "init engine (profile,
# create kv cache, warmup model) took"; the console logger prints "step:N - k:v - ...".
MARKERS = [
    ("ray_init", re.compile(r"ray init kwargs|Started a local Ray instance")),
    ("workers_ready", re.compile(r"actor and ref model engine initialized")),
    ("critic_ready", re.compile(r"critic model engine initialized")),
    ("rollout_start", re.compile(r"\(vLLMHttpServer pid=")),
    ("graph_capture", re.compile(r"Capturing CUDA graphs")),
    ("vllm_engine_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("rollout_ready", re.compile(r"Initializing a V1 LLM engine with config")),
    ("fit_ready", re.compile(r"all initialize finished, ready to fit")),
    ("validation_done", re.compile(r"Initial validation metrics|(?:^|[\s)])step:0 - ")),
    ("step1", re.compile(r"(?:^|[\s)])step:1 - ")),
    ("step2", re.compile(r"(?:^|[\s)])step:2 - ")),
    ("final_validation", re.compile(r"Final validation metrics")),
]
STEP_RE = re.compile(r"(?:^|[\s)])step:(\d+) - (.*)$")
# numpy 2 prints np.float64(0.5); pprint gives 0.5, nan, inf, True
NUM_WRAP = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")
MISSING_RE = re.compile(r"No module named '([\w.]+)'")
ERROR_RE = re.compile(
    r"(Traceback \(most recent call last\)|Error: |OutOfMemoryError|CUDA out of memory|"
    r"AssertionError|RayTaskError|ActorDiedError|Killed|Segmentation fault|core dumped)"
)


def parse_value(text):
    text = text.strip()
    m = NUM_WRAP.match(text)
    if m:
        text = m.group(1).strip()
    if text in ("True", "False"):
        return text == "True"
    try:
        if re.fullmatch(r"[-+]?\d+", text):
            return int(text)
        return float(text)  # also nan, inf
    except ValueError:
        return text


def parse_step_line(line):
    """(step, {key: value}) of verl's console metrics line, or None."""
    m = STEP_RE.search(line.rstrip("\n"))
    if not m:
        return None
    metrics = {}
    for seg in m.group(2).split(" - "):
        key, sep, value = seg.partition(":")
        if sep and key.strip():
            metrics[key.strip()] = parse_value(value)
    return int(m.group(1)), metrics


class LogWatch:
    """Feeds on log lines as they arrive: first time of each marker, per-step metrics, missing
    modules, the first error line and the tail."""

    def __init__(self, tail_lines=400):
        self.times = {}
        self.steps = {}
        self.missing = []
        self.first_error = None
        self.tail = deque(maxlen=tail_lines)
        self.lines = 0

    def feed(self, t, line):
        self.lines += 1
        self.tail.append(line.rstrip("\n"))
        for name, rx in MARKERS:
            if name not in self.times and rx.search(line):
                self.times[name] = round(t, 1)
        step = parse_step_line(line)
        if step is not None:
            self.steps.setdefault(str(step[0]), {}).update(step[1])
        for mod in MISSING_RE.findall(line):
            if mod not in self.missing:
                self.missing.append(mod)
        if self.first_error is None and ERROR_RE.search(line) and "DataLoader worker" not in line:
            self.first_error = {"t": round(t, 1), "line": line.strip()[:2000]}


# ---------------------------------------------------------------------------------------------
# the render's overrides (pure)
# ---------------------------------------------------------------------------------------------


def render_overrides(script_text):
    """{key: value} of the `args=( ... )` block of run_ppo_gsm8k.sh (keys without +/++)."""
    m = re.search(r"^args=\($(.*?)^\)$", script_text, re.S | re.M)
    out = {}
    if not m:
        return out
    for raw in m.group(1).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for word in words:
            key, sep, value = word.partition("=")
            if sep:
                out[key.lstrip("+")] = value
    return out


def override_changes(render, extras):
    """{key: {"render": old or None, "run": new}} for each extra whose value differs."""
    changes = {}
    for item in extras:
        key, sep, value = item.partition("=")
        if not sep:
            continue
        bare = key.lstrip("+~")
        old = render.get(bare)
        if old != value:
            changes[bare] = {"render": old, "run": value}
    return changes


def scaled_util(render_util, card_gib, device_total_gib):
    """vLLM's gpu_memory_utilization that takes on this device the bytes it would take on a
    card of card_gib (vLLM budgets util x total memory)."""
    return round(float(render_util) * float(card_gib) / float(device_total_gib), 4)


def phase_peaks(samples, times, end):
    """Peak MiB per window between markers: [(t, mib), ...] samples."""
    order = [
        "launch",
        "workers_ready",
        "rollout_start",
        "rollout_ready",
        "validation_done",
        "step1",
        "step2",
        "exit",
    ]
    marks = dict(times, launch=0.0, exit=end)
    pts = [(name, marks[name]) for name in order if marks.get(name) is not None]
    peaks = {}
    for (a, ta), (b, tb) in zip(pts, pts[1:]):
        vals = [m for t, m in samples if ta <= t <= tb]
        peaks[f"{a}->{b}"] = max(vals) if vals else None
    return peaks


# ---------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------


class _Parts:
    """The parts, read one after the other as one stream."""

    def __init__(self, paths):
        self.paths, self.fh = list(paths), None

    def read(self, n=-1):
        while True:
            if self.fh is None:
                if not self.paths:
                    return b""
                self.fh = open(self.paths.pop(0), "rb")
            data = self.fh.read(n)
            if data:
                return data
            self.fh.close()
            self.fh = None


def setup(parts_dir, site, work=None, force=False):
    t0 = time.time()
    parts = sorted(glob.glob(os.path.join(parts_dir, "part-*")))
    if not parts:
        print(f"setup: no part-* in {parts_dir}", file=sys.stderr)
        return 2
    work = work or os.path.join(os.path.dirname(os.path.abspath(site)), "bundle")
    benchsafe.claim(work, SCRIPT)  # (both before any work: a folder that is not its own is refused)
    benchsafe.claim(site, SCRIPT)
    marker = os.path.join(site, ".envbuild-setup.json")
    sizes = [os.path.getsize(p) for p in parts]
    if not force and os.path.exists(marker):
        try:
            if json.load(open(marker)).get("parts") == sizes:
                print(f"setup: {site} already holds this bundle ({len(parts)} parts); --force redoes it")
                return 0
        except (OSError, ValueError):
            pass
    benchsafe.empty(work, SCRIPT)
    with tarfile.open(fileobj=_Parts(parts), mode="r|") as tar:
        for member in tar:  # streaming: check each member as it comes
            path = os.path.realpath(os.path.join(work, member.name))
            if not path.startswith(os.path.realpath(work) + os.sep) or not (
                member.isfile() or member.isdir()
            ):
                print(f"setup: refusing archive member {member.name!r}", file=sys.stderr)
                return 2
            if hasattr(tarfile, "data_filter"):
                tar.extract(member, work, filter="data")
            else:
                tar.extract(member, work)
    t1 = time.time()
    wheels = sorted(glob.glob(os.path.join(work, "wheels", "*.whl")))
    sums = os.path.join(work, "SHA256SUMS")
    want = {}
    if os.path.isfile(sums):
        for line in open(sums):
            digest, _, name = line.strip().partition("  ")
            want[name] = digest
    if not want:
        print(
            f"setup: the bundle in {parts_dir} has no SHA256SUMS (or an empty one), so its wheels cannot be "
            "checked before they are installed; nothing was installed. Rebuild the parts with "
            "bench/gpu_bundle.py, which writes it.",
            file=sys.stderr,
        )
        return 2
    bad = []
    for whl in wheels:
        h = hashlib.sha256()
        with open(whl, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if want.get(os.path.basename(whl)) != h.hexdigest():
            bad.append(os.path.basename(whl))
    missing = sorted(set(want) - {os.path.basename(w) for w in wheels})
    if bad or missing:
        print(f"setup: bad wheels {bad}, missing {missing}: resend the parts", file=sys.stderr)
        return 1
    t2 = time.time()
    benchsafe.empty(site, SCRIPT)
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        "--no-compile",
        "--target",
        site,
        *wheels,
    ]
    has_pip = (
        subprocess.run([sys.executable, "-m", "pip", "--version"], env=env, capture_output=True).returncode
        == 0
    )
    if has_pip:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-5000:], file=sys.stderr)
            print(f"setup: pip install failed (rc={r.returncode})", file=sys.stderr)
            return 1
    else:  # no pip: a wheel is a zip of its import tree (no scripts, which the run does not need)
        print("setup: no pip for this python; unzipping the wheels into the site", file=sys.stderr)
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                for info in z.infolist():
                    path = os.path.realpath(os.path.join(site, info.filename))
                    if not path.startswith(os.path.realpath(site) + os.sep):
                        print(f"setup: refusing {info.filename!r} in {whl}", file=sys.stderr)
                        return 2
                    z.extract(info, site)
                    mode = info.external_attr >> 16
                    if mode & 0o111:
                        os.chmod(path, mode & 0o777)
    with open(marker, "w") as fh:
        json.dump({"parts": sizes, "wheels": [os.path.basename(w) for w in wheels]}, fh)
    print(
        f"setup: {len(parts)} parts, {len(wheels)} wheels -> {site}: untar {t1 - t0:.1f}s, "
        f"sha256 {t2 - t1:.1f}s, pip {time.time() - t2:.1f}s, total {time.time() - t0:.1f}s"
    )
    return 0


# ---------------------------------------------------------------------------------------------
# model, tokenizer and data (run in a child under PYTHONPATH=SITE)
# ---------------------------------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
NEWLINE_ID = 198  # Qwen2's own id for "\n" (byte 10 in GPT-2's byte-level order)
# Qwen2's pre-tokenizer (transformers 5 rebuilds it from the vocabulary whatever tokenizer.json says)
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def byte_chars():
    """GPT-2's byte-level alphabet in its vocabulary order (ids 0-255, as Qwen2 has them)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    mapping, n = {}, 0
    for b in range(256):
        if b in bs:
            mapping[b] = chr(b)
    for b in range(256):
        if b not in bs:
            mapping[b] = chr(256 + n)
            n += 1
    return [mapping[b] for b in bs] + [mapping[b] for b in range(256) if b not in bs]


def vocab_for(size):
    """Every id a token, as Qwen2's byte-level BPE: ids 0-255 the bytes ("\n" is 198), the
    specials at Qwen2's ids, and " abcd"-like words (decodable, never produced by encoding: no
    merges, so text encodes one token per byte) for every other id up to the model's vocabulary."""
    vocab = {c: i for i, c in enumerate(byte_chars())}
    letters = "abcdefghijklmnopqrstuvwxyz"
    n = 0
    for i in range(256, size):
        if i in SPECIALS.values():
            continue
        k, word = n, ""
        for _ in range(4):
            k, r = divmod(k, 26)
            word += letters[r]
        vocab["\u0120" + word] = i
        n += 1
    vocab.update(SPECIALS)
    return vocab


def make_model(arch, out, device=None):
    """A random bf16 Qwen2 of `arch`'s shape with a full-vocabulary byte-level BPE tokenizer
    (Qwen2's own pipeline, no merges: every id decodes, "\\n" is one token, id 198)."""
    import torch
    import transformers
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    marker = os.path.join(out, "envbuild-arch.json")
    if os.path.exists(marker) and json.load(open(marker)) == arch:
        print(f"make-model: {out} already holds this shape")
        return 0
    benchsafe.empty(out, SCRIPT)
    eos, pad = SPECIALS["<|im_end|>"], SPECIALS["<|endoftext|>"]
    cfg = transformers.Qwen2Config(
        vocab_size=arch["vocab_size"],
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=arch["layers"],
        num_attention_heads=arch["attention_heads"],
        num_key_value_heads=arch["kv_heads"],
        max_position_embeddings=arch.get("max_position_embeddings", 32768),
        tie_word_embeddings=arch["tied_embeddings"],
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    vocab = vocab_for(arch["vocab_size"])
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[],
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=arch.get("max_position_embeddings", 32768),
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    transformers.GenerationConfig(
        eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=pad, do_sample=True
    ).save_pretrained(out)
    # the checks verl 0.9's agent loop and vLLM's detokenizer rely on
    back = transformers.AutoTokenizer.from_pretrained(out)
    nl = back.encode("\n", add_special_tokens=False)
    assert len(nl) == 1, f'"\\n" is {nl}, not one token'
    assert back.convert_tokens_to_ids("<|im_end|>") == eos
    assert back.eos_token_id == eos and back.pad_token_id == pad
    assert len(back) == arch["vocab_size"], (len(back), arch["vocab_size"])
    text = back.apply_chat_template(
        [{"role": "user", "content": "w5000 12 ####"}], add_generation_prompt=True, tokenize=False
    )
    ids = back.encode(text, add_special_tokens=False)
    assert back.decode(ids) == text, (back.decode(ids), text)
    for probe in (0, 1, NEWLINE_ID, 5000, arch["vocab_size"] - 1):
        assert back.decode([probe]) != "", probe
    with open(marker, "w") as fh:
        json.dump(arch, fh)
    print(
        f"make-model: {n_params / 1e6:.1f}M params on {device} in {time.time() - t0:.1f}s, "
        f"tokenizer {len(back)} ids -> {out}"
    )
    return 0


WORDS = (
    "apples bakes bought cost day dollars each eggs farm friends gives hour hours john "
    "makes many market more much pays per sells she spends store the they total week"
).split()


def make_data(out, train, test, seed=0, words=18):
    """GSM8K-shaped raw train.jsonl/test.jsonl (question, answer '... #### N'). The byte-level
    tokenizer makes a token of each byte: ~110 bytes of question, with the instruction and
    the chat template ~200 prompt tokens (GSM8K's own run ~100-250 in Qwen2's tokenizer)."""
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        with open(os.path.join(out, f"{split}.jsonl"), "w") as fh:
            for i in range(n):
                a, b = rng.randint(2, 99), rng.randint(2, 99)
                q = " ".join(rng.choice(WORDS) for _ in range(words)).capitalize()
                q += f" with {a} and {b}. How many in total?"
                steps = " ".join(rng.choice(WORDS) for _ in range(12))
                ans = f"{steps} {a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"
                fh.write(json.dumps({"question": q, "answer": ans}) + "\n")
    print(f"make-data: {train} train, {test} test rows -> {out}")
    return 0


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------


def gpu_info():
    """name, total memory and driver of every GPU; compute_cap where the driver's nvidia-smi
    has that field (older ones do not: the rest still comes back)."""

    def query(fields):
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return [[c.strip() for c in line.split(",")] for line in r.stdout.strip().splitlines()]

    try:
        gpus = [
            {"name": n, "memory_total_mib": int(float(m)), "driver": d}
            for n, m, d in query("name,memory.total,driver_version")
        ]
    except (OSError, ValueError, subprocess.SubprocessError):
        return []
    try:
        caps = [row[0] for row in query("compute_cap")]
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        caps = []
    for g, cc in zip(gpus, caps):
        if re.fullmatch(r"\d+\.\d+", cc):
            g["compute_cap"] = cc
    return gpus


class SmiSeries:
    """nvidia-smi's `index, memory.used` lines as they come (pure): `samples`, the sum over every
    GPU of each sweep (a sweep starts at index 0; its time is the sweep's), and `per_gpu`, each
    GPU's own series at the same times. A line that does not parse is skipped."""

    def __init__(self):
        self.samples, self.per_gpu = [], {}
        self._t, self._total = None, 0

    def feed(self, line, t):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            return
        try:
            idx, used = int(parts[0]), int(float(parts[1]))
        except ValueError:
            return
        if idx == 0:
            if self._t is not None:
                self.samples.append((self._t, self._total))
            self._t, self._total = t, 0
        if self._t is None:  # (the tail of a sweep begun before the first index 0)
            return
        self._total += used
        self.per_gpu.setdefault(idx, []).append((self._t, used))


def per_gpu_peaks(per_gpu, times, end, plan_peak_gib=None):
    """{index: {peak_mib, baseline_mib, phase_peak_mib[, of_plan]}} of SmiSeries.per_gpu: each
    GPU's peak, first sample and peaks per phase (phase_peaks), and where the plan's per-GPU
    peak is known, the peak as a share of it (issue 49: within 1.1 on every GPU)."""
    out = {}
    for idx in sorted(per_gpu):
        series = per_gpu[idx]
        peak = max((m for _, m in series), default=None)
        one = {
            "peak_mib": peak,
            "baseline_mib": series[0][1] if series else None,
            "phase_peak_mib": phase_peaks(series, times, end),
        }
        if plan_peak_gib and peak is not None:
            one["of_plan"] = round(peak / (float(plan_peak_gib) * 1024), 3)
        out[str(idx)] = one
    return out


class SmiSampler(threading.Thread):
    """nvidia-smi memory.used of every GPU every 0.5 s (one long-running nvidia-smi), summed per
    sweep (`samples`) and per GPU (`per_gpu`), through SmiSeries."""

    def __init__(self, t0):
        super().__init__(daemon=True)
        self.t0, self.series, self.proc, self.error = t0, SmiSeries(), None, None

    @property
    def samples(self):
        return self.series.samples

    @property
    def per_gpu(self):
        return self.series.per_gpu

    def run(self):
        try:
            self.proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=index,memory.used",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "500",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for line in self.proc.stdout:
                self.series.feed(line, round(time.time() - self.t0, 1))
        except (OSError, ValueError) as e:
            self.error = str(e)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def versions(env):
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for n in ('torch','vllm','verl','transformers','tokenizers','ray','numpy','triton','pyarrow',"
        "'datasets','tensordict','accelerate','peft','hydra-core','transferqueue'):\n"
        "    try: out[n] = m.version(n)\n"
        "    except Exception as e: out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as e:
        return {"error": str(e)}


def _step(result, name, cmd, env, cwd, timeout):
    t = time.time()
    try:
        r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        rc, out = r.returncode, (r.stdout + r.stderr)
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"timed out after {timeout}s: {e}"
    except OSError as e:
        rc, out = 127, str(e)
    result["prepare"][name] = {"rc": rc, "seconds": round(time.time() - t, 1), "output": out[-3000:]}
    print(f"[{name}] rc={rc} in {time.time() - t:.1f}s {out.strip()[-300:]}", flush=True)
    return rc


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def _kill_tree(proc, pgid, grace=15):
    """SIGINT, SIGTERM, SIGKILL to the run's process group (start_new_session: pgid is the
    launcher's pid), each after `grace` seconds, until no process of the group is left: also
    after the launcher itself has exited (Ray workers and DataLoader workers stay behind)."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        if not _group_alive(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except OSError:
            return
        end = time.time() + wait
        while time.time() < end:
            if proc.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# several Ray nodes on one host (--nodes N): the launcher's own `ray start` words
# ---------------------------------------------------------------------------------------------

# The device keeps NVLink multicast off in NCCL, PyTorch and NVSHMEM (a program that uses it can
# take the host's GPUs out of service): every process the run starts, Ray's nodes and so their
# workers included, gets these, whatever the launcher or the caller's environment says.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
MARK_VAR = "ENVBUILD_GPU_PPO_MARK"  # in every Ray process's environment: the teardown's only key
NODE_FIXED_PORTS = 8  # a node's own ports before its worker range (node_words)
NODE_WORKER_PORTS = 400  # Ray's worker ports per node (verl: several actors and servers a GPU)
RAY_WAIT = 300  # seconds for every node's GPUs to join (as the launchers' ENVBUILD_RAY_WAIT)
SHELL_NOISE = {"PWD", "OLDPWD", "SHLVL", "_"}  # what bash itself sets in `env`
RAY_START_RE = re.compile(r"^ray\s+start\s+(.*)$")
HEAD_WORD_RE = re.compile(r"(?:^|\s)--head(?:\s|$)")


def parse_launcher(text):
    """`envbuild launch ray PROFILE --nodes N --head-ip IP` as printed, split (pure): `prelude`,
    the shell lines every node runs before `ray start` (HEAD_IP=, the exports, the interface and
    IMEX lines, comments left out); `head` and `worker`, the rest of the `ray start --head` and
    `ray start --address` lines as shell text; `run`, the line that starts the run script on the
    head. ValueError where the text is not that output."""
    prelude, head, worker, run = [], None, None, None
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = RAY_START_RE.match(s)
        if m:
            if HEAD_WORD_RE.search(m.group(1)):
                if head is not None:
                    raise ValueError("two `ray start --head` lines")
                head = m.group(1)
            else:
                if worker is not None:
                    raise ValueError("two `ray start --address` lines")
                worker = m.group(1)
        elif s.endswith("run_ppo_gsm8k.sh"):
            run = s
        else:
            prelude.append(line)
    if head is None:
        raise ValueError("no `ray start --head` line: not what `envbuild launch ray` prints")
    return {"prelude": prelude, "head": head, "worker": worker, "run": run}


def expand_launcher(parsed, env):
    """The launcher's lines as bash runs them with `env`: what its prelude exports (the
    variables that differ from env's), the head's and the other nodes' `ray start` words and the
    run line's NAME=VALUE assignments, each word as bash expands it. ValueError where bash fails
    (HEAD_IP unset: render the launcher with --head-ip)."""
    script = "\n".join(parsed["prelude"]) + "\n"
    script += f"head=({parsed['head']})\nworker=({parsed['worker'] or ''})\nrun=({parsed['run'] or ''})\n"
    script += (
        'printf "%s\\0" "${#head[@]}" "${head[@]}" "${#worker[@]}" "${worker[@]}" "${#run[@]}" "${run[@]}"\n'
    )
    script += "env -0\n"
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, timeout=30)
    if r.returncode != 0:
        raise ValueError(
            f"bash could not run the launcher's lines: {r.stderr.decode(errors='replace')[-500:]}"
        )
    fields = r.stdout.decode("utf-8", "replace").split("\0")
    out = {}
    for name in ("head", "worker", "run"):
        n = int(fields.pop(0))
        out[name], fields = fields[:n], fields[n:]
    exported = {}
    for item in fields:
        key, sep, value = item.partition("=")
        if sep and key not in SHELL_NOISE and env.get(key) != value:
            exported[key] = value
    assigns = {}
    for word in out["run"]:
        key, sep, value = word.partition("=")
        if not (sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)):
            break
        assigns[key] = value
    return {"exports": exported, "head": out["head"], "worker": out["worker"], "run_env": assigns}


def split_gpus(visible, nodes, per_node):
    """The GPU groups of `nodes` nodes on one host (pure): node i takes indexes i*per_node ..
    (i+1)*per_node - 1 of `visible` listed GPUs; per_node None takes visible / nodes. ValueError
    where they exceed what is listed or do not divide it."""
    if nodes < 1:
        raise ValueError(f"--nodes {nodes}: at least 1")
    if per_node is None:
        if visible % nodes:
            raise ValueError(f"{visible} GPUs do not divide into {nodes} equal nodes: pass --n-gpus")
        per_node = visible // nodes
    if per_node < 1:
        raise ValueError(f"{per_node} GPUs a node ({visible} listed, {nodes} nodes)")
    if per_node * nodes > visible:
        raise ValueError(
            f"--n-gpus {per_node} x --nodes {nodes} = {per_node * nodes} GPUs, but {visible} are listed"
        )
    return [list(range(i * per_node, (i + 1) * per_node)) for i in range(nodes)]


def node_words(i, base, temp_root):
    """The `ray start` words node i adds to the launcher's where several raylets share a host
    (pure): a temp dir and a block of ports of its own (its Ray agents and its workers), and
    --block (the harness holds each node's process)."""
    p = base + i * (NODE_FIXED_PORTS + NODE_WORKER_PORTS)
    w = p + NODE_FIXED_PORTS
    return [
        f"--temp-dir={temp_root}/{i}",
        f"--node-manager-port={p}",
        f"--object-manager-port={p + 1}",
        f"--dashboard-agent-listen-port={p + 2}",
        f"--dashboard-agent-grpc-port={p + 3}",
        f"--metrics-export-port={p + 4}",
        f"--runtime-env-agent-port={p + 5}",
        f"--min-worker-port={w}",
        f"--max-worker-port={w + NODE_WORKER_PORTS - 1}",
        "--block",
    ]


def _port_free(port):
    s = socket.socket()
    try:
        s.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port_block(size, start=20000):
    """The first of `size` consecutive TCP ports free now, from `start` up, below the kernel's
    ephemeral range (where no outgoing connection takes one before Ray binds it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            high = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    base = start
    while base + size <= high:
        if all(_port_free(p) for p in range(base, base + size)):
            return base
        base += size
    raise ValueError(f"no {size} free consecutive ports in {start}..{high}")


def _flag(words, name):
    """The value of --name=VALUE (or --name VALUE) in words, or None."""
    for k, w in enumerate(words):
        if w.startswith(f"--{name}="):
            return w.split("=", 1)[1]
        if w == f"--{name}" and k + 1 < len(words):
            return words[k + 1]
    return None


def plan_nodes(args, env, spec, visible, work):
    """The node layout of `--nodes N` (N > 1): the launcher's words expanded, the GPU groups, each
    node's `ray start` argv and environment (what differs from `env`). ValueError: refused."""
    if not args.launcher:
        raise ValueError(
            "--nodes above 1 needs --launcher FILE: what `envbuild launch ray` printed for the render"
        )
    with open(args.launcher) as fh:
        parsed = parse_launcher(fh.read())
    if parsed["worker"] is None:
        raise ValueError(f"{args.launcher} has no `ray start --address` line: it was printed for one node")
    words = expand_launcher(parsed, env)
    groups = split_gpus(visible, args.nodes, args.n_gpus)
    per_node = len(groups[0])
    cluster = spec.get("cluster") or {}
    world = (cluster.get("nodes"), cluster.get("gpus_per_node"))
    if world != (args.nodes, per_node):
        raise ValueError(
            f"the render is for {world[0]} node(s) x {world[1]} GPU(s), this run {args.nodes} x {per_node}: "
            "its batch sizes and trainer.nnodes follow the render's world"
        )
    for role in ("head", "worker"):
        got = _flag(words[role], "num-gpus")
        if got != str(per_node):
            raise ValueError(
                f"the launcher's {role} line declares --num-gpus={got}, this run {per_node} a node"
            )
    port = _flag(words["head"], "port")
    address = words["run_env"].get("RAY_ADDRESS")
    if not address or not port:
        raise ValueError("the launcher names no head port or RAY_ADDRESS for the run")
    exports = dict(words["exports"])
    notes = []
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if key in exports and not exports[key]:
            # no default route on this host: every node is on it, so loopback is their network
            exports[key] = "lo"
            notes.append(f"{key} came out empty (no default route): lo, since every node is on this host")
    base = args.ray_port_base or free_port_block(args.nodes * (NODE_FIXED_PORTS + NODE_WORKER_PORTS))
    temp_root = "/tmp/ebr-" + hashlib.sha256(os.path.abspath(work).encode()).hexdigest()[:10]
    marker = f"{args.case}-{os.getpid()}-{int(time.time())}"
    extra = shlex.split(args.ray_node_args or "")
    head_extra = shlex.split(args.ray_head_args or "")
    nodes = []
    for i, group in enumerate(groups):
        node_env = dict(exports)
        node_env.update(MULTICAST_OFF)
        node_env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, group)),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # (CUDA's indexes as nvidia-smi's)
                MARK_VAR: marker,
            }
        )
        launcher_words = words["head"] if i == 0 else words["worker"]
        nodes.append(
            {
                "node": i,
                "role": "head" if i == 0 else "worker",
                "gpus": group,
                "launcher_words": ["ray", "start", *launcher_words],
                "argv": [
                    "ray",
                    "start",
                    *launcher_words,
                    *extra,
                    *(head_extra if i == 0 else []),
                    *node_words(i, base, temp_root),
                ],
                "env": node_env,
                "temp_dir": f"{temp_root}/{i}",
            }
        )
    return {
        "nodes": args.nodes,
        "gpus_per_node": per_node,
        "visible_gpus": visible,
        "launcher": os.path.abspath(args.launcher),
        "launcher_exports": words["exports"],
        "notes": notes,
        "ray_address": address,
        "head_port": int(port),
        "port_base": base,
        "temp_root": temp_root,
        "marker": marker,
        "node_list": nodes,
    }


def ray_argv(argv, env):
    """`ray start ...` as this machine runs it: the ray script on PATH, else `python -m
    ray.scripts.scripts` (a site unzipped without pip has no scripts)."""
    exe = shutil.which("ray", path=env.get("PATH"))
    return ([exe] if exe else [sys.executable, "-m", "ray.scripts.scripts"]) + argv[1:]


def _state_session(pid):
    """The state and session id of `pid` (fields 3 and 6 of /proc/PID/stat, after the command's
    parentheses)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[3])


def marked_pids(marker, sessions=()):
    """This user's processes whose environment holds MARK_VAR=marker, or that are in one of
    `sessions` (each node's `ray start` began one: Ray's agents and workers stay in it, and a
    process that sets its title, as Ray's Python processes do, overwrites its /proc environ).
    Never found by name."""
    needle = f"{MARK_VAR}={marker}".encode()
    sessions = set(sessions)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            state, session = _state_session(name)
            if state in ("Z", "X"):  # (exited, not yet reaped: nothing to stop)
                continue
            if session in sessions:
                found.append(int(name))
                continue
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def stop_marked(marker, sessions=(), grace=10):
    """SIGTERM, then SIGKILL, to every process of the run's nodes (marked_pids: Ray's nodes, their
    workers and agents, the waiter), until none is left; what was found and what outlived it."""
    first = marked_pids(marker, sessions)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        for pid in marked_pids(marker, sessions):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        end = time.time() + wait
        while marked_pids(marker, sessions) and time.time() < end:
            time.sleep(0.2)
    return {"found": len(first), "left": marked_pids(marker, sessions)}


WAITER = """\
import json, sys, time
import ray
address, want, nodes, wait = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
deadline = time.monotonic() + wait
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
while True:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
    seen = {"nodes": len(alive), "gpus": gpus,
            "per_node": sorted([n.get("NodeManagerPort"), n.get("Resources", {}).get("GPU", 0)] for n in alive)}
    if gpus >= want and len(alive) >= nodes:
        print(json.dumps(seen), flush=True)
        break
    if time.monotonic() > deadline:
        print(json.dumps(seen), flush=True)
        sys.exit(1)
    time.sleep(2)
"""


def _tail(path, lines=40):
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return None


def start_nodes(layout, env, work, deadline, wait):
    """Starts every node of `layout` (`ray start ... --block`, each in a session of its own, its
    output in WORK/ray-node-I.log), the head first: the head must listen on its port, then every
    node's GPUs join (WAITER, within `wait` seconds and the run's deadline). Returns what it saw;
    an `error` where a node exited or the cluster did not form (the caller stops the marked)."""
    out = {"started": [], "logs": {}}
    benchsafe.empty(layout["temp_root"], SCRIPT)  # (its own: a folder of another is refused)
    layout["sessions"] = []
    t0 = time.time()
    procs = []
    for node in layout["node_list"]:
        log_path = os.path.join(work, f"ray-node-{node['node']}.log")
        out["logs"][str(node["node"])] = log_path
        argv = ray_argv(node["argv"], env)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                argv,
                env=dict(env, **node["env"]),
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        procs.append(proc)
        layout["sessions"].append(proc.pid)  # (start_new_session: its pid is its session's id)
        out["started"].append({"node": node["node"], "pid": proc.pid, "argv": argv})
        if node["role"] == "head":  # the others join its port: it must answer first
            while True:
                if proc.poll() is not None:
                    return dict(
                        out, error=f"ray start on the head exited ({proc.returncode}) before it listened"
                    )
                try:
                    socket.create_connection(("127.0.0.1", layout["head_port"]), timeout=2).close()
                    break
                except OSError:
                    pass
                if time.time() > min(deadline, t0 + wait):
                    return dict(out, error=f"the head did not listen on port {layout['head_port']} in time")
                time.sleep(1)
            out["head_listening_s"] = round(time.time() - t0, 1)
    want = layout["nodes"] * layout["gpus_per_node"]
    left = max(5.0, min(deadline, t0 + wait) - time.time())
    head_env = dict(env, **layout["node_list"][0]["env"])
    waiter = subprocess.Popen(  # (marked through head_env; a session of its own)
        [sys.executable, "-c", WAITER, layout["ray_address"], str(want), str(layout["nodes"]), str(left)],
        env=head_env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    layout["sessions"].append(waiter.pid)
    while waiter.poll() is None:
        dead = [n for n, p in zip(layout["node_list"], procs) if p.poll() is not None]
        if dead:
            waiter.kill()
            n = dead[0]
            return dict(
                out,
                error=f"ray start on node {n['node']} exited ({procs[n['node']].returncode}) before every GPU joined",
            )
        if time.time() > min(deadline, t0 + wait) + 60:
            waiter.kill()
            return dict(out, error="Ray did not report its nodes within a minute past the wait")
        time.sleep(1)
    stdout, stderr = waiter.communicate()
    try:
        out["seen"] = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        out["seen"] = None
    out["joined_s"] = round(time.time() - t0, 1)
    if waiter.returncode != 0:
        return dict(
            out,
            error=f"after {wait:.0f} s Ray did not see {want} GPUs on {layout['nodes']} nodes: "
            f"{out['seen']} {stderr.strip()[-800:]}",
        )
    return out


def run(args):
    t_start = time.time()
    deadline = t_start + args.timeout
    benchsafe.plain_name(args.case, "--case")  # (both before anything is written)
    work = benchsafe.claim(args.work or os.path.join("/tmp/envbuild-ppo", args.case), SCRIPT)
    render = os.path.abspath(args.render)
    if os.path.isdir(os.path.join(render, "h200")) and not os.path.exists(
        os.path.join(render, "envbuild.json")
    ):
        render = os.path.join(render, "h200")
    site = os.path.abspath(args.site)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, args.case + ".json")
    log_path = os.path.join(out_dir, args.case + ".log")
    result = {"case": args.case, "rc": None, "status": "starting", "render": render, "prepare": {}}

    def save():
        tmp = json_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
        os.replace(tmp, json_path)

    try:
        spec = json.load(open(os.path.join(render, "envbuild.json")))
        script = open(os.path.join(render, "run_ppo_gsm8k.sh")).read()
    except (OSError, ValueError) as e:
        result.update(status="bad-render", rc=2, error=str(e))
        save()
        return 2
    arch = dict(spec["memory"]["arch"])
    result["profile"] = spec.get("profile")
    result["model"] = spec["memory"].get("model")
    result["arch"] = arch
    result["plan"] = plan_memory(spec)
    render_ov = render_overrides(script)
    result["render_overrides"] = render_ov  # the whole plan as rendered: a replay compares it all

    env = dict(os.environ)
    env.update(
        PYTHONPATH=site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        PATH=os.path.join(site, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
        PYTHONUNBUFFERED="1",
        RAY_DEDUP_LOGS="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        WANDB_MODE="disabled",
    )
    result["versions"] = versions(env)
    gpus = gpu_info()
    result["gpus"] = gpus
    result["gpu"] = gpus[0]["name"] if gpus else None
    result["gpu_total_mib"] = gpus[0]["memory_total_mib"] if gpus else None
    result["driver"] = gpus[0]["driver"] if gpus else None
    n_gpus = args.n_gpus
    layout = None
    if args.nodes != 1:
        visible, assumed = args.assume_gpus or len(gpus), bool(args.assume_gpus)
        if not visible and args.dry_run:  # (a dry run on a machine without GPUs: as many as asked)
            visible, assumed = (n_gpus or 0) * args.nodes, True
        try:
            if not visible:
                raise ValueError("nvidia-smi lists no GPU: only --dry-run runs --nodes without GPUs")
            layout = plan_nodes(args, env, spec, visible, work)
        except (ValueError, OSError, subprocess.SubprocessError) as e:
            print(f"run: --nodes {args.nodes}: {e}", file=sys.stderr)
            result.update(status="bad-layout", rc=2, error=str(e))
            save()
            return 2
        layout["assumed_gpus"] = assumed
        n_gpus = layout["gpus_per_node"]
        result["layout"] = layout
    elif args.launcher:
        print(
            "run: --launcher is for --nodes above 1 (one node: the script starts its own Ray)",
            file=sys.stderr,
        )
        result.update(status="bad-layout", rc=2, error="--launcher without --nodes")
        save()
        return 2
    n_gpus = n_gpus or 1
    result.update(n_gpus=n_gpus, nodes=args.nodes, algorithm=(spec.get("algorithm") or {}).get("name"))

    # the run's overrides: two steps with a first validation, then --extra, then the card
    extras = ["trainer.total_training_steps=2", "trainer.val_before_train=True"]
    extras += shlex.split(args.extra or "")
    result["card_gib"] = args.card_gib
    if args.card_gib:
        total_mib = args.assume_total_mib or (gpus[0]["memory_total_mib"] if gpus else None)
        if not total_mib:
            result.update(status="no-gpu", rc=1, error="--card-gib needs nvidia-smi's total memory")
            save()
            return 1
        total_gib = total_mib / 1024
        render_util = float(render_ov.get("actor_rollout_ref.rollout.gpu_memory_utilization", 0.9))
        util = scaled_util(render_util, args.card_gib, total_gib)
        result["scaled_util"] = {"render": render_util, "run": util, "device_total_gib": round(total_gib, 2)}
        extras.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={util}")
    result["extra_overrides"] = extras
    result["overrides_changed"] = override_changes(render_ov, extras)

    # batch sizes after the overrides: data rows enough for two steps
    eff = dict(render_ov)
    for item in extras:
        k, _, v = item.partition("=")
        eff[k.lstrip("+~")] = v
    try:
        train_bs = int(eff.get("data.train_batch_size", "64"))
    except ValueError:
        train_bs = 64
    train_rows = args.train_rows or 2 * train_bs + 8
    val_rows = args.val_rows
    result["data_rows"] = {"train": train_rows, "test": val_rows}

    # model, data, patches
    model_dir = os.path.join(work, "model")
    raw_dir = os.path.join(work, "gsm8k-raw")
    data_dir = os.path.join(work, "data")
    benchsafe.remove_in(work, "data")  # (work is its own: claimed above)
    benchsafe.remove_in(work, "gsm8k-raw")
    save()
    steps = [
        (
            "make_model",
            [sys.executable, HERE, "make-model", "--arch", json.dumps(arch), "--out", model_dir],
            600,
        ),
        (
            "make_data",
            [
                sys.executable,
                HERE,
                "make-data",
                "--out",
                raw_dir,
                "--train",
                str(train_rows),
                "--test",
                str(val_rows),
            ],
            120,
        ),
        ("apply_patches", [sys.executable, os.path.join(render, "apply_patches.py"), "--site", site], 120),
        ("audit_precision", [sys.executable, os.path.join(render, "audit_precision.py")], 120),
    ]
    result["prepared"] = not args.no_prepare
    for name, cmd, limit in [] if args.no_prepare else steps:
        rc = _step(result, name, cmd, env, work, max(10, min(limit, deadline - time.time())))
        if rc != 0:
            result.update(status=f"{name}-failed", rc=rc, seconds=round(time.time() - t_start, 1))
            save()
            return 1
    if args.emulate:
        emulated = emulate(render, work, env, gpus)
        result["emulated"] = emulated
        if emulated.get("error"):
            result.update(status="emulate-failed", rc=1, seconds=round(time.time() - t_start, 1))
            save()
            return 1
        render = emulated["render"]
    result["script_exports"] = script_exports(script)
    if layout:
        # what the run script exports that no node's environment holds: Ray's workers inherit
        # their node's, not the script's (verl hands them none of the launching shell's)
        on_nodes = set(layout["node_list"][0]["env"])
        result["script_exports_not_on_nodes"] = sorted(set(result["script_exports"]) - on_nodes)
        for node in layout["node_list"]:
            shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(node["env"].items()))
            print(
                f"[node {node['node']} {node['role']}, GPUs {node['gpus']}] {shown} {shlex.join(node['argv'])}"
            )
    if args.dry_run:
        result.update(status="dry-run", rc=0)
        save()
        return 0

    run_env = dict(
        env,
        MODEL=model_dir,
        DATA_DIR=data_dir,
        GSM8K_FROM=raw_dir,
        ENVBUILD_HOME=render,
        N_GPUS=str(n_gpus),
    )
    run_env.update(MULTICAST_OFF)
    if layout:  # the script on the head, joining the cluster the launcher's words form
        run_env.update(layout["node_list"][0]["env"])
        run_env.update(RAY_ADDRESS=layout["ray_address"], NNODES=str(layout["nodes"]))
        result["status"] = "ray-starting"
        save()
        # an exception or SIGTERM on the way out of this run still stops its nodes (never by name)
        teardown = lambda: stop_marked(layout["marker"], layout.get("sessions", ()), grace=5)  # noqa: E731
        atexit.register(teardown)
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

        def untrap():
            atexit.unregister(teardown)
            signal.signal(signal.SIGTERM, previous)

        try:
            started = start_nodes(layout, env, work, deadline, args.ray_wait)
        except (OSError, benchsafe.Refused) as e:
            started = {"error": str(e)}
        result["ray_cluster"] = started
        if started.get("error"):
            result["ray_teardown"] = stop_marked(layout["marker"], layout.get("sessions", ()))
            untrap()
            result["ray_node_logs"] = {k: _tail(v) for k, v in started.get("logs", {}).items()}
            result.update(status="ray-failed", rc=1, seconds=round(time.time() - t_start, 1))
            save()
            print(f"[run] {args.case}: Ray's nodes: {started['error']}", file=sys.stderr, flush=True)
            return 1
        print(f"[run] Ray: {started.get('seen')} after {started.get('joined_s')} s", flush=True)
    cmd = ["bash", os.path.join(render, "run_ppo_gsm8k.sh"), *extras]
    result["command"] = " ".join(shlex.quote(c) for c in cmd)
    result["status"] = "running"
    save()
    watch = LogWatch()
    t0 = time.time()
    sampler = SmiSampler(t0)
    sampler.start()
    timed_out = False
    with open(log_path, "w", buffering=1) as log:
        log.write(f"# {result['command']}\n")
        proc = subprocess.Popen(
            cmd,
            env=run_env,
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        pgid = proc.pid  # a session of its own: its process group is its pid

        def reader():
            try:
                for raw in iter(proc.stdout.readline, b""):
                    t = time.time() - t0
                    line = raw.decode("utf-8", "replace")
                    log.write(f"+{t:7.1f} {line}" if line.endswith("\n") else f"+{t:7.1f} {line}\n")
                    watch.feed(t, line)
            except (OSError, ValueError):  # the log closed under a straggler
                pass

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        last_save = time.time()
        while True:
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.time() >= deadline:
                timed_out = True
                log.write(f"+{time.time() - t0:7.1f} # gpu_ppo: --timeout {args.timeout}s reached, killing\n")
                _kill_tree(proc, pgid)
                break
            if time.time() - last_save > 20:
                result.update(
                    timeline=dict(watch.times), steps=watch.steps, seconds=round(time.time() - t0, 1)
                )
                save()
                last_save = time.time()
        end = time.time() - t0
        _kill_tree(proc, pgid, grace=5)  # leftovers in the process group (Ray workers)
        th.join(timeout=10)
    sampler.stop()
    sampler.join(timeout=5)
    if layout:  # the nodes this run started, by their marker and sessions (never by name)
        result["ray_teardown"] = stop_marked(layout["marker"], layout.get("sessions", ()))
        untrap()
    else:  # Ray's own daemons can outlive the group: stop the cluster this run started
        try:
            subprocess.run(
                [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"],
                env=env,
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            pass
    rc = proc.returncode
    samples = sampler.samples
    times = dict(watch.times, exit=round(end, 1))
    result.update(
        rc=124 if timed_out else rc,
        status="timeout" if timed_out else ("ok" if rc == 0 else "failed"),
        seconds=round(end, 1),
        total_seconds=round(time.time() - t_start, 1),
        timeline=times,
        durations=_durations(times),
        steps=watch.steps,
        validation_metrics=watch.steps.get("0"),
        step_metrics={k: v for k, v in watch.steps.items() if k != "0"},
        missing_modules=watch.missing,
        first_error=watch.first_error,
        log_lines=watch.lines,
        smi={
            "peak_mib": max((m for _, m in samples), default=None),
            "baseline_mib": samples[0][1] if samples else None,
            "phase_peak_mib": phase_peaks(samples, watch.times, end),
            "per_gpu": per_gpu_peaks(sampler.per_gpu, watch.times, end, result["plan"].get("peak_gib")),
            "samples": len(samples),
            "series": [[t, m] for t, m in samples[:: max(1, len(samples) // 600)]],
            "error": sampler.error,
        },
    )
    if result["status"] != "ok" or not {"1", "2"} <= set(watch.steps):
        result["log_tail"] = "\n".join(watch.tail)
        if layout:
            result["ray_node_logs"] = {k: _tail(v) for k, v in result["ray_cluster"]["logs"].items()}
    save()
    print(
        f"[run] {args.case}: {result['status']} rc={result['rc']} in {end:.0f}s; timeline {times}; "
        f"peak {result['smi']['peak_mib']} MiB -> {json_path}",
        flush=True,
    )
    return 0 if result["status"] == "ok" else 1


PROFILE_CHECK = re.compile(r"GPU \d+ profile")


def emulate(render, work, env, gpus):
    """Run a profile's render on a bigger card of another compute capability: the render's own
    preflight runs first and may refuse only its card check (`GPU N profile`: rendered for CC X,
    running on CC Y); then a copy of the render whose sidecar names the device's compute
    capability, its one change, is what runs. Returns what was emulated, or an `error`."""
    out = {
        "device": gpus[0]["name"] if gpus else None,
        "device_cc": gpus[0].get("compute_cap") if gpus else None,
    }
    side_path = os.path.join(render, "envbuild-scripts.json")
    try:
        with open(side_path) as fh:
            sidecar = json.load(fh)
        out["profile_cc"] = sidecar["preflight"]["compute_capability"]
        out["profile_gpu"] = sidecar["preflight"]["gpu"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return dict(out, error=f"the render's sidecar {side_path}: {e}")
    if not out["device_cc"]:
        return dict(out, error="--emulate needs nvidia-smi's compute_cap")
    try:
        pf = subprocess.run(
            [sys.executable, os.path.join(render, "preflight.py"), "--json"],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        checks = json.loads(pf.stdout)["checks"]
    except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError) as e:
        return dict(out, error=f"the render's preflight gave no report: {e}")
    out["preflight_refused"] = [{"check": c["check"], "detail": c["detail"]} for c in checks if not c["ok"]]
    others = [c["check"] for c in out["preflight_refused"] if not PROFILE_CHECK.fullmatch(c["check"])]
    if others:
        return dict(out, error=f"preflight refused more than the card: {', '.join(others)}")
    copy = os.path.join(work, "render-emulated")
    try:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(render, copy)
        sidecar["preflight"]["compute_capability"] = out["device_cc"]
        with open(os.path.join(copy, "envbuild-scripts.json"), "w") as fh:
            json.dump(sidecar, fh, indent=1)
    except OSError as e:
        return dict(out, error=f"the render's copy {copy}: {e}")
    out["sidecar_changed"] = {"preflight.compute_capability": [out["profile_cc"], out["device_cc"]]}
    return dict(out, render=copy)


def plan_memory(spec):
    """The memory plan's per-GPU figures in envbuild.json (GiB): its peak, that peak's phase, and
    each phase's bytes, which a run's per-GPU peaks are held to."""
    mem = spec.get("memory") or {}
    peak = mem.get("peak") or {}
    phases = {}
    for ph in mem.get("phases") or []:
        if isinstance(ph, dict) and ph.get("phase") and isinstance(ph.get("bytes"), (int, float)):
            phases[ph["phase"]] = round(ph["bytes"] / GIB, 3)
    return {
        "peak_gib": peak.get("gib"),
        "peak_phase": peak.get("phase"),
        "phases_gib": phases,
        "rollout_tp": mem.get("rollout_tp"),
        "cluster": spec.get("cluster"),
    }


EXPORT_RE = re.compile(r"^export ([A-Z_][A-Z0-9_]*)=(.*)$", re.M)


def script_exports(script_text):
    """The environment the run script exports, as written (its defaults), by name."""
    return {k: v for k, v in EXPORT_RE.findall(script_text)}


def _durations(times):
    order = [
        "ray_init",
        "workers_ready",
        "graph_capture",
        "rollout_ready",
        "fit_ready",
        "validation_done",
        "step1",
        "step2",
        "final_validation",
        "exit",
    ]
    out, prev, prev_t = {}, "launch", 0.0
    for name in order:
        if times.get(name) is not None:
            out[f"{prev}->{name}"] = round(times[name] - prev_t, 1)
            prev, prev_t = name, times[name]
    return out


# ---------------------------------------------------------------------------------------------
# selftest
# ---------------------------------------------------------------------------------------------

SAMPLE_LOG = """\
ray init kwargs: {'num_cpus': None, 'runtime_env': {'env_vars': {'TOKENIZERS_PARALLELISM': 'true'}}}
(TaskRunner pid=4242) INFO:2026-12-04 10:00:00,000:actor and ref model engine initialized
(vLLMHttpServer pid=5151) INFO 12-04 10:01:00 [core.py:275] init engine (profile, create kv cache, warmup model) took 95.31 seconds
(vLLMHttpServer pid=5151) INFO:/x/vllm_async_server.py:Initializing a V1 LLM engine with config: model='/tmp/m'
(TaskRunner pid=4242) INFO:all initialize finished, ready to fit
(TaskRunner pid=4242) step:0 - val-aux/openai/gsm8k/reward/mean@1:np.float64(0.0) - val-core/openai/gsm8k/acc/mean@1:0.0
(TaskRunner pid=4242) step:1 - actor/pg_loss:np.float64(-0.0123) - critic/vf_loss:1.5e-05 - timing_s/gen:12.5 - perf/max_memory_allocated_gb:22.7 - response_length/mean:256.0 - training/global_step:1 - actor/entropy:nan - flag:True
(TaskRunner pid=4242) step:2 - timing_s/gen:9.1 - timing_s/step:10.25 - perf/max_memory_allocated_gb:22.71 - val-core/openai/gsm8k/acc/mean@1:0.0
(TaskRunner pid=4242) ("Final validation metrics: {'val-core/openai/gsm8k/acc/mean@1': "
ModuleNotFoundError: No module named 'flash_attn'
"""

SAMPLE_SCRIPT = """\
args=(
  algorithm.adv_estimator=gae
  data.train_files="$DATA_DIR/train.parquet"
  # a comment
  data.train_batch_size=1024
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  'trainer.logger=[console]'
  trainer.val_before_train=False
)
exec python3 -m verl.trainer.main_ppo "${args[@]}" "$@"
"""

SAMPLE_LAUNCHER = """\
# envbuild launch ray: h100 on 2 node(s) x 4 GPU(s) (NVIDIA H100), verl 0.9.1, gae, tcp
HEAD_IP=127.0.0.1
# 1. on every node, before `ray start` (Ray's workers inherit it; a value you export wins):
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}
iface=$(awk '$2 == "00000000" {print $1; exit}' /proc/net/route)  # the default route's interface
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$iface} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$iface}
# 2. on the head node:
ray start --head --node-ip-address="$HEAD_IP" --port=6379 --num-gpus=4 --disable-usage-stats
# 3. on each of the other 1 node(s):
ray start --address="$HEAD_IP":6379 --num-gpus=4 --disable-usage-stats
# 4. on the head, once `ray status` shows 8 GPUs; the image must be built for this run: envbuild build h100
RAY_ADDRESS="$HEAD_IP:6379" /opt/envbuild/run_ppo_gsm8k.sh
"""


def selftest():
    w = LogWatch()
    for i, line in enumerate(SAMPLE_LOG.splitlines(True)):
        w.feed(float(i), line)
    expect = {
        "ray_init": 0.0,
        "workers_ready": 1.0,
        "rollout_start": 2.0,
        "vllm_engine_ready": 2.0,
        "rollout_ready": 3.0,
        "fit_ready": 4.0,
        "validation_done": 5.0,
        "step1": 6.0,
        "step2": 7.0,
        "final_validation": 8.0,
    }
    assert w.times == expect, w.times
    s1 = w.steps["1"]
    assert s1["actor/pg_loss"] == -0.0123 and s1["critic/vf_loss"] == 1.5e-05, s1
    assert s1["timing_s/gen"] == 12.5 and s1["perf/max_memory_allocated_gb"] == 22.7, s1
    assert (
        s1["training/global_step"] == 1 and s1["flag"] is True and s1["actor/entropy"] != s1["actor/entropy"]
    )
    assert w.steps["0"]["val-aux/openai/gsm8k/reward/mean@1"] == 0.0, w.steps["0"]
    assert w.steps["2"]["timing_s/step"] == 10.25
    assert w.missing == ["flash_attn"], w.missing
    assert w.first_error and "flash_attn" in w.first_error["line"], w.first_error
    assert parse_step_line("no metrics here") is None
    assert parse_step_line("mystep:3 - a:1") is None
    ov = render_overrides(SAMPLE_SCRIPT)
    assert ov["data.train_batch_size"] == "1024" and ov["trainer.logger"] == "[console]", ov
    assert ov["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"] == "bf16", ov
    assert ov["data.train_files"] == "$DATA_DIR/train.parquet", ov
    ch = override_changes(
        ov,
        [
            "data.train_batch_size=64",
            "trainer.val_before_train=True",
            "trainer.total_training_steps=2",
            "algorithm.adv_estimator=gae",
        ],
    )
    assert ch == {
        "data.train_batch_size": {"render": "1024", "run": "64"},
        "trainer.val_before_train": {"render": "False", "run": "True"},
        "trainer.total_training_steps": {"render": None, "run": "2"},
    }, ch
    assert scaled_util(0.6, 24, 139.8) == round(0.6 * 24 / 139.8, 4)
    peaks = phase_peaks(
        [(0.5, 500), (1.5, 9000), (5.5, 20000), (6.5, 30000), (7.5, 100)],
        {"workers_ready": 1.0, "rollout_ready": 3.0, "validation_done": 5.0, "step1": 6.0, "step2": 7.0},
        9.0,
    )
    assert peaks["launch->workers_ready"] == 500 and peaks["validation_done->step1"] == 20000, peaks
    assert peaks["step1->step2"] == 30000 and peaks["step2->exit"] == 100, peaks
    # two GPUs' interleaved nvidia-smi lines: each GPU's own series, and their sum per sweep
    sm = SmiSeries()
    lines = [
        (0.2, "1, 7"),  # (a sweep's tail before the first index 0: skipped)
        (0.5, "0, 100"),
        (0.5, "1, 200"),
        (1.5, "0, 9000"),
        (1.5, "1, 300"),
        (5.5, "0, 400"),
        (5.5, "1, [N/A]"),  # (does not parse: skipped)
        (6.5, "0, 500"),
        (6.5, "1, 30000"),
        (7.5, "0, 600"),
    ]
    for t, line in lines:
        sm.feed(line + "\n", t)
    assert sm.samples == [(0.5, 300), (1.5, 9300), (5.5, 400), (6.5, 30500)], sm.samples
    assert sm.per_gpu == {
        0: [(0.5, 100), (1.5, 9000), (5.5, 400), (6.5, 500), (7.5, 600)],
        1: [(0.5, 200), (1.5, 300), (6.5, 30000)],
    }, sm.per_gpu
    marks = {"workers_ready": 1.0, "rollout_ready": 3.0, "validation_done": 5.0, "step1": 6.0, "step2": 7.0}
    pg = per_gpu_peaks(sm.per_gpu, marks, 9.0, plan_peak_gib=10)
    assert pg["0"]["peak_mib"] == 9000 and pg["1"]["peak_mib"] == 30000, pg
    assert pg["0"]["phase_peak_mib"]["workers_ready->rollout_ready"] == 9000, pg
    assert pg["1"]["phase_peak_mib"]["workers_ready->rollout_ready"] == 300, pg
    assert (
        pg["1"]["phase_peak_mib"]["step1->step2"] == 30000
        and pg["0"]["phase_peak_mib"]["step1->step2"] == 500
    )
    assert pg["1"]["phase_peak_mib"]["validation_done->step1"] is None, pg  # (its one sample did not parse)
    assert pg["0"]["of_plan"] == round(9000 / 10240, 3) and pg["1"]["baseline_mib"] == 200, pg
    # the launcher's text: the head's and the other nodes' `ray start` lines, what runs before them
    lp = parse_launcher(SAMPLE_LAUNCHER)
    assert (
        lp["head"] == '--head --node-ip-address="$HEAD_IP" --port=6379 --num-gpus=4 --disable-usage-stats'
    ), lp
    assert lp["worker"] == '--address="$HEAD_IP":6379 --num-gpus=4 --disable-usage-stats', lp
    assert lp["run"] == 'RAY_ADDRESS="$HEAD_IP:6379" /opt/envbuild/run_ppo_gsm8k.sh', lp
    assert lp["prelude"][0] == "HEAD_IP=127.0.0.1" and lp["prelude"][-1].startswith("export NCCL_SOCKET"), lp
    assert not any(line.lstrip().startswith("#") for line in lp["prelude"]), lp
    for bad in ("", "# only comments\nray start --address=x:1 --num-gpus=4\n"):
        try:
            parse_launcher(bad)
            raise AssertionError(f"parse_launcher took {bad!r}")
        except ValueError:
            pass
    assert split_gpus(8, 2, 4) == split_gpus(8, 2, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_gpus(8, 4, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]] and split_gpus(8, 2, 2) == [[0, 1], [2, 3]]
    for visible, nodes, per in ((6, 2, 4), (7, 2, None), (8, 0, 4), (0, 2, None)):
        try:
            split_gpus(visible, nodes, per)
            raise AssertionError(f"split_gpus took {visible} GPUs, {nodes} nodes, {per} each")
        except ValueError:
            pass
    w0, w1 = node_words(0, 20000, "/tmp/x"), node_words(1, 20000, "/tmp/x")
    ports = [[int(x.split("=")[1]) for x in w if x.split("=")[0].endswith("port")] for w in (w0, w1)]
    assert not set(ports[0]) & set(ports[1]) and max(ports[0]) < min(ports[1]), ports
    assert _flag(w0, "temp-dir") == "/tmp/x/0" and _flag(w1, "temp-dir") == "/tmp/x/1" and w0[-1] == "--block"
    assert _flag(w1, "max-worker-port") == str(20000 + 2 * (NODE_FIXED_PORTS + NODE_WORKER_PORTS) - 1), w1
    d = _durations({"ray_init": 1.0, "workers_ready": 70.0, "step1": 200.0, "exit": 300.0})
    assert d == {
        "launch->ray_init": 1.0,
        "ray_init->workers_ready": 69.0,
        "workers_ready->step1": 130.0,
        "step1->exit": 100.0,
    }, d
    v = vocab_for(151936)
    assert len(v) == 151936 and sorted(v.values()) == list(range(151936)), len(v)
    assert v["\u010a"] == NEWLINE_ID and v["<|im_end|>"] == 151645 and v["!"] == 0
    print("selftest: ok")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--parts", required=True)
    s.add_argument("--site", required=True)
    s.add_argument("--work", help="where the wheels are unpacked (default: beside SITE, bundle/)")
    s.add_argument("--force", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("--render", required=True, help="the rendered profile folder (holding envbuild.json)")
    r.add_argument("--site", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--case", required=True)
    r.add_argument("--card-gib", type=float, default=None)
    r.add_argument("--extra", default="", help="extra Hydra overrides, one string, shell words")
    r.add_argument(
        "--timeout",
        type=float,
        default=500,
        help="wall-clock seconds for everything (model, data, run); then the run is killed",
    )
    r.add_argument("--train-rows", type=int, default=0, help="default: 2 x train batch + 8")
    r.add_argument("--val-rows", type=int, default=300)
    r.add_argument(
        "--n-gpus",
        type=int,
        default=None,
        help="GPUs a node (N_GPUS of the run script); default 1, with --nodes the listed GPUs / N",
    )
    r.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="Ray nodes on this host, each --n-gpus GPUs of its own, started with --launcher's words "
        "(default 1: the run script starts its own Ray)",
    )
    r.add_argument(
        "--launcher",
        default=None,
        help="what `envbuild launch ray PROFILE --nodes N --head-ip 127.0.0.1` printed",
    )
    r.add_argument(
        "--ray-port-base", type=int, default=0, help="the nodes' own ports from here (default: a free block)"
    )
    r.add_argument("--ray-node-args", default="", help="more `ray start` words on every node, one string")
    r.add_argument("--ray-head-args", default="", help="more `ray start` words on the head only, one string")
    r.add_argument("--ray-wait", type=float, default=RAY_WAIT, help="seconds for every node's GPUs to join")
    r.add_argument(
        "--no-prepare",
        action="store_true",
        help="make no model or data and run no patches or audit (a dry run without torch, a stand-in script)",
    )
    r.add_argument("--work", default=None, help="model and data (default /tmp/envbuild-ppo/CASE)")
    r.add_argument("--dry-run", action="store_true", help="everything but the launch")
    r.add_argument(
        "--emulate",
        action="store_true",
        help="run a profile for another card (its preflight may refuse only the card's compute capability)",
    )
    r.add_argument("--assume-total-mib", type=int, default=0, help=argparse.SUPPRESS)  # (tests without a GPU)
    r.add_argument("--assume-gpus", type=int, default=0, help=argparse.SUPPRESS)  # (tests without a GPU)
    m = sub.add_parser("make-model")
    m.add_argument("--arch", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--device", default=None)
    d = sub.add_parser("make-data")
    d.add_argument("--out", required=True)
    d.add_argument("--train", type=int, required=True)
    d.add_argument("--test", type=int, required=True)
    sub.add_parser("selftest")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "setup":
            return setup(args.parts, args.site, args.work, args.force)
        if args.cmd == "run":
            return run(args)
        if args.cmd == "make-model":
            return make_model(json.loads(args.arch), args.out, args.device)
    except benchsafe.Refused as e:
        print(f"{args.cmd}: {e}", file=sys.stderr)
        return 2
    if args.cmd == "make-data":
        return make_data(args.out, args.train, args.test)
    return selftest()


if __name__ == "__main__":
    sys.exit(main())
