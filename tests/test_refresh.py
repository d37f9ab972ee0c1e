"""`envbuild refresh`: the matrix against PyPI's JSON API. Drift reports on recorded PyPI data
served from a loopback server with PyPI's URL layout; the metadata-from-wheel path of an index
without per-release JSON; the overlay it writes; the weekly workflow; and one run against the
real index (marked pypi).

tests/fixtures/pypi-json/ holds PyPI's answers for torch, vllm, verl, flash-attn, transformers and
ray, recorded on 2026-12-03 and trimmed to what refresh reads: <name>.json is /pypi/<name>/json
(info.version; every release's key; per file `yanked` (+reason) and, for the releases refresh
looks at, the Linux x86_64 / sdist / pure files' names and requires_python; the other releases'
files collapsed to one entry per yanked state); <name>-<version>.json is /pypi/<name>/<version>/json
(info.requires_python and info.requires_dist, without the lines of extras refresh never
evaluates). The index reachable when they were recorded served no per-release JSON (404), so
those files hold what the release's wheel METADATA says, which is where PyPI takes
requires_dist from; flash-attn has only sdists there, so it has none. Re-record with
`.venv/bin/python tests/test_refresh.py --record` (network).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import FIXTURES, clean_env, envbuild_exe, frozen, record, unavailable

PYPI_JSON = FIXTURES / "pypi-json"
ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "refresh.yml"


# -- a loopback index with PyPI's JSON layout ---------------------------------------------------


class _Index(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        path = self.path.split("?")[0]
        body = None
        if self.server.per_release_json or not re.fullmatch(r"/pypi/[^/]+/[^/]+/json", path):
            m = re.fullmatch(r"/pypi/([^/]+)/(?:([^/]+)/)?json", path)
            if m:
                name = m.group(1) + (f"-{m.group(2)}" if m.group(2) else "")
                f = self.server.root / f"{name}.json"
                body = f.read_bytes() if f.is_file() else None
        body = self.server.extra.get(path, body)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        rng = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        if rng and self.server.ranges:
            lo, hi = int(rng.group(1)), min(int(rng.group(2)), len(body) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(body)}")
            body = body[lo : hi + 1]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.served.append(path)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(autouse=True)
def _frozen(frozen_matrix):
    """refresh's comparisons are logic: they run on the frozen fixture matrix (conftest)."""


@pytest.fixture
def index():
    """start(root=..., per_release_json=True, ranges=True, extra={path: bytes}) -> base URL."""
    servers = []

    def start(
        root: Path = PYPI_JSON, per_release_json: bool = True, ranges: bool = True, extra: dict | None = None
    ) -> str:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
        srv.root, srv.per_release_json, srv.ranges = root, per_release_json, ranges
        srv.extra, srv.served = extra or {}, []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        start.server = srv
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def rec(section: str, key: str, **changes) -> dict:
    """A frozen matrix's record with changes, citing a URL (an overlay file has its own
    `sources:`)."""
    return record(section, key, frozen(), source="https://example.org/lab-notes", **changes)


def shipped_sources(*names: str) -> dict:
    """The `sources:` of shipped matrix files, for an overlay that keeps their source keys."""
    out = {}
    for name in names:
        out.update(yaml.safe_load((ROOT / "matrices" / f"{name}.yaml").read_text())["sources"])
    return out


def refresh_json(cli, base, *args) -> dict:
    code, out, err = cli("refresh", "--json", "--index-url", base, *args)
    assert code in (0, None), err
    return json.loads(out)


def drift(report: dict, kind: str, package: str | None = None, fact: str | None = None) -> list:
    return [
        r
        for r in report["drift"]
        if r["kind"] == kind
        and (package is None or r["package"] == package)
        and (fact is None or r["fact"] == fact)
    ]


# -- drift on the recorded data ------------------------------------------------------------------


