"""One way for envbuild to talk HTTP: a requests session, and a reader of what it answers.

Every client in envbuild (the registry client, the mirror probe, the index probe that lock and
verify share, refresh's JSON client and range reader, the wheelhouse's page of a build index,
lock's source pins, the wheelhouse downloads) gets its session here, so they all behave alike:

- retries: connection failures, 429 and 5xx on HEAD and GET, a few times with backoff; a
  `Retry-After` is honoured up to MAX_RETRY_AFTER seconds and never past the request's deadline
  (a registry answering "retry in an hour" does not hold a build for an hour);
- proxies and CAs from the environment (HTTPS_PROXY, NO_PROXY, REQUESTS_CA_BUNDLE; requests'
  trust_env), plus an extra CA file where the command takes one (--ca-cert): that file and the
  system's CAs, as one bundle that lives as long as the session;
- at most MAX_REDIRECTS redirects; credentials in a URL go as Basic auth to that host only
  (requests drops the Authorization header when a redirect leaves the host);
- a size cap on every body, chosen by what is expected (`Expect`: a manifest, a token, an
  index page, a JSON API answer, or only a status), read as a stream and abandoned with an
  error as soon as it is passed;
- a deadline on the whole exchange (connecting, headers, body, retries): a server that sends a
  byte a second never times out a read, so a watchdog shuts the connection down when the
  deadline passes, even mid-header;
- credentials are never printed: `redact` turns `user:password@` into `***@` and hides
  Authorization values, and every message made here goes through it.

`request` returns an `Answer` (status, headers, body) or raises NetError (an ActionError whose
`reason` says in a few words what failed, in the words of its fix); the caller words the
paragraph around it. `json_value` / `json_object` turn a body into JSON of the kind expected, or
raise BadAnswer naming the URL and what came instead (an HTML page: a captive portal; a list, a
string; nesting too deep).

`index_answers` is the one answer to "does this index answer?" (see there for the rule).

requests loads only when a session is made: importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from envbuilder.errors import ActionError, UserError
from envbuilder.text import redact as redact  # (callers read it as net.redact)
from envbuilder.record import Record
from envbuilder.secret import SecretUrl

if TYPE_CHECKING:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    class BundleSession(requests.Session):
        """(What _classes' Session is, for the type checker: a requests session that may own
        a CA bundle file.)"""

        bundle: str | None


MAX_REDIRECTS = 10
MAX_RETRY_AFTER = 10.0  # seconds: the most a server's Retry-After makes a client wait per retry
MAX_JSON_DEPTH = 64  # PyPI's and registries' answers are 4-6 levels deep
CHUNK = 64 << 10
DEADLINE_SCALE = 1.0  # every deadline is multiplied by this (tests shrink them all at once)


class Expect(Record):
    """What a request expects back: `what` names it in messages, `max_bytes` caps its body (0:
    the status and headers are all that is read), `deadline` bounds the whole exchange in s."""

    what: str
    max_bytes: int
    deadline: float


# A manifest or an image index is a few KB; distribution refuses manifests over 4 MiB.
MANIFEST = Expect("a registry manifest", 4 << 20, 120.0)
# Docker Hub's and nvcr.io's anonymous tokens are 1-4 KB of JSON.
TOKEN = Expect("a registry token", 1 << 20, 60.0)
# /v2/ says "registry" by its status (200, or 401 with a challenge); its body is not read.
REGISTRY_ROOT = Expect("a registry's /v2/ answer", 0, 60.0)
# A PEP 503 page: PyPI's uv/ and torch/ pages are 1-3 MB.
INDEX_PAGE = Expect("a package index page", 32 << 20, 300.0)
# PyPI's JSON API: ray's project page is 1.5 MB.
JSON_API = Expect("a JSON API answer", 64 << 20, 300.0)
# A probe: is anything there? Status only.
STATUS = Expect("a status", 0, 60.0)


class Answer(Record):
    status: int
    headers: Mapping[str, str]  # requests' case-insensitive headers
    body: bytes
    url: str  # where it came from, after redirects


class NetError(ActionError):
    """No usable answer from `url`: `reason` in a few words (refused, DNS, TLS, timeout, a body
    over its cap, a redirect loop, the deadline); `kind` one word for code to sort on."""

    def __init__(self, url: str, reason: str, kind: str):
        self.url, self.reason, self.kind = redact(url), redact(reason), kind
        super().__init__(f"{self.url}: {self.reason}")


class BadAnswer(ActionError):
    """An answer that is not what was expected (HTML, a list, a string, nesting too deep):
    `url` (redacted) `detail` ("answered a list where ... belongs"); the message adds `advice`."""

    def __init__(self, url: str, detail: str, advice: str = ""):
        self.url, self.detail = redact(url), redact(detail)
        super().__init__(f"{self.url} {self.detail}." + (f" {advice}" if advice else ""))


# ---- credentials ---------------------------------------------------------------------------

# an Authorization value (not a challenge's `Basic realm="..."`)


# ---- the session ------------------------------------------------------------------------------

_FLIGHTS: dict[int, "_Flight"] = {}  # thread -> the request it has in flight
_FLIGHTS_LOCK = threading.Lock()


class _Expired(Exception):
    """The request's deadline passed (raised where urllib3 would otherwise retry)."""


