"""`envbuild grid`: every cell is what `envbuild check` says of its combination; the HTML page is
self-contained and, opened in a real headless Chromium (Debian's), loads without console errors,
shows every cell as the resolver decided it, and its GPU and driver picker filter; and shell
completion offers profiles, mirror sets and the matrix's versions."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import unavailable
from envbuilder.cli.app import cli
from envbuilder.errors import EnvbuildError
from envbuilder.model import matrix
from envbuilder.model.resolve import STACK_FLAGS, Overrides, ResolveError, resolve
from envbuilder.model.versions import version_key
from envbuilder.render import grid as G

ROOT = Path(__file__).resolve().parent.parent
ENVBUILD = [sys.executable, "-m", "envbuilder.cli"]


@pytest.fixture(scope="module")
def m():
    return matrix.load(())


@pytest.fixture(scope="module")
def grid(m):
    return G.build(m)


def flags_argv(flags) -> list[str]:
    return [a for f, v in flags for a in (f"--{f}", v)]


def check(argv: list[str]) -> int:
    """`envbuild check ARGV`'s exit code, in this process (envbuild's main maps its errors so)."""
    result = CliRunner().invoke(cli, ["check", *argv])
    if isinstance(result.exception, EnvbuildError):
        return result.exception.exit_code
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code


def test_every_cell_is_what_check_says(grid):
    """✓: `envbuild check PROFILE FLAGS` exits 0; ~ and ✗: it exits 2, and for ~ the same
    command with the cell's named override exits 0."""
    seen = {"ok": 0, "fix": 0, "no": 0, "none": 0}
    for (i, j), cell in grid.cells[None].items():
        row, col = grid.rows[i], grid.columns[j]
        seen[cell.state] += 1
        if row.profile is None:
            assert cell.state == "none"
            continue
        argv = [row.asked, *flags_argv(col.flags)]  # (a card without a profile: by its own name)
        got = check(argv)
        assert got == (0 if cell.state == "ok" else 2), (row.asked, col, cell.state, got)
        if cell.state == "fix":
            assert check([*argv, *flags_argv(cell.fix)]) == 0, (row.asked, col, cell.fix)
            assert cell.command == "envbuild render " + " ".join([*argv, *flags_argv(cell.fix)])
        elif cell.state == "ok":
            assert cell.command == "envbuild render " + " ".join(argv)
    # every kind of verdict occurs (a grid of one verdict would prove little)
    assert all(seen.values()), seen
    assert {r.gpu for r in grid.rows} == set(matrix.load(()).gpus)


def test_a_driver_cell_is_what_check_says_with_that_driver(m):
    """--driver: each cell of the 4090's and the t4's rows against `check ... --driver`."""
    driver = "525.60.13"
    g = G.build(m, ("4090", "t4"), (driver,))
    for (i, j), cell in g.cells[driver].items():
        argv = [g.rows[i].profile, *flags_argv(g.columns[j].flags), "--driver", driver]
        if not set(dict(g.columns[j].flags)) & set(STACK_FLAGS) and cell.state != "ok":
            # with no stack flag, check takes the newest stack this driver runs where one
            # resolves (issue 34); the cell is the profile's own stack, which it does not
            out = CliRunner().invoke(cli, ["check", *argv])
            assert check(argv) == 2 or "NOTE: driver 525.60.13 runs CUDA" in out.output, argv
            continue
        assert check(argv) == (0 if cell.state == "ok" else 2), (argv, cell.state)
        if cell.state == "fix":
            assert check([*argv, *flags_argv(cell.fix)]) == 0
    # the old driver turns the shipped 4090 (CUDA 12.1) away from nothing, the shipped t4
    # (CUDA 13.0) into a cell that needs an override
    states = {(g.rows[i].profile, g.columns[j].label): c.state for (i, j), c in g.cells[driver].items()}
    assert states[("4090", "as shipped")] == "ok"
    assert states[("t4", "as shipped")] in ("fix", "no")