def test_newer_vllm_torch_and_verl_releases_are_new_with_the_facts_pypi_gives(cli, index):
    report = refresh_json(cli, index())
    assert set(report["packages"]) == {"torch", "vllm", "verl", "flash-attn", "transformers", "ray"}
    assert report["packages"]["vllm"] == {
        "latest": "0.34.0",
        "newest_in_matrix": "0.11.0",
        "releases": 102,
        "metadata_read": 11,
    }
    [vllm] = drift(report, "new", "vllm")
    assert vllm["versions"][:3] == ["0.11.1", "0.11.2", "0.12.0"] and vllm["versions"][-1] == "0.34.0"
    assert len(vllm["versions"]) == 35
    # the newest three carry their exact torch pin and Python range, from requires_dist
    assert vllm["details"]["0.34.0"] == {
        "torch": "2.14.0",
        "python": ["3.11", "3.12", "3.13", "3.14"],
        "requires_python": "<3.15,>=3.11",
    }
    assert vllm["details"]["0.32.0"]["torch"] == "2.13.0"
    [torch] = drift(report, "new", "torch")
    assert torch["versions"][0] == "2.10.0" and torch["pypi"] == "2.15.0"
    assert torch["details"]["2.15.0"]["pypi_default"] == "cu132"  # cuda-toolkit[...]==13.2.2
    assert torch["details"]["2.15.0"]["python"] == ["3.11", "3.12", "3.13", "3.14", "3.15"]
    [verl] = drift(report, "new", "verl")
    # 0.8.0.dev0 is older than 0.8.0, which is out: not a pre-release to note
    assert verl["versions"] == ["0.7.0", "0.7.1", "0.8.0", "0.9.0", "0.9.1"]
    assert verl["details"]["0.9.1"]["vllm"] == "==0.24.0"
    assert not drift(report, "prerelease")


def test_recorded_facts_that_still_hold_are_not_reported(cli, index):
    report = refresh_json(cli, index())
    # every vllm torch pin, verl vllm range, torch Python list and PyPI CUDA, and `requires` range
    # of the shipped matrix agrees with the recorded metadata
    assert drift(report, "changed") == []
    assert drift(report, "unrecorded") == []


def test_vllm_0_7_3s_exact_ray_pin_contradicts_verls_ray_pins(cli, index):
    # a real gap of the shipped matrix: vllm 0.7.3 requires ray[adag]==2.40.0, and verl 0.4.1 /
    # 0.5.0 (whose ranges admit 0.7.3) pin ray[default] 2.46.0 / 2.47.1: no install satisfies both
    report = refresh_json(cli, index())
    found = {
        (r["version"], r["pypi"], r["matrix"]) for r in drift(report, "contradicted", "vllm", "requirement")
    }
    assert found == {
        ("0.7.3", "ray[adag]==2.40.0", "ray[default] 2.46.0"),
        ("0.7.3", "ray[adag]==2.40.0", "ray[default] 2.47.1"),
    }
    r = next(r for r in drift(report, "contradicted", "vllm") if "2.47.1" in r["matrix"])
    assert r["combinations"] == ["verl 0.5.0 + vllm 0.7.3"]
    [where] = r["where"]
    assert where.endswith("/verl.yaml: verl.0.5.0.pins.ray[default]")


def test_an_altered_overlay_pin_shows_as_changed_and_the_overlay_fixes_it(cli, index, overlay, tmp_path):
    folder = overlay(
        {
            "sources": shipped_sources("vllm", "verl"),
            "vllm": {"0.8.5.post1": record("vllm", "0.8.5.post1", torch="2.5.1")},
            "verl": {"0.6.1": record("verl", "0.6.1", vllm=">=0.8.5,<=0.10.2")},
        }
    )
    out, base = tmp_path / "proposed", index()
    report = refresh_json(cli, base, "--matrix-dir", folder, "--write-overlay", out)
    [pin] = drift(report, "changed", "vllm", "torch pin")
    assert (pin["version"], pin["matrix"], pin["pypi"]) == ("0.8.5.post1", "2.5.1", "2.6.0")
    assert pin["where"] == ["overlay/lab.yaml: vllm.0.8.5.post1.torch"]
    [rng] = drift(report, "changed", "verl", "vllm range")
    assert (rng["matrix"], rng["pypi"]) == (">=0.8.5,<=0.10.2", "<=0.11.0,>=0.8.5")
    # the overlay carries both fixes on whole copies of the records, and loads over the overlay
    from envbuilder.model import matrix as M

    written = out / "refresh.yaml"
    assert report["overlay"] == str(written)
    m = M.load((folder, out))
    assert m.vllm["0.8.5.post1"]["torch"] == "2.6.0"
    assert m.vllm["0.8.5.post1"]["pins"] == {"ray[default]": "2.47.1"}
    assert m.verl["0.6.1"]["vllm"] == "<=0.11.0,>=0.8.5"
    assert m.verl["0.6.1"]["patches"] == frozen().verl["0.6.1"]["patches"]
    doc = yaml.safe_load(written.read_text())
    assert doc["vllm"]["0.8.5.post1"]["source"].startswith("https://pypi.org/project/vllm/0.8.5.post1/, ")
    assert "https://github.com/vllm-project/vllm/releases" in doc["vllm"]["0.8.5.post1"]["source"]
    # the same drift writes the same bytes (a weekly job with nothing new proposes nothing)
    before = written.read_bytes()
    refresh_json(cli, base, "--matrix-dir", folder, "--write-overlay", out)
    assert written.read_bytes() == before
    # the rest is a commented TODO report: new vLLM releases as records to complete
    text = before.decode()
    assert "#     vllm:\n#       0.32.0: {torch: 2.13.0, wheel_cuda: TODO" in text
    assert "#       0.34.0: {torch: 2.14.0, wheel_cuda: TODO" in text