class _Flight:
    """One request's deadline, and the connection it is on (so a watchdog can cut it)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.conn: object = None
        self.expired = self.done = False
        self.lock = threading.Lock()

    def on(self, conn: object) -> None:
        with self.lock:
            if self.expired:
                raise _Expired()
            self.conn = conn

    def expire(self) -> None:
        with self.lock:
            if self.done:
                return
            self.expired = True
            conn = self.conn
        import socket

        sock = getattr(conn, "sock", None)
        if isinstance(sock, socket.socket):
            try:  # a read blocked on it returns at once (end of file)
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def _current() -> _Flight | None:
    return _FLIGHTS.get(threading.get_ident())


def _classes() -> tuple[type[HTTPAdapter], type[Retry], type[BundleSession]]:
    """urllib3 subclasses that tell the request in flight which connection it is on, a Retry
    that caps Retry-After, and a Session that owns its CA bundle; made on first use (requests
    and urllib3 load then)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
    from urllib3.poolmanager import ProxyManager
    from urllib3.response import BaseHTTPResponse
    from urllib3.util.retry import Retry

    # (an HTTPConnection itself, so that WatchedHTTPS's order is Watched, HTTPSConnection,
    # HTTPConnection: super() in Watched is the TLS connection's method there)
    class Watched(HTTPConnection):
        def connect(self) -> None:
            flight = _current()
            if flight is not None:
                flight.on(self)
            return super().connect()

        def request(self, *args: Any, **kwargs: Any) -> None:
            flight = _current()
            if flight is not None:
                flight.on(self)
            return super().request(*args, **kwargs)

        def getresponse(self, *args: Any, **kwargs: Any) -> Any:  # (urllib3's and http.client's differ)
            flight = _current()
            if flight is not None:
                flight.on(self)
            return super().getresponse(*args, **kwargs)

    class WatchedHTTP(Watched):
        pass

    class WatchedHTTPS(Watched, HTTPSConnection):
        pass

    class Pool(HTTPConnectionPool):
        ConnectionCls = WatchedHTTP

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = WatchedHTTPS

    pools: dict[str, type[HTTPConnectionPool]] = {"http": Pool, "https": TLSPool}

    class CappedRetry(Retry):
        def get_retry_after(self, response: BaseHTTPResponse) -> float | None:
            seconds = super().get_retry_after(response)
            if seconds is None:
                return None
            flight = _current()
            return max(0.0, min(seconds, MAX_RETRY_AFTER, flight.left() if flight else MAX_RETRY_AFTER))

    class Adapter(HTTPAdapter):
        def init_poolmanager(
            self, connections: int, maxsize: int, block: bool = False, **kwargs: object
        ) -> None:
            super().init_poolmanager(connections, maxsize, block, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy: str, **kwargs: object) -> object:
            manager: object = super().proxy_manager_for(proxy, **kwargs)
            if type(manager) is ProxyManager:  # (a SOCKS proxy keeps its own pools)
                manager.pool_classes_by_scheme = pools
            return manager

    class Session(requests.Session):
        """A session that may own a CA bundle file, removed when it closes."""

        bundle: str | None = None

        def close(self) -> None:
            super().close()
            if self.bundle:
                try:
                    os.unlink(self.bundle)
                except OSError:
                    pass
                self.bundle = None

        def __del__(self) -> None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - (at interpreter exit, modules may be gone)
                pass

    # (Session is what BundleSession declares for the type checker; one is made only here)
    made = (Adapter, CappedRetry, cast("type[BundleSession]", Session))
    _CLASSES = made
    return made


