"""The real-index tier: every shipped profile's whole pinned set resolves as one solution on
PyPI for the profile's own Python and platform (uv, as `envbuild check --resolve` runs it).
Stand-in wheels prove mechanics; only the real index proves that the pins install together.
Where the PyTorch index is out of reach (it is from here), the +cuXXX torch is swapped for
PyPI's build of the same version, and the output says so."""

from __future__ import annotations

import subprocess

import pytest

from conftest import PROFILES, clean_env, envbuild_exe, record, shipped

pytestmark = pytest.mark.pypi  # (real_pypi marks it too; said here so a reader sees the tier)


def check_resolve(*args, cache_home, timeout=600):
    return subprocess.run(
        [envbuild_exe(), "check", *args, "--resolve"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(XDG_CACHE_HOME=str(cache_home)),
    )


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_co_resolves_on_the_real_index(profile, real_pypi, cache_home):
    r = check_resolve(profile, cache_home=cache_home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the whole pinned set co-resolves" in r.stdout
    if "note: the PyTorch index" in r.stdout:
        assert "(PyPI's build) in its place" in r.stdout


# every other verl release's whole pinned set (stacks.yaml), on the h100 that defaults to the newest
OLDER_STACKS = [v for v in shipped().stacks if v != shipped().profiles["h100"]["verl"]]


@pytest.mark.parametrize("verl", OLDER_STACKS)
def test_every_stack_co_resolves_on_the_real_index(verl, real_pypi, cache_home):
    r = check_resolve("h100", "--verl", verl, cache_home=cache_home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the whole pinned set co-resolves" in r.stdout


def test_a_conflict_the_matrix_does_not_know_is_named_by_the_real_index(real_pypi, overlay, cache_home):
    # vllm 0.8.5.post1 requires transformers>=4.51.1; the matrix records nothing about it
    prof = record("profiles", "t4", pins={"transformers": "4.40.0"}, source="https://example.org")
    folder = overlay({"profiles": {"t4": prof}})
    r = check_resolve("t4", "--matrix-dir", folder, cache_home=cache_home)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "transformers" in r.stderr and "vllm" in r.stderr
    assert "cannot be resolved" in r.stderr


def test_the_seed_4090_stack_resolves_but_the_resolver_refuses_it(real_pypi, cache_home):
    # pip and uv are happy with torch 2.3.1 + verl 0.4.1: only the matrix's fact catches it
    r = check_resolve("4090", "--torch", "2.3.1", cache_home=cache_home)
    assert r.returncode == 2
    assert "verl-torch" in r.stderr and "DeviceMesh" in r.stderr


@pytest.mark.parametrize("profile", ["gh200", "gb200"])
def test_the_grace_profiles_pins_co_resolve_for_aarch64_with_pypis_cuda_torch(profile, real_pypi):
    """The GH200/GB200 profiles' whole pinned set (verl 0.9.1, vLLM 0.24.0, torch 2.11.0) resolves
    as one solution for aarch64-manylinux_2_39 / Python 3.12 on PyPI, and the torch it takes is
    the CUDA build: cuda-toolkit 13.0.x comes with it (PyPI's aarch64 torch up to 2.10.0 pulls
    none). Run 2026-12-04: 245 packages."""
    from conftest import resolved
    from envbuilder.lock.pip import target_glibc
    from envbuilder.lock.pip import co_resolve, python_platform
    from envbuilder.secret import SecretUrl

    env = resolved(profile)
    glibc = target_glibc(shipped(), env)
    assert python_platform(glibc, env.gpu.machine) == "aarch64-manylinux_2_39"
    found = co_resolve(env, glibc, SecretUrl(real_pypi), None)
    assert found["torch"].version == "2.11.0" and found["vllm"].version == "0.24.0"
    assert found["verl"].version == "0.9.1"
    assert found["cuda-toolkit"].version.startswith("13.0.")
