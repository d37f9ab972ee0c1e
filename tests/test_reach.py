"""What a build fetches, probed before its first step (envbuilder/machine/reach.py): the endpoints each
profile's rendered files use, and each failure told apart by what fixes it (DNS, refused, timeout,
TLS interception, credentials, rate limit)."""

from __future__ import annotations

import requests

from conftest import resolved
from envbuilder.machine import reach
from envbuilder.oci.http import reason as failure_reason
from envbuilder.oci.probe import Probe
from envbuilder.render.context import BuildContext


def test_what_each_build_fetches_follows_the_rendered_files():
    p40 = reach.needs(resolved("p40"))  # +cu118 torch from the PyTorch index, apex from GitHub
    assert p40["registries"] == {"docker.io": ["registry-1.docker.io"]}
    assert p40["pypi"] == ["https://pypi.org/simple"]
    assert p40["pytorch"] == ["https://download.pytorch.org/whl/cu118"]
    assert p40["github"] == ["https://github.com"]
    h100 = reach.needs(resolved("h100"), push="127.0.0.1:5000")  # PyPI's torch, nothing compiled
    assert "pytorch" not in h100 and "github" not in h100
    assert h100["registries"]["push 127.0.0.1:5000"] == ["127.0.0.1:5000"]
    offline = reach.needs(resolved("p40"), wheelhouse=True)  # a wheelhouse needs no index
    assert set(offline) == {"registries"}
    # a mirror set's registries were picked by probing them: the push target remains, and the
    # indexes the files name (the upstream ones where the set has none)
    mirrored = reach.needs(resolved("p40"), push="r:5000", upstream=False)
    assert mirrored["registries"] == {"push r:5000": ["r:5000"]}
    assert mirrored["pytorch"] == ["https://download.pytorch.org/whl/cu118"]


def test_a_failure_is_named_by_what_fixes_it():
    tls = requests.exceptions.SSLError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    dns = requests.ConnectionError(
        "HTTPSConnectionPool: NameResolutionError(<...>: Failed to resolve 'registry-1.docker.io')"
    )
    refused = requests.ConnectionError("[Errno 111] Connection refused")
    assert failure_reason(tls, 5).startswith("TLS verification failed")
    assert failure_reason(dns, 5) == "DNS: the host name does not resolve here"
    assert failure_reason(refused, 5) == "connection refused/unreachable"
    assert failure_reason(requests.ConnectTimeout("x"), 5) == "timeout after 5s"
    env = resolved("p40")
    found = reach.findings(
        env,
        [
            Probe("registry", "docker.io", "registry-1.docker.io", False, failure_reason(dns, 5), 3.0),
            Probe("pypi", "pypi", "https://pypi.org/simple", True, "HTTP 200", 40.0),
            Probe(
                "pytorch",
                "pytorch",
                "https://download.pytorch.org/whl/cu118",
                False,
                "HTTP 429 (rate limited)",
                9.0,
            ),
            Probe("github", "github", "https://github.com", False, failure_reason(tls, 5), 9.0),
        ],
    )
    by = {f.what.split(" ")[0]: f for f in found}
    assert set(by) == {"registry-1.docker.io", "https://download.pytorch.org/whl/cu118", "https://github.com"}
    assert "--mirror NAME" in by["registry-1.docker.io"].fix
    assert "--torch-from-pypi" in by["https://download.pytorch.org/whl/cu118"].fix
    assert "--ca-cert FILE" in by["https://github.com"].fix
    text = reach.message(found)
    assert text.count("\n  - ") == 3 and "before any build step" in text


def test_a_failed_build_is_classified_with_one_fix_and_its_step_is_never_cut_mid_word():
    from envbuilder.engines.docker import build_failure, classify, step_title

    cases = {
        "ERROR: Could not find a version that satisfies the requirement torch==2.6.0+cu118\n"
        "ERROR: No matching distribution found for torch==2.6.0+cu118": "resolution impossible",
        "pip._vendor.urllib3...: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed": "TLS",
        'failed to do request: Head "https://registry-1.docker.io/v2/": dial tcp: lookup '
        "registry-1.docker.io on 10.0.0.2:53: no such host": "DNS",
        "toomanyrequests: You have reached your pull rate limit.": "rate limited",
        "OSError: [Errno 28] No space left on device": "disk is full",
        "nvcc fatal   : Unsupported gpu architecture 'compute_61'": "compile step failed",
    }
    for log, kind in cases.items():
        got, fix = classify("step output\n" + log)
        assert got and kind in got and fix, (log, got)
    assert classify("some other failure") == (None, None)
    run = (
        "RUN --mount=type=cache,target=/root/.cache/uv --mount=type=bind,source=constraints,"
        "target=/tmp/c --mount=type=secret,id=ca_cert . /usr/local/bin/envbuild-secrets && "
        'uv pip install --index-url "${PIP_INDEX_URL}" -c /tmp/c/torch.txt ' + "pkg==1.0 " * 30
    )
    title = step_title(run)
    assert "--mount" not in title and title.startswith("RUN . /usr/local/bin/envbuild-secrets")
    assert len(title) <= 124 and title.endswith(" ...") and not title[:-4].endswith(("pkg=", "pk"))
    err = build_failure(
        "docker", "t:1", "ERROR: No matching distribution found for x==1", [("5/9", run)], False
    )
    assert "resolution impossible" in str(err) and "Fix the error above" not in str(err)


