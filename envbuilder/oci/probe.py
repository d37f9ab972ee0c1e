"""Endpoint health: many endpoints probed in parallel through one HTTP session (oci/http.py),
the status the answer, no body read, each within 3 x its timeout. What to probe and which
statuses count as alive is the caller's (model/mirrors.probe_jobs for a mirror set)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from envbuilder.record import Record

if TYPE_CHECKING:
    import requests


class ProbeJob(Record):
    """One endpoint to probe: kind (registry, pypi, ...), target (what it stands in for:
    docker.io, pypi, ...), endpoint (as the mirror set names it), url (what is asked), alive
    (the statuses that count as answering)."""

    kind: str
    target: str
    endpoint: str
    url: str
    alive: tuple[int, ...]


class Probe(Record):
    kind: str
    target: str  # what it stands in for (docker.io, pypi, ...)
    endpoint: str
    ok: bool
    status: str
    latency_ms: float


_STATUS = {
    401: "HTTP 401 (credentials needed)",
    403: "HTTP 403 (refused: credentials?)",
    429: "HTTP 429 (rate limited)",
}


def _one(job: ProbeJob, timeout: float, s: requests.Session) -> Probe:
    from envbuilder.oci import http as net

    start = time.perf_counter()
    try:  # the status is the answer: no body is read, and all of it within 3 x timeout
        r = net.request(s, "GET", job.url, net.STATUS, timeout=timeout, deadline=3 * timeout)
    except net.NetError as e:
        ms = (time.perf_counter() - start) * 1000
        why = f"timeout ({e.reason})" if e.kind == "deadline" else e.reason
        return Probe(job.kind, job.target, job.endpoint, False, why, ms)
    ms = (time.perf_counter() - start) * 1000
    status = _STATUS.get(r.status, f"HTTP {r.status}")
    return Probe(job.kind, job.target, job.endpoint, r.status in job.alive, status, ms)


def run(jobs: list[ProbeJob], timeout: float = 5.0, ca_cert: str | None = None) -> list[Probe]:
    """Every job, in parallel (`ca_cert`: a CA bundle to trust too), through one session: no
    retries, no body read, at most 3 x `timeout` s each; the answers in the jobs' order."""
    from envbuilder.oci import http as net

    if not jobs:
        return []
    workers = min(16, len(jobs))
    with net.session(retries=0, ca_cert=ca_cert, pool=workers) as s:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda j: _one(j, timeout, s), jobs))