_CLASSES: tuple[type[HTTPAdapter], type[Retry], type[BundleSession]] | None = None


def session(
    *,
    retries: int = 3,
    ca_cert: str | os.PathLike[str] | None = None,
    pool: int = 10,
    user_agent: str | None = None,
) -> BundleSession:
    """A requests session as described above. `retries`: tries after the first for connection
    failures, 429 and 5xx on HEAD/GET (0: none, the caller retries itself). `ca_cert`: a CA file
    to trust beside the system's (the bundle file goes when the session closes). `pool`:
    connections kept per host (one per thread that uses the session at once)."""
    adapter_cls, retry_cls, session_cls = _classes()
    if retries:
        retry = retry_cls(
            total=retries,
            connect=retries,
            read=2,
            backoff_factor=0.5,
            status_forcelist=(429, 500, 502, 503, 504),
            allowed_methods=("HEAD", "GET"),
            respect_retry_after_header=True,
            raise_on_status=False,
        )
    else:
        retry = retry_cls(total=0, read=False, redirect=False)
    s = session_cls()
    adapter = adapter_cls(pool_connections=pool, pool_maxsize=pool, max_retries=retry)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    s.max_redirects = MAX_REDIRECTS
    s.hooks["response"].append(_drop_redirect_body)
    if user_agent:
        s.headers["User-Agent"] = user_agent
    if ca_cert:
        s.verify = s.bundle = _bundle_file(ca_cert)
    return s


def _drop_redirect_body(r: requests.Response, **kwargs: object) -> requests.Response:
    """A redirect's body is never read: requests reads it whole (resp.content) before it
    follows the Location, so a 302 with a body that does not end would fill the memory. The
    connection is closed instead, with whatever it still had to send."""
    if r.is_redirect:
        # (requests' own state of a read body: the body is now the empty one, already read)
        r._content = b""
        setattr(r, "_content_consumed", True)
        r.raw.close()
    return r


SYSTEM_CAS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def ca_bundle(ca_cert: str | os.PathLike[str] | None) -> bool | str:
    """requests' `verify`: True (its own CAs) without `ca_cert`; else the path of a new file
    (0600, the caller removes it) holding `ca_cert` and the system's CAs."""
    return _bundle_file(ca_cert) if ca_cert else True


def _bundle_file(ca_cert: str | os.PathLike[str]) -> str:
    import tempfile
    from pathlib import Path

    try:
        parts = [Path(ca_cert).read_bytes()]
    except OSError as e:
        raise UserError(
            f"Cannot read the CA file {ca_cert}: {e.strerror}. Pass a readable PEM file to --ca-cert."
        ) from None
    for system in SYSTEM_CAS:
        if Path(system).is_file():
            parts.append(Path(system).read_bytes())
            break
    fd, path = tempfile.mkstemp(prefix="envbuild-ca-", suffix=".pem")
    with os.fdopen(fd, "wb") as f:
        f.write(b"\n".join(parts))
    return path