def test_the_terminal_grid_and_its_narrowing():
    out = subprocess.run([*ENVBUILD, "grid", "--gpu", "p40", "--details"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith(("p40", "4090"))]
    assert rows and all(line.startswith("p40") for line in rows)
    assert "flash-attn on the Tesla P40" in out.stdout  # a ✗ cell's reason, with --details
    bad = subprocess.run([*ENVBUILD, "grid", "--gpu", "p41"], capture_output=True, text=True)
    assert bad.returncode == 2 and "names no GPU of the matrix" in bad.stderr
    bad = subprocess.run([*ENVBUILD, "grid", "--driver", "five"], capture_output=True, text=True)
    assert bad.returncode == 2 and "not an NVIDIA driver version" in bad.stderr


def page_verdict(cell: dict, driver: str | None) -> str:
    """What the page shows for a cell under a driver (its script's rule, restated)."""
    if not driver or not cell["driver"] or cell["state"] not in ("ok", "fix"):
        return cell["state"]
    _, need, compat = cell["driver"]
    if version_key(driver) >= version_key(need) or version_key(driver) >= version_key(compat):
        return cell["state"]
    return "no"


def test_the_pages_driver_rule_is_the_resolvers(m, grid):
    """For every resolving cell and every driver level: the page keeps it exactly when the
    resolver accepts the cell's combination with that driver."""
    data = G.page_data(grid)
    for level in G.driver_levels(m):
        for (i, j), cell in grid.cells[None].items():
            if cell.state not in ("ok", "fix"):
                continue
            flags = dict(grid.columns[j].flags) | dict(cell.fix)
            try:
                resolve(
                    m,
                    grid.rows[i].profile,
                    G.overrides(tuple(flags.items()), level),
                    check_fixes=False,
                    pick_stack=False,
                )
                ok = True
            except ResolveError:
                ok = False
            assert (page_verdict(data["cells"][i][j], level) != "no") == ok, (grid.rows[i], flags, level)


def test_the_page_is_self_contained_and_escaped(tmp_path):
    page = tmp_path / "grid.html"
    out = subprocess.run([*ENVBUILD, "grid", "--html", str(page)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    # nothing is fetched: no external script, style, font, image or frame; links are <a href>
    assert not re.search(r"<(script|img|iframe|link|object|embed)\b[^>]*\b(src|href)=", text, re.I)
    assert "@import" not in text and "url(" not in text
    data = json.loads(
        re.search(r'<script type="application/json" id="grid-data">(.*?)</script>', text, re.S)[1]
    )
    assert "</" not in re.search(r'id="grid-data">(.*?)</script>', text, re.S)[1]
    assert len(data["rows"]) == len(matrix.load(()).gpus)


def test_hostile_text_stays_text(tmp_path):
    """A source note from an overlay with markup in it reaches the page as data, not markup."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    evil = "seed notes </script><img src=x onerror=alert(1)> & more"
    gpus = (ROOT / "matrices" / "gpus.yaml").read_text()
    p40 = "  p40:\n" + gpus.split("  p40:\n", 1)[1].split("  v100:")[0]
    p40 = re.sub(r"source: .*", "source: evil", p40)
    (overlay / "gpus.yaml").write_text(f"sources:\n  evil: {json.dumps(evil)}\ngpus:\n{p40}")
    page = tmp_path / "g.html"
    out = subprocess.run(
        [*ENVBUILD, "grid", "--gpu", "p40", "--matrix-dir", str(overlay), "--html", str(page)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert "<img" not in text and "</script><" not in text
    blob = re.search(r'<script type="application/json" id="grid-data">(.*?)</script>', text, re.S)[1]
    assert ["Tesla P40: evil", evil] in json.loads(blob)["sources"]


# -- the page in a real browser: Chromium's DevTools protocol over a pipe ------------------------


class Chromium:
    """Headless Chromium driven over --remote-debugging-pipe (fd 3 in, fd 4 out; each message a
    JSON object ended by NUL): no websocket library, no port."""

    def __init__(self, exe: str, profile_dir: Path):
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()

        def fds():
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile_dir}",
                "--no-first-run",
                "--window-size=1600,1200",
                "about:blank",
            ],
            close_fds=False,  # (subprocess would close fds 3 and 4 after preexec_fn made them)
            preexec_fn=fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.n, self.buf, self.events = 0, b"", []

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe")
            self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)

    def send(self, method: str, session: str | None = None, timeout: float = 30, **params) -> dict:
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            got = self._read(deadline)
            if got.get("id") == self.n:
                if "error" in got:
                    raise RuntimeError(f"{method}: {got['error']}")
                return got.get("result", {})
            self.events.append(got)

    def wait(self, event: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == event:
                return self.events.pop(i)
        while True:
            got = self._read(deadline)
            if got.get("method") == event:
                return got
            self.events.append(got)

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._w)
        os.close(self._r)


def chromium_exe() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    unavailable("Debian's chromium is not installed (tests/run.sh installs it as root)")


def test_the_page_in_headless_chromium(tmp_path, m, grid):
    exe = chromium_exe()
    page = tmp_path / "grid.html"
    out = subprocess.run([*ENVBUILD, "grid", "--html", str(page)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    browser = Chromium(exe, tmp_path / "profile")
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session)
        browser.send("Page.navigate", session, url=page.as_uri())
        browser.wait("Page.loadEventFired")

        def js(expr: str):
            r = browser.send("Runtime.evaluate", session, expression=expr, returnByValue=True)
            assert "exceptionDetails" not in r, r
            return r["result"].get("value")

        # every cell as the resolver decided it, in every row and column
        shown = js(
            "JSON.stringify([...document.querySelectorAll('td.cell')].map("
            "td => [+td.dataset.row, +td.dataset.col, td.dataset.state, td.textContent]))"
        )
        shown = {(i, j): (s, t) for i, j, s, t in json.loads(shown)}
        assert len(shown) == len(grid.rows) * len(grid.columns)
        for key, cell in grid.cells[None].items():
            assert shown[key] == (cell.state, G.MARK[cell.state]), (grid.rows[key[0]], grid.columns[key[1]])
        headers = json.loads(
            js("JSON.stringify([...document.querySelectorAll('thead tr.labels th')].map(t => t.textContent))")
        )
        assert headers == [c.label for c in grid.columns]

        # the picker: one GPU, then an old driver
        js("var s = document.getElementById('gpu'); s.value = 't4'; s.dispatchEvent(new Event('change')); 0")
        visible = json.loads(
            js(
                "JSON.stringify([...document.querySelectorAll('#grid tbody tr')].filter(r => !r.hidden).map(r => r.dataset.gpu))"
            )
        )
        assert visible == ["t4"]
        driver = "525.60.13"
        js(
            f"var d = document.getElementById('driver'); d.value = '{driver}'; d.dispatchEvent(new Event('input')); 0"
        )
        data = G.page_data(grid)
        shown = json.loads(
            js(
                "JSON.stringify([...document.querySelectorAll('td.cell')].map(td => [+td.dataset.row, +td.dataset.col, td.dataset.state]))"
            )
        )
        changed = 0
        for i, j, state in shown:
            want = page_verdict(data["cells"][i][j], driver)
            assert state == want, (grid.rows[i], grid.columns[j], state, want)
            changed += want != data["cells"][i][j]["state"]
        assert changed  # the old driver turned cells away (CUDA 13.0 needs 580.65.06 or newer)
        # what the old driver turned away is what the resolver turns away for that stack (the
        # profile's own, as the grid's first column is; with no stack flag the resolver picks the
        # newest stack the driver runs instead, which the cell's details offer)
        t4 = next(i for i, r in enumerate(grid.rows) if r.profile == "t4")
        with pytest.raises(ResolveError):
            resolve(m, "t4", Overrides(driver=driver), pick_stack=False)
        assert shown[t4 * len(grid.columns)][2] == "no"
        assert resolve(m, "t4", Overrides(driver=driver)).cuda.version != "13.0"

        # hovering a cell shows its rule, its sources and its render command
        j = next(j for j, c in enumerate(grid.columns) if c.label == "flash-attn")
        p40 = next(i for i, r in enumerate(grid.rows) if r.profile == "p40")
        js("var s = document.getElementById('gpu'); s.value = ''; s.dispatchEvent(new Event('change')); 0")
        js(
            f'document.querySelector(\'td.cell[data-row="{p40}"][data-col="{j}"]\')'
            ".dispatchEvent(new MouseEvent('mouseover', {bubbles: true})); 0"
        )
        details = js("document.getElementById('details').innerText")
        assert "[flash-attn-cc]" in details and "envbuild render p40 --with flash-attn" in details
        links = json.loads(
            js("JSON.stringify([...document.querySelectorAll('#details a')].map(a => a.href))")
        )
        assert links and all(u.startswith("https://") for u in links)

        png = tmp_path / "grid.png"
        shot = browser.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        import base64

        png.write_bytes(base64.b64decode(shot["data"]))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        if os.environ.get("ENVBUILD_GRID_PNG"):
            shutil.copyfile(png, os.environ["ENVBUILD_GRID_PNG"])

        errors = [
            e
            for e in browser.events
            if (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
            or e.get("method") == "Runtime.exceptionThrown"
            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
        ]
        assert errors == []
        requests = [
            e["params"]["request"]["url"]
            for e in browser.events
            if e.get("method") == "Network.requestWillBeSent"
        ]
        assert requests and all(u == page.as_uri() for u in requests), requests  # nothing else fetched
    finally:
        browser.close()


# -- shell completion ---------------------------------------------------------------------------


def complete(words: str, tmp_path: Path, **env) -> list[str]:
    """What bash completion offers for `words` (click's bash_complete protocol, a real process)."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    out = subprocess.run(
        ENVBUILD,
        env=dict(
            os.environ,
            COMP_WORDS=words,
            COMP_CWORD=str(cword),
            _ENVBUILD_COMPLETE="bash_complete",
            ENVBUILD_CONFIG=str(tmp_path / "config.yaml"),
            **env,
        ),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines()]


def test_completion(tmp_path, m):
    (tmp_path / "config.yaml").write_text(
        "mirrors:\n  corp:\n    description: ours\n    pypi: [https://pypi.corp.example/simple]\n"
    )
    assert complete("envbuild render ", tmp_path) == list(m.profiles)
    assert complete("envbuild check 40", tmp_path) == ["4090"]
    assert set(complete("envbuild render p40 --mirror ", tmp_path)) == {"corp", *m.mirrors}
    assert "auto" in complete("envbuild build --mirror ", tmp_path)
    torch = complete("envbuild render p40 --torch 2.1", tmp_path)
    assert torch and all(t.startswith("2.1") and t in m.torch for t in torch)
    assert complete("envbuild check 4090 --verl ", tmp_path) == sorted(m.verl, key=version_key, reverse=True)
    assert complete("envbuild render 4090 --vllm 0.8", tmp_path) == ["0.8.5.post1", "0.8.5"]
    assert complete("envbuild render p40 --with ", tmp_path) == ["apex", "flash-attn"]
    assert complete("envbuild grid --gpu rtx", tmp_path) == ["rtx-a6000", "rtx-6000-ada", "rtx-pro-6000"]
    # an overlay's profile completes too (--matrix-dir read from the command line)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    block = (ROOT / "matrices" / "profiles.yaml").read_text().split("  p40:\n", 1)[1].split('  "4090":')[0]
    block = block.replace("source: p40_seed", "source: https://example.invalid/seed")
    (overlay / "mine.yaml").write_text("profiles:\n  p40-mine:\n" + block)
    assert complete(f"envbuild render --matrix-dir {overlay} p40", tmp_path) == ["p40", "p40-mine"]
