"""Run as a script by tests/test_resolve.py: resolve PROFILES in this fresh process and print,
as JSON, each environment and everything the resolution did outside its own memory, as the
interpreter's audit hooks see it (a file opened for writing, a file or folder made, moved or
removed, a socket, a subprocess). The matrix is loaded before the watch starts (loading it may
write its own sealed cache; resolving may not).

PURITY_PLANT (tests only) plants an impurity behind the caches, to prove the check sees it:
  state  the memory plan depends on this process (its pid), which a cache would hide
  write  the memory plan writes a file of its own even under ENVBUILD_NO_CACHE
  net    the memory plan opens a connection (to 127.0.0.1:9, which refuses it)
"""

from __future__ import annotations

import json
import os
import sys

WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
EVENTS = (
    "socket.connect",
    "socket.getaddrinfo",
    "socket.bind",
    "urllib.Request",
    "subprocess.Popen",
    "os.system",
    "os.posix_spawn",
    "os.fork",
    "os.exec",
    "os.rename",
    "os.remove",
    "os.mkdir",
    "os.rmdir",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.chmod",
    "os.utime",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.move",
    "tempfile.mkstemp",
    "tempfile.mkdtemp",
)
seen: list[str] = []
watching = False


def hook(event: str, args: tuple) -> None:
    if not watching:
        return
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if (isinstance(flags, int) and flags & WRITES) or (isinstance(mode, str) and set(mode) & set("wax+")):
            seen.append(f"open for writing: {path}")
    elif event in EVENTS:
        seen.append(f"{event}: {', '.join(repr(a) for a in args[:2])}")


def plant(kind: str) -> None:
    from envbuilder.model import memory

    real = memory.plan

    def planted(*args, **kwargs):
        out = real(*args, **kwargs)
        if kind == "state":
            # (a residue of 997, not 7: the test needs two of its fresh processes to differ,
            # which three pids of one residue mod 7 made a 1-in-49 miss)
            out = dict(out, margin=out["margin"] + (os.getpid() % 997 + 1) * 1e-6)
        elif kind == "write":
            with open(os.path.join(os.getcwd(), "planted.json"), "w") as f:
                json.dump(out, f, default=str)
        elif kind == "net":
            import socket

            try:
                socket.create_connection(("127.0.0.1", 9), timeout=1).close()
            except OSError:
                pass
        return out

    memory.plan = planted


def main(profiles: list[str]) -> None:
    global watching
    from envbuilder.model import matrix as M
    from envbuilder.model.resolve import resolve

    if os.environ.get("PURITY_PLANT"):
        plant(os.environ["PURITY_PLANT"])
    m = M.load()
    sys.addaudithook(hook)
    watching = True
    envs = {p: resolve(m, p).to_json() for p in profiles}
    watching = False
    print(json.dumps({"envs": envs, "events": seen}))


if __name__ == "__main__":
    main(sys.argv[1:])