def test_versions_pypi_lacks_or_has_yanked_are_contradicted(cli, index, overlay):
    t4 = rec("profiles", "t4", pins={"transformers": "4.56.9"})  # no such release
    v100 = rec("profiles", "v100", pins={"transformers": "4.57.0"})  # yanked on PyPI
    folder = overlay({"profiles": {"t4": t4, "v100": v100}, "vllm": {"0.11.7": rec("vllm", "0.11.0")}})
    report = refresh_json(cli, index(), "--matrix-dir", folder)
    missing = {(r["package"], r["version"]) for r in drift(report, "contradicted", fact="release")}
    assert missing == {("transformers", "4.56.9"), ("vllm", "0.11.7")}
    [yanked] = drift(report, "contradicted", "transformers", "yanked")
    assert yanked["version"] == "4.57.0"
    assert yanked["pypi"] == "yanked: Error in the setup causing installation issues"
    assert yanked["where"] == ["overlay/lab.yaml: profiles.v100.pins.transformers"]
    # 0.11.7 is now the newest the matrix records: the releases past it are the new ones
    [new] = drift(report, "new", "vllm")
    assert new["matrix"] == "0.11.7" and new["versions"][0] == "0.12.0"


def test_a_python_choice_that_requires_python_refuses_is_contradicted(cli, index, overlay):
    # an image whose Python is 3.9: torch 2.6.0 and vllm 0.8.5.post1 take it, verl 0.6.1 doesn't
    folder = overlay({"cuda": {"12.4": rec("cuda", "12.4", python="3.9")}})
    report = refresh_json(cli, index(), "--matrix-dir", folder)
    found = {
        (r["package"], r["version"], r["pypi"], tuple(r["combinations"]))
        for r in drift(report, "contradicted", fact="requires_python")
    }
    assert found == {
        ("verl", "0.6.1", ">=3.10", ("profile t4",)),
        ("verl", "0.6.1", ">=3.10", ("profile v100",)),
    }


def test_disjoint_shared_dependencies_the_matrix_does_not_record_are_named(cli, index, overlay):
    # without dependencies.yaml's record of vllm 0.8.5.post1, pairing it with ray 2.49.2 (which
    # needs opentelemetry-sdk>=1.30.0; vllm pins <1.27) resolves, and only refresh says why not
    kept = dict(frozen().requires["vllm"]["0.8.5"], source="https://example.org/lab-notes")
    folder = overlay(
        {
            "requires": {"vllm": {"0.8.5": kept}},
            "vllm": {"0.8.5.post1": rec("vllm", "0.8.5.post1", pins={"ray[default]": "2.49.2"})},
        }
    )
    report = refresh_json(cli, index(), "--matrix-dir", folder)
    [r] = drift(report, "unrecorded", fact="shared opentelemetry-sdk")
    assert r["pypi"] == (
        "ray 2.49.2: opentelemetry-sdk>=1.30.0; vllm 0.8.5.post1: opentelemetry-sdk<1.27.0,>=1.26.0"
    )
    assert r["combinations"][:2] == ["profile t4", "profile v100"]


def test_the_human_report_names_each_drift_and_its_matrix_key(cli, index, overlay):
    folder = overlay({"vllm": {"0.9.2": rec("vllm", "0.9.2", torch="2.6.0")}})
    code, out, err = cli("refresh", "--index-url", index(), "--matrix-dir", folder)
    assert code in (0, None), err
    assert "  vllm: 0.11.1, 0.11.2, 0.12.0, ... (29 more), 0.32.0, 0.33.0, 0.34.0" in out
    assert "    0.34.0: torch 2.14.0; python [3.11, 3.12, 3.13, 3.14]" in out
    assert (
        "  vllm 0.9.2: the matrix says it pins torch==2.6.0; its requires_dist says torch==2.7.0.\n"
    ) in out
    assert "    at overlay/lab.yaml: vllm.0.9.2.torch\n    overlay: vllm.0.9.2.torch = 2.7.0" in out
    assert "flash-attn 2.5.8, 2.6.3, 2.7.4.post1, 2.8.3" in out  # no metadata: said, not skipped
    assert out.rstrip().endswith("1 changed, 2 contradicted, 0 unrecorded.")


