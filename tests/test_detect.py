"""detect and doctor on recorded machines: NVML fakes and nvidia-smi outputs from tests/fixtures/gpu."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from envbuilder import matrix
from envbuilder.detect import QUERY, QUERY_NO_CC, Gpu, Machine, detect, match_model, parse_cuda_version, recommend

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"


@pytest.fixture(scope="module")
def m():
    return matrix.load()


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


def smi(box: str):
    """A command runner answering nvidia-smi as the recorded machine did."""
    d = FIXTURES / box

    def run(argv):
        argv = tuple(argv)
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
    assert machine.problem.startswith("NVML: Driver Not Loaded; nvidia-smi: NVIDIA-SMI has failed "
                                      "because it couldn't communicate with the NVIDIA driver.")


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
        assert str(e) in {json.loads((FIXTURES / b / "nvml.json").read_text())["init_error"]
                          for b in ("no-driver", "driver-not-loaded")}
    assert detect(m, pynvml, smi("no-driver")).gpus == ()


@pytest.mark.parametrize("name, model", [
    ("Tesla P40", "p40"), ("NVIDIA GeForce RTX 4090", "4090"), ("NVIDIA H200", "h200"),
    ("Tesla T4", "t4"), ("NVIDIA L40S", "l40s"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("Tesla V100-SXM2-32GB", "v100"), ("NVIDIA RTX A6000", None)])
def test_names_map_to_the_matrix_models(m, name, model):
    assert match_model(m, name) == model


@pytest.mark.parametrize("box, cuda", [("p40", "12.2"), ("4090", "12.4"), ("h200", "13.0"),
                                       ("old-driver", "11.4")])
def test_cuda_version_from_the_nvidia_smi_header(box, cuda):
    assert parse_cuda_version((FIXTURES / box / "nvidia-smi.txt").read_text()) == cuda


# -- the recommendation ----------------------------------------------------------------------

def test_p40_box_gets_p40_and_why(m):
    rec = recommend(m, detect(m, FakeNVML("p40")))
    assert rec.profile == "p40"
    assert [r.line() for r in rec.fits[0].reasons] == [
        "Tesla P40 is the matrix's p40, the GPU of profile p40 \u2713",
        "driver 535.183.01 supports CUDA 12.2; profile p40 needs CUDA 11.8 (>= 520.61.05) \u2713",
        "torch 2.6.0+cu118 has sm_60 which runs on CC 6.1 \u2713",
        "24 GB >= 8 GB for Qwen/Qwen2.5-0.5B-Instruct \u2713"]


def test_4090_box_gets_4090(m):
    assert recommend(m, detect(m, FakeNVML("4090"))).profile == "4090"


def test_mixed_box_fits_the_weakest_gpu(m):
    rec = recommend(m, detect(m, FakeNVML("mixed")))
    assert (rec.gpu.name, rec.profile) == ("Tesla T4", "t4")
    assert "the profile must fit the weakest, GPU 1 Tesla T4 (CC 7.5, 15 GB)" in rec.notes[0]


def test_h200_box_gets_h200_and_the_gpu_count_note(m):
    rec = recommend(m, detect(m, FakeNVML("h200")))
    assert rec.profile == "h200"
    assert rec.notes == ("profile h200 trains on 8 GPUs and this machine has 1: run the script "
                         "with N_GPUS=1",)


def test_driver_too_old_fits_nothing_and_says_the_fix(m):
    rec = recommend(m, detect(m, FakeNVML("old-driver")))
    assert rec.profile is None
    [fit] = rec.fits
    assert fit.profile == "a100" and not fit.ok
    assert "driver 470.82.01 is too old for CUDA 12.8: CUDA 12.8 needs >= 570.26" in fit.reasons[1].text
    assert fit.fixes == ("upgrade the driver to >= 570.26",)


def test_unknown_gpu_gets_the_closest_profile_of_its_family(m):
    machine = Machine((Gpu(0, "NVIDIA RTX A6000", "8.6", 49140),), "550.54.14", "12.4", "nvml")
    rec = recommend(m, machine)
    assert rec.profile == "3090"
    assert [f.profile for f in rec.fits] == ["3090", "a100"]  # CC 8.6 first, then 8.0
    assert "not in the matrix" in rec.fits[0].reasons[0].text
    assert "minor-version compatibility" in rec.fits[0].reasons[1].text  # 550 runs CUDA 12.8 so
