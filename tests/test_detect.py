"""detect and doctor on recorded machines: NVML fakes and nvidia-smi outputs from tests/fixtures/gpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import envbuilder.cli.machine  # noqa: F401  (registers detect and doctor)
from conftest import frozen, place_script
from envbuilder.model import matrix
from envbuilder.cli import cli, main
from envbuilder.machine.detect import (
    QUERY,
    QUERY_NO_CC,
    Gpu,
    Machine,
    detect,
    match_model,
    parse_cuda_version,
    recommend,
)
from envbuilder.machine.doctor import Engine, Probes, buildkit_check, doctor, image_gb
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext
from envbuilder.model.resolve import Overrides, resolve

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"
GB = 10**9


@pytest.fixture(scope="module")
def m():
    """detect's and doctor's logic on the frozen fixture matrix: a matrix update changes none of
    these; the CLI tests below read the shipped one (what a user's envbuild says)."""
    return frozen()


# -- the recorded machines -------------------------------------------------------------------


class FakeNVML:
    """Just the pynvml calls detect makes, answering with a machine's recorded nvml.json."""

    class NVMLError(Exception):
        pass

    def __init__(self, box: str):
        self.rec = json.loads((FIXTURES / box / "nvml.json").read_text())

    def nvmlInit(self):
        if "init_error" in self.rec:
            raise self.NVMLError(self.rec["init_error"])

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return self.rec["driver"]

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self.rec["cuda_driver_version"]

    def nvmlDeviceGetCount(self):
        return len(self.rec["gpus"])

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.rec["gpus"][i]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return tuple(h["compute_capability"])

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Memory", (), {"total": h["memory_total"]})()


NO_NVML = FakeNVML("no-driver")  # forces the nvidia-smi fallback


def smi(box: str, docker: dict | None = None):
    """A command runner answering nvidia-smi (and docker) as the recorded machine did."""
    d = FIXTURES / box

    def run(argv):
        argv = tuple(argv)
        if argv[0] != "nvidia-smi":
            if docker is None or argv not in docker:
                raise FileNotFoundError(argv[0])
            rc, out = docker[argv]
            return subprocess.CompletedProcess(argv, rc, out, "")
        if (d / "nvidia-smi-error.txt").exists():
            return subprocess.CompletedProcess(argv, 9, (d / "nvidia-smi-error.txt").read_text(), "")
        if not (d / "nvidia-smi.txt").exists():
            raise FileNotFoundError("nvidia-smi")
        if argv == QUERY and (d / "query-error.txt").exists():
            return subprocess.CompletedProcess(argv, 2, (d / "query-error.txt").read_text(), "")
        file = {QUERY: "query.csv", QUERY_NO_CC: "query-no-cc.csv", ("nvidia-smi",): "nvidia-smi.txt"}[argv]
        return subprocess.CompletedProcess(argv, 0, (d / file).read_text(), "")

    return run


BOXES = ["p40", "4090", "mixed", "h200", "old-driver"]


@pytest.mark.parametrize("box", BOXES)
def test_nvml_and_nvidia_smi_read_the_same_machine(m, box):
    via_nvml = detect(m, FakeNVML(box), smi(box))
    via_smi = detect(m, NO_NVML, smi(box))
    assert (via_nvml.via, via_smi.via) == ("nvml", "nvidia-smi")
    assert via_nvml._replace(via="") == via_smi._replace(via="")


def test_real_h200_is_read_as_the_matrix_h200(m):
    machine = detect(m, FakeNVML("h200"), smi("h200"))
    assert machine == Machine((Gpu(0, "NVIDIA H200", "9.0", 143771, "h200"),), "580.159.04", "13.0", "nvml")


def test_old_driver_without_compute_cap_takes_the_cc_from_the_matrix(m):
    machine = detect(m, NO_NVML, smi("old-driver"))
    assert machine.gpus == (Gpu(0, "NVIDIA A100-SXM4-80GB", "8.0", 81251, "a100"),)
    assert (machine.driver, machine.cuda) == ("470.82.01", "11.4")


def test_no_driver_is_an_answer(m):
    machine = detect(m, FakeNVML("no-driver"), smi("no-driver"))
    assert machine.gpus == ()
    assert machine.problem == "NVML: NVML Shared Library Not Found; nvidia-smi: not found on PATH"
    assert recommend(m, machine).notes == (f"no NVIDIA GPU found: {machine.problem}",)


def test_driver_not_loaded_says_what_nvidia_smi_said(m):
    machine = detect(m, FakeNVML("driver-not-loaded"), smi("driver-not-loaded"))
    assert machine.problem.startswith(
        "NVML: Driver Not Loaded; nvidia-smi: NVIDIA-SMI has failed "
        "because it couldn't communicate with the NVIDIA driver."
    )


def test_hanging_nvidia_smi_is_an_answer(m):
    def hang(argv):
        raise subprocess.TimeoutExpired(argv, 30)

    assert detect(m, NO_NVML, hang).problem.endswith("nvidia-smi: no answer within 30 s")


def test_real_pynvml_without_a_driver_gives_the_recorded_error(m):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError as e:
        assert str(e) in {
            json.loads((FIXTURES / b / "nvml.json").read_text())["init_error"]
            for b in ("no-driver", "driver-not-loaded")
        }
    assert detect(m, pynvml, smi("no-driver")).gpus == ()


@pytest.mark.parametrize(
    "name, model",
    [
        ("Tesla P40", "p40"),
        ("NVIDIA GeForce RTX 4090", "4090"),
        ("NVIDIA H200", "h200"),
        ("Tesla T4", "t4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA RTX A6000", None),
    ],
)
def test_names_map_to_the_matrix_models(m, name, model):
    assert match_model(m, name) == model


@pytest.mark.parametrize(
    "box, cuda", [("p40", "12.2"), ("4090", "12.4"), ("h200", "13.0"), ("old-driver", "11.4")]
)
def test_cuda_version_from_the_nvidia_smi_header(box, cuda):
    assert parse_cuda_version((FIXTURES / box / "nvidia-smi.txt").read_text()) == cuda


# -- the recommendation ----------------------------------------------------------------------


def test_p40_box_gets_p40_and_why(m):
    rec = recommend(m, detect(m, FakeNVML("p40")))
    assert rec.profile == "p40"
    peak = resolve(m, "p40").memory["peak"]
    assert [r.line() for r in rec.fits[0].reasons] == [
        "Tesla P40 is the matrix's p40, the GPU of profile p40 \u2713",
        "driver 535.183.01 supports CUDA 12.2; profile p40 needs CUDA 11.8 (>= 520.61.05) \u2713",
        "a newer driver adds nothing: no newer stack resolves on this card",
        "torch 2.6.0+cu118 has sm_60 which runs on CC 6.1 \u2713",
        f"Qwen/Qwen2.5-0.5B-Instruct peaks at {peak['gib']:.1f} GiB ({peak['phase']}) of 21.9 GiB usable \u2713",
    ]


def test_4090_box_gets_4090(m):
    assert recommend(m, detect(m, FakeNVML("4090"))).profile == "4090"


def test_mixed_box_fits_the_weakest_gpu(m):
    rec = recommend(m, detect(m, FakeNVML("mixed")))
    assert (rec.gpu.name, rec.profile) == ("Tesla T4", "t4")
    assert "the profile must fit the weakest, GPU 1 Tesla T4 (CC 7.5, 15 GB)" in rec.notes[0]


def test_h200_box_gets_h200_and_the_gpu_count_note(m):
    rec = recommend(m, detect(m, FakeNVML("h200")))
    assert rec.profile == "h200"
    assert rec.notes == (
        "profile h200 trains on 8 GPUs and this machine has 1: planned for 1 (`envbuild check h200 "
        "--gpus-per-node 1 --model Qwen/Qwen2.5-1.5B-Instruct`)",
    )


def test_driver_too_old_fits_nothing_and_says_the_fix(m):
    rec = recommend(m, detect(m, FakeNVML("old-driver")))
    assert rec.profile is None
    [fit] = rec.fits
    assert fit.profile == "a100" and not fit.ok
    assert "driver 470.82.01 is too old for CUDA 12.8: CUDA 12.8 needs >= 570.124.06" in fit.reasons[1].text
    # no --cuda to suggest: torch 2.8.0 has no build for a CUDA this driver runs; and planned
    # for the one GPU it has, the profile's 7B model needs another fix too
    assert fit.fixes[0] == "upgrade the driver to >= 570.124.06"
    assert [f for f in fit.fixes[1:] if "--model" in f] == list(fit.fixes[1:])


def test_unknown_gpu_gets_the_closest_profile_of_its_family(m):
    machine = Machine((Gpu(0, "NVIDIA RTX A6000", "8.6", 49140),), "550.54.14", "12.4", "nvml")
    rec = recommend(m, machine)
    assert rec.profile == "3090"
    assert [f.profile for f in rec.fits] == ["3090", "a100"]  # CC 8.6 first, then 8.0
    assert "not in the matrix" in rec.fits[0].reasons[0].text
    assert "minor-version compatibility" in rec.fits[0].reasons[1].text  # 550 runs CUDA 12.8 so


# -- the CLI ---------------------------------------------------------------------------------


def invoke(args, probes):
    """Run the CLI with recorded probes; the exit code main() would give."""
    r = CliRunner().invoke(cli, args, obj=probes)
    code = getattr(r.exception, "exit_code", r.exit_code) if r.exception else r.exit_code
    return code, r.output


def recorded_network(down: dict | None = None):
    """A stand-in for the network probes (mirrors.probe's answers, no traffic): every endpoint
    answers, except the kinds in `down` ({kind: what the probe met})."""
    from envbuilder.oci.probe import Probe

    def probe(body):
        jobs = [("registry", reg, e) for reg, eps in body.get("registries", {}).items() for e in eps]
        jobs += [(k, k, e) for k in ("pypi", "pytorch", "github") for e in body.get(k) or []]
        return [
            Probe(k, t, e, k not in (down or {}), (down or {}).get(k, "HTTP 200"), 12.0) for k, t, e in jobs
        ]

    return probe


def host(
    box, *, runtimes=("nvidia", "runc"), free_gb=100, buildx=True, conda=True, engine=True, network=None
):
    docker = (
        {("/usr/local/bin/docker", "buildx", "version"): (0, "github.com/docker/buildx v0.17.1 abc\n")}
        if buildx
        else {("/usr/local/bin/docker", "version", "--format", "{{.Client.Version}}"): (1, "28.2.2\n")}
    )
    return Probes(
        nvml=FakeNVML(box),
        run=smi(box, docker),
        engine=lambda: (
            Engine(True, "Docker 20.10.24", runtimes, "/var/lib/docker")
            if engine
            else Engine(False, "Error while fetching server API version")
        ),
        which=lambda name: f"/opt/bin/{name}" if conda and name == "micromamba" else None,
        which_all=lambda name: ["/usr/local/bin/docker"],
        free_bytes=lambda path: free_gb * GB,
        exists=lambda path: path != "/usr/bin/docker",
        mirror_probe=network or recorded_network(),
    )


def test_detect_prints_the_real_h200_run(m):
    """What the device's detect printed (2026-12-03) still holds: the machine read the same, the
    same profile, its reasons but the last, "140 GB >= 60 GB", which the memory plan's own line
    replaced (a size check that a fix such as --algo grpo could contradict)."""
    code, out = invoke(["detect", "--json"], host("h200"))
    assert code == 0
    got, was = json.loads(out), json.loads((FIXTURES / "h200" / "detect.json").read_text())
    assert {k: v for k, v in got.items() if k != "recommendation"} == {
        k: v for k, v in was.items() if k != "recommendation"
    }
    rec, old = got["recommendation"], was["recommendation"]
    # (its note on the GPU count is now a check command: see the next-but-one test)
    assert rec["profile"] == old["profile"] and len(rec["notes"]) == len(old["notes"]) == 1
    reasons = rec["candidates"][0]["reasons"]
    # (planned for its one GPU, the 7B model gives way to a smaller one, and a reason says so)
    assert reasons.pop(1)["text"] == (
        "profile h200 as shipped does not fit this machine; with --model Qwen/Qwen2.5-1.5B-Instruct it does"
    )
    assert reasons[:2] == old["candidates"][0]["reasons"][:2]
    assert old["candidates"][0]["reasons"][2] in reasons
    assert reasons[2] == {
        "ok": None,
        "text": "a newer driver adds nothing: no newer stack resolves on this card",
    }
    assert reasons[-1]["text"].startswith("Qwen/Qwen2.5-1.5B-Instruct peaks at ")


def test_detect_without_a_gpu_exits_0_and_says_so(m):
    code, out = invoke(["detect"], host("no-driver"))
    assert code == 0
    assert out.startswith("no NVIDIA GPU found: NVML: NVML Shared Library Not Found")


def test_doctor_ready_p40_box_exits_0(m):
    code, out = invoke(["doctor", "p40"], host("p40"))
    assert code == 0, out
    assert out.splitlines()[-1] == "READY: profile p40 on this machine"


def test_doctor_driver_too_old_exits_1_with_the_fix(m):
    code, out = invoke(["doctor", "a100", "--json"], host("old-driver"))
    assert code == 1
    checks = {c["check"]: c for c in json.loads(out)["checks"]}
    assert checks["driver"]["status"] == "fail"
    assert checks["driver"]["fix"] == "upgrade the driver to >= 580.82.07"  # a100: CUDA 13.0
    assert checks["GPU 0 arch"]["status"] == "ok"


def test_doctor_real_h200_gpu_checks_match_the_recorded_run(m):
    code, out = invoke(["doctor", "h200", "--json"], host("h200"))
    assert code == 0
    recorded = json.loads((FIXTURES / "h200" / "doctor.json").read_text())["checks"]
    gpu = lambda checks: [c for c in checks if c["check"] == "driver" or c["check"].startswith("GPU")]
    assert gpu(json.loads(out)["checks"]) == gpu(recorded)


def test_doctor_profile_for_another_gpu_fails(m):
    code, out = invoke(["doctor", "p40"], host("4090"))
    assert code == 1
    assert "\u2717 GPU 0 profile: NVIDIA GeForce RTX 4090 (CC 8.9) vs the profile's Tesla P40 (CC 6.1)" in out


def test_doctor_without_a_gpu_fails(m):
    code, out = invoke(["doctor", "p40"], host("no-driver"))
    assert code == 1
    assert "\u2717 GPU: no NVIDIA GPU found" in out


def test_doctor_unknown_profile_exits_2():
    with pytest.raises(SystemExit) as e:
        main(["doctor", "nope"])
    assert e.value.code == 2


def test_doctor_engine_down_skips_the_runtime_check(m):
    report = doctor(m, "p40", Overrides(), host("p40", engine=False))
    checks = {c.name: c for c in report.checks}
    assert checks["docker engine"].status == "fail"
    assert checks["nvidia runtime"].status == "skip"


def test_doctor_engine_without_nvidia_runtime_fails(m):
    report = doctor(m, "p40", Overrides(), host("p40", runtimes=("runc",)))
    assert [c.name for c in report.checks if c.status == "fail"] == ["nvidia runtime"]


def test_doctor_disk_needs_room_for_vllm_and_the_build_stage(m):
    assert image_gb(resolve(m, "p40")) == 20  # apex: a build stage, no vLLM
    assert image_gb(resolve(m, "h200")) == 25  # flash-attn and vLLM
    report = doctor(m, "h200", Overrides(), host("h200", free_gb=24))
    assert [c.name for c in report.checks if c.status == "fail"] == ["disk"]


def test_doctor_conda_missing_warns_unless_asked_for(m):
    assert invoke(["doctor", "p40"], host("p40", conda=False))[0] == 0
    code, out = invoke(["doctor", "p40", "--conda"], host("p40", conda=False))
    assert code == 1 and "\u2717 conda:" in out


def test_doctor_mirror_check_is_skipped_when_no_set_is_chosen(m, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no user config, so no default set
    code, out = invoke(["doctor", "p40"], host("p40"))
    assert code == 0
    assert "- mirrors: no mirror set chosen" in out


def test_doctor_probes_the_mirror_set_on_loopback(m, tmp_path, monkeypatch):
    import json
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self):  # a registry answers /v2/ with 401 when it wants a token
            self.send_response(401 if self.path == "/v2/" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        json.dumps(
            {
                "mirrors": {
                    "lo": {
                        "description": "loopback",
                        "registries": {"docker.io": [f"127.0.0.1:{srv.server_port}"]},
                        "pypi": [f"http://127.0.0.1:{closed}/simple"],
                    }
                }
            }
        )
    )
    monkeypatch.setenv("ENVBUILD_CONFIG", str(cfg))
    from envbuilder.model import config

    config._load.cache_clear()
    try:
        from envbuilder.machine.doctor import probe_mirror  # the real probes: the set is all loopback

        code, out = invoke(["doctor", "p40", "--mirror", "lo"], host("p40", network=probe_mirror))
    finally:
        srv.shutdown()
        config._load.cache_clear()
    assert code == 1
    assert "\u2717 mirrors: set lo: 1 of 2 endpoints answer; nothing answers for pypi" in out


def test_buildkit_new_client_without_buildx_fails():
    check = buildkit_check(
        host("p40", buildx=False).run, lambda n: ["/usr/local/bin/docker"], lambda p: False
    )
    assert check.status == "fail"
    assert "/usr/local/bin/docker 28.2.2 refuses DOCKER_BUILDKIT=1" in check.detail
    assert "buildx component is missing" in check.detail


def test_buildkit_old_client_builds_with_docker_buildkit():
    runs = {
        ("/usr/bin/docker", "version", "--format", "{{.Client.Version}}"): (0, "20.10.24+dfsg1\n"),
        ("/usr/local/bin/docker", "version", "--format", "{{.Client.Version}}"): (0, "28.2.2\n"),
    }
    check = buildkit_check(smi("p40", runs), lambda n: ["/usr/local/bin/docker"], lambda p: True)
    assert check.status == "ok"
    assert check.detail.startswith("DOCKER_BUILDKIT=1 with /usr/bin/docker (client 20.10.24+dfsg1")


def test_doctor_asks_the_client_build_would_use_envbuild_docker_first(monkeypatch):
    """ENVBUILD_DOCKER names the client `build` uses; doctor checks that one, not only PATH's."""
    monkeypatch.setenv("ENVBUILD_DOCKER", "/opt/docker-20/docker")
    runs = {
        ("/opt/docker-20/docker", "version", "--format", "{{.Client.Version}}"): (0, "20.10.24\n"),
        ("/usr/local/bin/docker", "version", "--format", "{{.Client.Version}}"): (0, "28.2.2\n"),
    }
    check = buildkit_check(smi("p40", runs), lambda n: ["/usr/local/bin/docker"], lambda p: True)
    assert check.status == "ok"
    assert check.detail.startswith("DOCKER_BUILDKIT=1 with /opt/docker-20/docker (client 20.10.24")
    monkeypatch.setenv("ENVBUILD_DOCKER", "/nowhere/docker")  # absent: the others are asked
    check = buildkit_check(
        smi("p40", runs), lambda n: ["/usr/local/bin/docker"], lambda p: p != "/nowhere/docker"
    )
    assert check.status == "fail" and "/opt/docker-20" not in check.detail
    assert "/usr/local/bin/docker 28.2.2" in check.detail


# -- preflight.py: the same rules inside the image -------------------------------------------


@pytest.mark.parametrize("profile", ["p40", "4090", "h200"])
def test_rendered_preflight_is_valid_python(m, profile, tmp_path):
    path = place_script(render_files(BuildContext.of(resolve(m, profile))), "preflight.py", tmp_path)
    out = subprocess.run(
        [
            "python3",
            "-c",
            f"import runpy, sys; g = runpy.run_path({str(path)!r}, run_name='x'); "
            "print(g['load_data'](g['KEY'], g['SHAPE'])['profile'])",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == profile


def test_a_driver_reported_as_na_is_unknown_not_a_crash(m):
    class NoNVML:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            raise self.NVMLError("Driver Not Loaded")

    def run(argv):  # a half-working driver: the GPU is listed, its version is not
        text = "0, Tesla P40, 6.1, 24576, N/A\n" if tuple(argv) == QUERY else "no table\n"
        return subprocess.CompletedProcess(argv, 0, text, "")

    machine = detect(m, NoNVML(), run)
    assert machine.driver is None and machine.gpus[0].model == "p40"
    rec = recommend(m, machine)
    assert "driver unknown" in rec.fits[0].reasons[1].text
    # doctor cannot check it: it says so, and does not call it fine
    from envbuilder.machine.doctor import driver_check

    check = driver_check(m, "p40", Overrides(), resolve(m, "p40"), machine)
    assert (check.status, check.detail) == ("skip", "driver version unknown; CUDA 11.8 needs >= 520.61.05")


# -- today's GPUs, against the shipped matrix --------------------------------------------------


@pytest.mark.parametrize("box, profile", [("b200", "b200"), ("5090", "5090")])
def test_a_recorded_blackwell_box_gets_its_profile(box, profile):
    """nvidia-smi and NVML as a B200 and an RTX 5090 on driver 580.95.05 report them (the memory
    lines are real cards', tests/fixtures/gpu/README.md)."""
    code, out = invoke(["detect", "--json"], host(box))
    assert code == 0, out
    report = json.loads(out)
    assert report["recommendation"]["profile"] == profile
    assert parse_cuda_version((FIXTURES / box / "nvidia-smi.txt").read_text()) == "13.0"


@pytest.mark.parametrize(
    "name, model",
    [
        ("NVIDIA B200", "b200"),
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA GeForce RTX 5090", "5090"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA H200", "h200"),
    ],
)
def test_todays_names_map_to_the_shipped_models(name, model):
    assert match_model(matrix.load(), name) == model


def test_a_grace_machine_runs_the_stack_pypi_serves_for_aarch64_and_refuses_older_ones():
    """GB200/GH200 hosts are aarch64: the verl 0.9.1 stack (torch 2.11.0 cu130, vLLM 0.24.0 with
    an aarch64 wheel) resolves there; an older stack is refused with the true reason (PyPI's
    aarch64 torch up to 2.10.0 is a CPU build) and a fix that resolves."""
    from envbuilder.model.resolve import Overrides, ResolveError

    m = matrix.load()
    prof = dict(m.profiles["b200"], gpu="gb200")
    m2 = matrix.Matrix(dict(m.sections, profiles={"gb200-test": prof}), m.origin)
    env = resolve(m2, "gb200-test")
    assert env.gpu.machine == "aarch64" and env.torch.version == "2.11.0"
    with pytest.raises(ResolveError) as e:
        resolve(m2, "gb200-test", Overrides(verl="0.8.0"))
    [v] = [v for v in e.value.violations if v.rule == "machine"]
    assert v.hard and "aarch64" in v.what and "PyPI's aarch64 torch 2.9.0 is a CPU build" in v.why
    assert v.fix == "use --verl 0.9.1"


def test_render_doctor_and_build_without_a_profile_take_the_one_detect_picks(m, tmp_path, monkeypatch):
    """The command people type: `envbuild render` / `doctor` with no PROFILE on a P40 box take
    p40 and say so (stderr); on a machine with no GPU they refuse (exit 2) listing the profiles,
    before anything is written."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["render", "-o", "out"], obj=host("p40"))
    assert r.exit_code == 0, r.output
    assert "no PROFILE given: this machine's Tesla P40 (CC 6.1) fits profile p40 best" in r.output
    assert json.loads((tmp_path / "out" / "p40" / "envbuild.json").read_text())["profile"] == "p40"
    code, out = invoke(["doctor"], host("p40"))
    assert code == 0 and out.splitlines()[-1] == "READY: profile p40 on this machine"
    for argv in (["render", "-o", "none"], ["doctor"], ["build", "--push", "local"]):
        r = CliRunner().invoke(cli, argv, obj=host("no-driver"))
        said = r.output + str(r.exception)
        assert getattr(r.exception, "exit_code", r.exit_code) == 2, said
        assert "Name a profile" in said and "p40, 4090" in said and "NVML" in said
    assert not (tmp_path / "none").exists()


def test_doctor_probes_what_the_build_fetches_and_names_each_fix(m):
    """A P40 box behind a network without Docker Hub and with a TLS-intercepting proxy in front
    of GitHub: doctor says so before a build would, each with its own fix."""
    down = {
        "registry": "DNS: the host name does not resolve here",
        "github": "TLS verification failed (a TLS-intercepting proxy? CERTIFICATE_VERIFY_FAILED)",
    }
    code, out = invoke(["doctor", "p40", "--json"], host("p40", network=recorded_network(down)))
    assert code == 1
    net = {c["check"]: c for c in json.loads(out)["checks"]}["network"]
    assert net["status"] == "fail"
    assert "registry-1.docker.io (the base images): DNS" in net["detail"]
    assert "https://github.com (the builder's source files): TLS verification failed" in net["detail"]
    assert "--mirror NAME" in net["fix"] and "--ca-cert FILE" in net["fix"]
    # one sentence per fix, not two run together ("... stand in for docker.io this network ...")
    assert net["fix"].endswith(".")
    fixes = sorted(net["fix"].split(". "))
    assert len(fixes) == 2, net["fix"]
    assert fixes[0].startswith("Pull the base images through a mirror"), fixes
    assert fixes[1].startswith("This network intercepts TLS"), fixes
    code, out = invoke(["doctor", "p40", "--json"], host("p40"))
    net = {c["check"]: c for c in json.loads(out)["checks"]}["network"]
    assert net["status"] == "ok" and "all 4 endpoints" in net["detail"]  # hub, PyPI, torch, GitHub


def test_doctors_network_fix_names_only_flags_doctor_takes():
    """doctor's registry fix said `--mirror auto`, which doctor (and render) refuse; only build
    takes it (issue 34, item 6)."""
    m = frozen()
    report = doctor(m, "p40", Overrides(), host("p40", network=recorded_network({"registry": "timed out"})))
    [net] = [c for c in report.checks if c.name == "network"]
    assert net.status == "fail" and "--mirror NAME" in net.fix and "--mirror auto" not in net.fix
    from envbuilder.machine import reach
    from envbuilder.oci.probe import Probe

    down = [Probe("registry", "docker.io", "https://registry-1.docker.io", False, "timed out", 5.0)]
    env = resolve(m, "p40")
    assert "--mirror auto" in reach.findings(env, down)[0].fix  # (build's own hint keeps it)


# ---- 7: detect reads only ASCII digits from nvidia-smi ------------------------------------------


@pytest.mark.parametrize(
    "row",
    [
        "0, Tesla T4, 7.5, ²4000, 535.54.03",
        "0, Tesla T4, 7.5, １５３６０, 535.54.03",
        "٠, Tesla T4, 7.5, 15360, 535.54.03",
        "0, Tesla T4, ７.５, 15360, 535.54.03",
        "0, Tesla T4, 7.5, 15360, ٥٣٥.٥٤.٠٣",
    ],
    ids=["superscript", "fullwidth-memory", "arabic-index", "fullwidth-cc", "arabic-driver"],
)
def test_nvidia_smi_printing_other_digits_is_named_not_an_internal_error(tmp_path, row):
    """A real nvidia-smi stand-in (a script on PATH) run by detect. Before: ValueError (an
    internal error) for '²', or the other digits taken as numbers. Failed before the fix: yes."""
    from click.testing import CliRunner

    from envbuilder.cli import cli
    from envbuilder.machine.doctor import Probes

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=*) printf '%s\\n' '{row}' ;;\n"
        "  *) echo '| NVIDIA-SMI 535.54.03  Driver Version: 535.54.03  "
        "CUDA Version: 12.2 |' ;;\n"
        "esac\n",
        encoding="utf-8",
    )
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    r = CliRunner().invoke(cli, ["detect"], obj=Probes(nvml=NO_NVML), env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 0, r.output
    assert "nvidia-smi printed a line envbuild cannot read" in r.output
    assert ascii(row) in r.output and "0-9" in r.output


@pytest.mark.parametrize("box", ["h200", "h100-535"])
def test_the_gpu_count_advice_on_a_one_gpu_box_is_a_check_that_passes(box, cli):
    """A profile for 8 GPUs on a one-GPU machine: the note's advice is an `envbuild check`
    command for that one GPU, and it passes (issue 43, item 19: "run the script with N_GPUS=1"
    was a plan `check h100 --gpus-per-node 1` refuses: 7B does not fit one H100)."""
    import re
    import shlex

    code, out = invoke(["detect"], host(box))
    assert code == 0, out
    [note] = [line for line in out.splitlines() if "GPUs and this machine has 1" in line]
    advised = re.search(r"`envbuild (check [^`]+)`", note)
    assert advised and "--gpus-per-node 1" in advised[1], note
    code, _, err = cli(*shlex.split(advised[1]))
    assert code == 0, (advised[1], err)


EVIL_NAME = "NVIDIA H200\x1b]0;owned\x07\x1b[2J\x9b31m"


class EvilNVML(FakeNVML):
    def nvmlDeviceGetName(self, h):
        return EVIL_NAME.encode("utf-8") + b"\xff"  # (and a byte that is no UTF-8)


def test_a_gpu_name_reaches_the_terminal_without_its_control_characters(tmp_path):
    """nvidia-smi's or NVML's GPU name is outside data: detect and doctor show its escapes as
    text (issue 43, item 28: a terminal title change and a screen clear passed)."""
    from envbuilder.machine.detect import probe_smi

    def no_nvml_smi(argv):
        r = smi("h200")(argv)
        if tuple(argv) == QUERY:
            r = subprocess.CompletedProcess(argv, 0, r.stdout.replace("NVIDIA H200", EVIL_NAME), "")
        return r

    assert "\x1b" not in probe_smi(no_nvml_smi).gpus[0].name
    probes = host("h200")
    for args in (["detect"], ["doctor", "h200"], ["detect", "--json"]):
        for p in (Probes(**dict(probes._asdict(), nvml=EvilNVML("h200"))),):
            code, out = invoke(args, p)
            assert not any(c in out for c in "\x1b\x07\x9b"), (args, out)
            assert "\\x1b" in out or "\\\\x1b" in out, (args, out)


_WITHOUT_ACTIONS = """
import sys
for name in ("docker", "pynvml", "requests"):
    sys.modules[name] = None  # as a base install (no [actions] extra) has them: absent
from envbuilder.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("command", [["detect"], ["doctor"], ["doctor", "p40"]])
def test_without_the_actions_extra_detect_and_doctor_name_it_with_exit_2(command, tmp_path):
    """README: `detect` and `doctor` need `[actions]`; without it they say so (exit 2), as
    `build` does, instead of reporting a machine they could not read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVBUILD_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    r = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ACTIONS, *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "envbuild[actions]" in " ".join(r.stderr.split()), r.stderr
    assert r.stdout == ""


def test_a_fit_planned_for_the_gpus_a_machine_has_never_adds_gpus_per_node_again():
    # one H200 of an 8-GPU profile: the 7B GAE's refusal offers --gpus-per-node 4 first (more
    # GPUs of the same node), which this machine does not have; the fix detect takes changes
    # neither the card nor the GPU count it planned for
    from envbuilder.machine.detect import resolve_or_fix

    from conftest import shipped

    env, changed = resolve_or_fix(shipped(), "h200", Overrides(gpus_per_node=1))
    assert changed and "--gpus-per-node" not in changed and "--gpu-memory" not in changed
    assert env.train.n_gpus == 1