def test_pure_comparison_sorts_pre_releases_and_ignores_yanked_ones():
    from envbuilder.upstream import refresh as R

    def files(yanked=False):
        return [{"filename": "vllm-x-cp38-abi3-manylinux1_x86_64.whl", "yanked": yanked}]

    vllm = json.loads((PYPI_JSON / "vllm.json").read_text())
    vllm["releases"] = {v: f for v, f in vllm["releases"].items() if R._key(v) <= R._key("0.11.0")}
    vllm["releases"].update(
        {
            "0.11.1": files(yanked=True),
            "0.11.2": files(),
            "0.12.0rc1": files(),
            "0.11.2rc1": files(),
            "0.12.0.dev3": files(),
        }
    )
    report = R.compare(frozen(), {"vllm": vllm}, {})
    [new] = [r for r in report["drift"] if r["kind"] == "new" and r["package"] == "vllm"]
    assert new["versions"] == ["0.11.2"]  # 0.11.1 is yanked
    [pre] = [r for r in report["drift"] if r["kind"] == "prerelease"]
    assert pre["versions"] == ["0.12.0.dev3", "0.12.0rc1"]  # 0.11.2rc1's final is out


# -- fetching --------------------------------------------------------------------------------------


def _wheel(name: str, version: str, requires: list[str], pad: int = 300_000) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{name}/big.bin", os.urandom(pad))  # so METADATA sits far from the end
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Python: >=3.9\n"
        meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        z.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return buf.getvalue()


def _project_with_wheel(tmp_path: Path, wheel: bytes) -> Path:
    root = tmp_path / "index"
    root.mkdir()
    (root / "vllm.json").write_text(
        json.dumps(
            {
                "info": {"version": "0.8.5.post1"},
                "releases": {
                    "0.8.5.post1": [
                        {
                            "filename": "vllm-0.8.5.post1-cp38-abi3-manylinux1_x86_64.whl",
                            "url": "../../packages/vllm-0.8.5.post1.whl",
                            "size": len(wheel),
                            "yanked": False,
                            "requires_python": ">=3.9",
                        }
                    ]
                },
            }
        )
    )
    return root


def test_without_per_release_json_the_metadata_comes_from_the_wheel_by_range_requests(index, tmp_path):
    from envbuilder.cli.refresh import PyPIJson

    wheel = _wheel("vllm", "0.8.5.post1", ["torch==2.6.0", "ray[cgraph]>=2.43.0"])
    root = _project_with_wheel(tmp_path, wheel)
    base = index(root=root, per_release_json=False, extra={"/packages/vllm-0.8.5.post1.whl": wheel})
    client = PyPIJson(base, timeout=10)
    project = client.projects(["vllm"])["vllm"]
    md = client.metadata("vllm", "0.8.5.post1", project)
    assert md["requires_dist"] == ["torch==2.6.0", "ray[cgraph]>=2.43.0"]
    assert md["requires_python"] == ">=3.9"
    assert "METADATA" in md["from"]
    assert "/pypi/vllm/0.8.5.post1/json" not in index.server.served  # 404 first, then the wheel
    assert index.server.served.count("/packages/vllm-0.8.5.post1.whl") <= 8


def test_a_file_server_without_range_requests_is_not_downloaded_whole(index, tmp_path):
    from envbuilder.cli.refresh import PyPIJson

    wheel = _wheel("vllm", "0.8.5.post1", ["torch==2.6.0"])
    root = _project_with_wheel(tmp_path, wheel)
    base = index(
        root=root, per_release_json=False, ranges=False, extra={"/packages/vllm-0.8.5.post1.whl": wheel}
    )
    client = PyPIJson(base, timeout=10)
    md = client.metadata("vllm", "0.8.5.post1", client.projects(["vllm"])["vllm"])
    assert "error" in md and "range request" in md["error"]


def test_an_index_that_does_not_answer_exits_1_with_what_to_do(cli):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    code, out, err = cli("refresh", "--index-url", f"http://127.0.0.1:{port}", "--timeout", "2")
    assert code == 1
    assert "does not answer" in err and "--index-url" in err and "HTTPS_PROXY" in err


def test_an_index_without_the_json_api_exits_1(cli, index):
    code, out, err = cli("refresh", "--index-url", index() + "/simple-only")
    assert code == 1
    assert "answered 404" in err and "not a simple index" in err