# ---- a request, and its body ----------------------------------------------------------------


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def request(
    s: requests.Session,
    method: str,
    url: str,
    expect: Expect,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    timeout: float = 30.0,
    deadline: float | None = None,
    allow_redirects: bool = True,
    sink: Callable[[bytes], object] | None = None,
    body_if: Callable[[int], bool] | None = None,
) -> Answer:
    """One exchange through session `s`: the answer, with at most `expect.max_bytes` of body
    (none for HEAD or a status-only Expect), all within `deadline` s (default the Expect's).
    `timeout`: the most to wait to connect and for each read. `sink`: a function that takes
    the body chunk by chunk instead (a download hashed as it streams; Answer.body is then
    empty). `body_if`: a function of the status; the body is read only where it says so (a
    download reads no error page). NetError on any failure."""
    import requests

    seconds = (expect.deadline if deadline is None else deadline) * DEADLINE_SCALE
    flight = _Flight(seconds)
    me = threading.get_ident()
    with _FLIGHTS_LOCK:
        _FLIGHTS[me] = flight
    watchdog = threading.Timer(seconds, flight.expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            with s.request(
                method,
                url,
                headers=headers,
                params=params,
                timeout=timeout,
                stream=True,
                allow_redirects=allow_redirects,
            ) as r:
                body = b""
                if method != "HEAD" and expect.max_bytes and (body_if is None or body_if(r.status_code)):
                    body = _read(r, expect, flight, url, sink)
                answer = Answer(r.status_code, r.headers, body, r.url)
        except _Expired:
            raise _late(url, flight) from None
        except requests.TooManyRedirects:
            raise NetError(
                url, f"more than {MAX_REDIRECTS} redirects (a redirect loop?)", "redirects"
            ) from None
        except NetError:
            raise
        except (requests.RequestException, OSError, ValueError) as e:
            if flight.expired:
                raise _late(url, flight) from None
            raise NetError(url, reason(e, timeout), _kind(e)) from None
        if flight.expired:  # (a body the watchdog cut can look like one that ended)
            raise _late(url, flight)
        return answer
    finally:
        with flight.lock:
            flight.done = True
        watchdog.cancel()
        with _FLIGHTS_LOCK:
            _FLIGHTS.pop(me, None)


def _late(url: str, flight: _Flight) -> NetError:
    return NetError(
        url,
        f"no complete answer within {flight.seconds:g} s (a server that stalls or sends too slowly)",
        "deadline",
    )


def _too_large(url: str, expect: Expect) -> NetError:
    return NetError(
        url,
        f"answered more than {_size(expect.max_bytes)} for {expect.what} (a "
        "body that does not end?); stopped reading there",
        "too-large",
    )


def _read(
    r: requests.Response,
    expect: Expect,
    flight: _Flight,
    url: str,
    sink: Callable[[bytes], object] | None = None,
) -> bytes:
    length = r.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > expect.max_bytes and "Content-Encoding" not in r.headers:
        raise _too_large(url, expect)
    body, size = bytearray(), 0
    for chunk in r.iter_content(CHUNK):
        size += len(chunk)
        if size > expect.max_bytes:
            raise _too_large(url, expect)
        if flight.expired or time.monotonic() > flight.deadline:
            raise _Expired()
        if sink is None:
            body += chunk
        else:
            sink(chunk)
    return bytes(body)


def _kind(e: Exception) -> str:
    word = reason(e, 0)
    return (
        "tls"
        if word.startswith("TLS")
        else "dns"
        if word.startswith("DNS")
        else "timeout"
        if word.startswith("timeout")
        else "refused"
        if word.startswith("conn")
        else "other"
    )


def reason(e: Exception, timeout: float) -> str:
    """What a failed request met, in the words of its fix: TLS interception, DNS, refused,
    timeout (requests' SSLError is a ConnectionError, so TLS is told apart first)."""
    import requests

    text = str(e)
    if isinstance(e, requests.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" in text:
        return "TLS verification failed (a TLS-intercepting proxy? CERTIFICATE_VERIFY_FAILED)"
    if isinstance(e, requests.Timeout):
        return f"timeout after {timeout:g}s"
    if isinstance(e, requests.ConnectionError):
        if any(
            s in text
            for s in (
                "NameResolutionError",
                "Name or service not known",
                "Temporary failure in name resolution",
                "nodename nor servname",
            )
        ):
            return "DNS: the host name does not resolve here"
        return "connection refused/unreachable"
    first = (text.splitlines() or [""])[0][:200]
    return redact(f"{type(e).__name__}: {first}" if first else type(e).__name__)


# ---- JSON of the kind expected ----------------------------------------------------------------


def kind_of(value: object) -> str:
    """A JSON value's kind, as messages name it."""
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "true/false",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(value), "a value")


_ADVICE = "Check the URL, or whether a proxy answers in the server's place."


def json_value(body: bytes, url: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """`body` as JSON, or BadAnswer naming `url` (redacted) and `what` was expected: an HTML
    page (a captive portal, a proxy's sign-in or error page), text that is not JSON, NaN or
    Infinity, nesting deeper than `max_depth`."""
    if body.lstrip()[:1] == b"<":
        raise BadAnswer(
            url,
            f"answered an HTML page where {what} (JSON) belongs (a captive "
            "portal, or a proxy's sign-in or error page?)",
            "Check the network (sign in, or set HTTPS_PROXY), or the URL.",
        )

    def refuse(constant: str) -> float:
        raise ValueError(f"{constant} is not a JSON number")

    doc: object
    try:
        doc = json.loads(body, parse_constant=refuse)
    except RecursionError:
        doc, depth = None, max_depth + 1
    except (ValueError, UnicodeDecodeError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise BadAnswer(
            url, f"answered something that is not JSON where {what} belongs ({first})", _ADVICE
        ) from None
    else:
        depth = _depth(doc, max_depth)
    if depth > max_depth:
        raise BadAnswer(
            url, f"answered JSON nested more than {max_depth} levels deep where {what} belongs", _ADVICE
        )
    return doc


def json_object(body: bytes, url: str, what: str) -> dict[str, object]:
    """`body` as a JSON object (json_value's checks, and then the kind)."""
    doc = json_value(body, url, what)
    if not isinstance(doc, dict):
        raise BadAnswer(url, f"answered {kind_of(doc)} where {what} (a JSON object) belongs", _ADVICE)
    return doc


def _depth(doc: object, limit: int) -> int:
    """The nesting depth of `doc` (stops counting past `limit`)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            children: Iterable[object] = node.values() if isinstance(node, dict) else node
            stack.extend((v, depth + 1) for v in children)
    return deepest


# ---- does this index answer? ---------------------------------------------------------------------


def index_answers(index: str | SecretUrl, timeout: float = 5.0, s: requests.Session | None = None) -> bool:
    """Whether the PEP 503 index at `url` answers, by one rule for every caller (lock's
    classification of a failed resolution, check --resolve's and verify's choice to take PyPI's
    torch when the PyTorch index is out of reach):

      a GET of `<url>/torch/` answers 2xx, or it answers 404 and a GET of `<url>/` answers 2xx
      (an index without torch), following at most MAX_REDIRECTS redirects, within 3 x `timeout`.

    Anything else is no: no connection, TLS refused, a 401/403 (uv and pip would be refused the
    same), a 5xx, a redirect loop, a server that stalls. Credentials in the URL are sent as
    Basic auth, as uv and pip send them. No body is read. A file:// index answers when its
    folder exists."""
    from pathlib import Path
    from urllib.parse import unquote, urlsplit

    url = index.reveal() if isinstance(index, SecretUrl) else index  # (sent as Basic auth)
    parts = urlsplit(url)
    if parts.scheme == "file":
        return Path(unquote(parts.path)).is_dir()
    if parts.scheme not in ("http", "https"):
        return False
    own = s is None
    s = s or session(retries=0)
    try:
        for page in (url.rstrip("/") + "/torch/", url.rstrip("/") + "/"):
            try:
                got = request(s, "GET", page, STATUS, timeout=timeout, deadline=3 * timeout)
            except NetError:
                return False
            if 200 <= got.status < 300:
                return True
            if got.status != 404:
                return False
        return False
    finally:
        if own:
            s.close()