def test_review_mends_classification_ca_cert_and_a_reprinted_step_header(tmp_path):
    import io

    from envbuilder.engines.docker import StepLog, classify
    from envbuilder.oci.http import ca_bundle as _trust

    assert classify("OSError: [Errno 13] Permission denied: '/opt/venv/x'") == (None, None)
    assert "DNS" not in (classify("error: Failed to resolve dependencies for `verl`")[0] or "")
    assert "credentials" in classify("denied: requested access to the resource is denied")[0]
    ca = tmp_path / "corp.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nCORP\n-----END CERTIFICATE-----\n")
    assert _trust(None) is True
    bundle = _trust(str(ca))
    try:  # the build's --ca-cert is trusted by the probes, beside the system's CAs
        assert b"CORP" in open(bundle, "rb").read()
    finally:
        import os

        os.unlink(bundle)
    now = [0.0]
    log = StepLog(out=io.StringIO(), tty=False, clock=lambda: now[0])
    log("#6 [runtime 3/6] RUN long")
    now[0] = 30.0
    log("#6 [runtime 3/6] RUN long")  # BuildKit prints it again when outputs interleave
    assert log.steps["6"]["started"] == 0.0


def test_a_driver_refusal_does_not_hide_the_fixes_of_the_others():
    from conftest import violations

    v = violations("h100", vllm="0.9.2", driver="535.54.03")
    assert v["verl-vllm"].fix == "use --vllm 0.24.0"
    assert "upgrade the driver" in v["driver"].fix


def test_a_mirror_build_probes_what_its_dockerfile_fetches_from():
    """build --mirror NAME (issue 44, Medium 8): a set with a PyTorch endpoint is the index the
    Dockerfile installs torch from and the one probed ({variant} filled with the profile's, with
    the set's credentials); a set without one leaves download.pytorch.org in the Dockerfile, so
    that is probed, and named when it does not answer."""
    from envbuilder.model import mirrors as M
    from envbuilder.render.files import render_files

    p40 = resolved("p40")
    with_pt = M.choice(
        "lan", {"pypi": ["http://u:pw@127.0.0.1:9/simple"], "pytorch": ["http://127.0.0.1:9/whl/{variant}"]}
    )
    env = M.apply_to_env(p40, with_pt)
    assert (
        "ARG TORCH_INDEX_URL=http://127.0.0.1:9/whl/cu118" in render_files(BuildContext.of(env))["Dockerfile"]
    )
    body = reach.needs(env, push="r:5000", upstream=False, credentials=with_pt.endpoints(p40))
    assert body == {
        "registries": {"push r:5000": ["r:5000"]},
        "pypi": ["http://u:pw@127.0.0.1:9/simple"],
        "pytorch": ["http://127.0.0.1:9/whl/cu118"],
        "github": ["https://github.com"],  # (the set has no GitHub prefix: apex comes from GitHub)
    }

    no_pt = M.choice("pypi-only", {"pypi": ["http://127.0.0.1:9/simple"]})
    env = M.apply_to_env(p40, no_pt)
    assert (
        "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu118"
        in render_files(BuildContext.of(env))["Dockerfile"]
    )
    body = reach.needs(env, upstream=False, credentials=no_pt.endpoints(p40))
    assert body["pytorch"] == ["https://download.pytorch.org/whl/cu118"]

    def probe(body):
        return [
            Probe(kind, kind, e, kind != "pytorch", "connection refused/unreachable", 1.0)
            for kind in ("pypi", "pytorch", "github")
            for e in body.get(kind, [])
        ]

    (found,) = reach.check(env, False, None, upstream=False, probe=probe)
    assert found.what.startswith("https://download.pytorch.org/whl/cu118 (torch 2.6.0+cu118)")


def test_a_failed_step_names_its_command_once():
    """A failed build printed its RUN command three times (the title, BuildKit's `> [n/m] RUN`
    block, its Dockerfile excerpt and `process "/bin/sh -c ..." did not complete`): the title
    says it once, with the exit code, and the step's own output stays (issue 44, Low)."""
    from envbuilder.engines.docker import build_failure

    cmd = "uv pip install --index-url https://example.invalid/simple pkg==1.0"
    log = "\n".join(
        [
            f"#9 [3/5] RUN {cmd}",
            "#9 0.512 error: No solution found when resolving dependencies: pkg==1.0 is missing",
            f'#9 ERROR: process "/bin/sh -c {cmd}" did not complete successfully: exit code: 1',
            "------",
            f" > [3/5] RUN {cmd}:",
            "0.512 error: No solution found when resolving dependencies: pkg==1.0 is missing",
            "------",
            "Dockerfile:12",
            "--------------------",
            f"  12 | >>> RUN {cmd}",
            "--------------------",
            f'ERROR: failed to solve: process "/bin/sh -c {cmd}" did not complete successfully: exit code: 1',
        ]
    )
    text = str(build_failure("docker", "t:1", log, [("3/5", f"RUN {cmd}")], False))
    assert text.count(cmd) == 1 and "(exit code 1)" in text.splitlines()[0], text
    assert "No solution found when resolving" in text and "resolution impossible" in text