def test_the_overlay_is_never_written_into_matrices_or_over_a_foreign_file(cli, index, tmp_path):
    from envbuilder.paths import data_dir

    before = {p.name: p.read_bytes() for p in data_dir("matrices").glob("*.yaml")}
    code, out, err = cli("refresh", "--index-url", index(), "--write-overlay", data_dir("matrices"))
    assert code == 2 and "never edits the shipped matrix" in err
    assert {p.name: p.read_bytes() for p in data_dir("matrices").glob("*.yaml")} == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "refresh.yaml").write_text("profiles: {}\n")
    code, out, err = cli("refresh", "--index-url", index(), "--write-overlay", mine)
    assert code == 2 and "not written by envbuild refresh" in err
    assert (mine / "refresh.yaml").read_text() == "profiles: {}\n"


# -- the weekly job ------------------------------------------------------------------------------


def test_the_weekly_workflow_is_valid_and_proposes_the_overlay():
    exe = Path(sys.executable).parent / "check-jsonschema"
    if not exe.exists():
        unavailable("check-jsonschema is not installed (the test extra lists it: pip install -e '.[test]')")
    r = subprocess.run(
        [str(exe), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc[True]["schedule"][0]["cron"]  # (YAML 1.1 reads the key `on` as True)
    steps = doc["jobs"]["refresh"]["steps"]
    run = "\n".join(s.get("run", "") for s in steps)
    assert "envbuild refresh --write-overlay" in run
    pr = [s for s in steps if str(s.get("uses", "")).startswith("peter-evans/create-pull-request@")]
    assert pr and pr[0]["with"]["add-paths"] == "refresh/refresh.yaml"


# -- the real index ------------------------------------------------------------------------------


@pytest.mark.pypi
def test_refresh_reads_the_real_index_for_every_package(real_pypi, cache_home):
    r = subprocess.run(
        [envbuild_exe(), "refresh", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(XDG_CACHE_HOME=str(cache_home)),
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert set(report["packages"]) == {"torch", "vllm", "verl", "flash-attn", "transformers", "ray"}
    for name, s in report["packages"].items():
        assert s["latest"] and s["releases"] > 0, name
    assert report["packages"]["vllm"]["metadata_read"] >= len(frozen().vllm)
    assert {r["kind"] for r in report["drift"]} <= {
        "new",
        "prerelease",
        "changed",
        "contradicted",
        "unrecorded",
    }


# -- re-recording the fixtures (network) ----------------------------------------------------------


def _record_fixtures(dest: Path = PYPI_JSON, base: str = "https://pypi.org") -> None:
    """Fetch what refresh reads for the shipped matrix and write trimmed copies into `dest`."""
    from envbuilder.upstream import refresh as R
    from envbuilder.cli.refresh import PyPIJson

    client = PyPIJson(base, timeout=60)
    projects = client.projects(R.PACKAGES)
    wanted = R.wanted_metadata(frozen(), projects, newest=3)
    metadata = client.metadata_of(wanted, projects)
    named = R.named_versions(frozen().sections)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.json"):
        old.unlink()
    for pkg in R.PACKAGES:
        doc = projects[pkg]
        rels = R.releases(doc)
        finals, pres = R.new_versions(R.newest_named(pkg, frozen().sections, named[pkg]), rels)
        detailed = set(wanted[pkg]) | ((set(finals) | set(pres)) if pkg in R.CATALOG else set())
        out = {}
        for v, files in doc["releases"].items():
            if v in detailed:
                out[v] = [
                    {
                        k: f[k]
                        for k in (
                            "filename",
                            "yanked",
                            "requires_python",
                            *(("yanked_reason",) if f.get("yanked") else ()),
                        )
                    }
                    for f in files
                    if re.search(r"linux.*x86_64\.whl$|none-any\.whl$|\.tar\.gz$", f["filename"])
                ] or [{"yanked": False}]
            else:
                states = []
                for f in files:
                    s = {"yanked": bool(f.get("yanked"))}
                    if f.get("yanked") and f.get("yanked_reason"):
                        s["yanked_reason"] = f["yanked_reason"]
                    if s not in states:
                        states.append(s)
                out[v] = states
        (dest / f"{pkg}.json").write_text(
            json.dumps(
                {"info": {"name": pkg, "version": doc["info"]["version"]}, "releases": out},
                indent=0,
                sort_keys=True,
            )
            + "\n"
        )
        for v, md in metadata[pkg].items():
            if "error" in md:
                continue
            keep = [
                line
                for line in md["requires_dist"]
                if (m := re.search(r"extra\s*==\s*['\"]([^'\"]+)", line)) is None
                or m.group(1) in ("default", "vllm")
            ]
            (dest / f"{pkg}-{v}.json").write_text(
                json.dumps(
                    {"info": {"requires_python": md["requires_python"], "requires_dist": keep}}, indent=0
                )
                + "\n"
            )


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    _record_fixtures()
