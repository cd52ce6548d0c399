"""A real kube-apiserver backed by a real etcd, for integration tests.

This is the same idea as controller-runtime's envtest: ``scripts/envtest.sh``
builds (once, then caches) ``kube-apiserver`` and ``etcd`` from source, and
:class:`KubeAPIServer` runs them on 127.0.0.1 with throwaway PKI, a static
admin token (group ``system:masters``), RBAC authorization and the
service-account flags the apiserver requires. No kubelet, scheduler or
controller-manager runs: objects are stored and watched, nothing reconciles
them (no default ServiceAccount is created, no EndpointSlice is derived from a
Service, no namespace is finalized away).

Usage from a test module (an assignment, not an import of the name, so that
ruff does not report each test argument as shadowing an import)::

    from testkit import kubeapi
    from testkit.kubeapi import KubeAPIServer

    kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

    def test_x(kube_apiserver: KubeAPIServer) -> None:
        api = kubernetes.config.new_client_from_config(str(kube_apiserver.kubeconfig_path))

Non-admin identities (for RBAC checks) come from :meth:`KubeAPIServer.token_for`
/ :meth:`KubeAPIServer.token_kubeconfig_for`, which work at any time, also on
the shared session fixture: the apiserver asks a token-review webhook served
from this process for tokens it does not know. Mind that the aggregated
ClusterRoles (``view``, ``edit``, ``admin``) are empty here, since their rules
are filled in by kube-controller-manager; bind explicit (Cluster)Roles.

Tests sharing the session server should work in their own namespace (and
clean up cluster-scoped objects such as Nodes): deleted namespaces stay
``Terminating`` for good without the namespace controller.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime
import http.server
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from testkit.net import free_ports
from testkit.polling import eventually_sync

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
ENVTEST_SCRIPT: Final = REPO_ROOT / "scripts" / "envtest.sh"

ADMIN_USER: Final = "meshbridge-test-admin"
ADMIN_GROUPS: Final = ("system:masters",)
SERVICE_CLUSTER_IP_RANGE: Final = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"

_LOG_TAIL_LINES: Final = 60


class KubeAPIServerError(RuntimeError):
    """etcd or kube-apiserver could not be built, started or reached."""


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def envtest_binaries(timeout: float = 1800.0) -> Path:
    """Run ``scripts/envtest.sh`` (building on first use) and return the binary dir."""
    try:
        proc = subprocess.run(
            ["bash", str(ENVTEST_SCRIPT)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KubeAPIServerError(f"{ENVTEST_SCRIPT} took longer than {timeout:.0f}s") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        stderr_tail = "\n".join(proc.stderr.splitlines()[-_LOG_TAIL_LINES:])
        raise KubeAPIServerError(
            f"{ENVTEST_SCRIPT} failed with exit code {proc.returncode}:\n{stderr_tail}"
        )
    bindir = Path(lines[-1])
    for name in ("etcd", "kube-apiserver"):
        if not os.access(bindir / name, os.X_OK):
            raise KubeAPIServerError(f"{ENVTEST_SCRIPT} printed {bindir}, which lacks {name}")
    return bindir


# --------------------------------------------------------------------------- PKI


@dataclass(frozen=True)
class _PKI:
    ca_path: Path
    serving_cert_path: Path
    serving_key_path: Path
    sa_key_path: Path


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _make_pki(directory: Path) -> _PKI:
    """A self-signed CA, a serving cert for 127.0.0.1/localhost and an SA key."""
    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(hours=1)
    not_after = now + datetime.timedelta(days=7)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshbridge-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = _PKI(
        ca_path=directory / "ca.crt",
        serving_cert_path=directory / "apiserver.crt",
        serving_key_path=directory / "apiserver.key",
        sa_key_path=directory / "sa.key",
    )
    pki.ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.serving_cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pki.serving_key_path, _pem_key(key))
    _write_private(pki.sa_key_path, _pem_key(sa_key))
    return pki


# ------------------------------------------------------------ token webhook


class _TokenReviewHandler(http.server.BaseHTTPRequestHandler):
    """Answers kube-apiserver's TokenReview webhook calls from a token table."""

    server: _TokenReviewServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            review: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
            token = str(review.get("spec", {}).get("token", ""))
        except (ValueError, AttributeError):
            self.send_error(400)
            return
        identity = self.server.lookup(token)
        status: dict[str, Any] = {"authenticated": False}
        if identity is not None:
            user, groups = identity
            status = {
                "authenticated": True,
                "user": {"username": user, "uid": user, "groups": list(groups)},
            }
        body = json.dumps(
            {
                "apiVersion": review.get("apiVersion", "authentication.k8s.io/v1"),
                "kind": "TokenReview",
                "status": status,
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _TokenReviewServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _TokenReviewHandler)
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._by_identity: dict[tuple[str, tuple[str, ...]], str] = {}
        self._thread = threading.Thread(
            target=self.serve_forever, name="kubeapi-token-webhook", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/tokenreview"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)

    def lookup(self, token: str) -> tuple[str, tuple[str, ...]] | None:
        with self._lock:
            return self._tokens.get(token)

    def token_for(self, user: str, groups: Sequence[str]) -> str:
        identity = (user, tuple(groups))
        with self._lock:
            token = self._by_identity.get(identity)
            if token is None:
                token = secrets.token_urlsafe(24)
                self._tokens[token] = identity
                self._by_identity[identity] = token
            return token


# ------------------------------------------------------------------ processes


class _Process:
    """A child process whose output goes to a log file, killed on stop."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        argv = self.argv
        setpriv = shutil.which("setpriv")
        # Kill the child if the thread that started it dies (e.g. pytest is
        # SIGKILLed). The death signal follows the *thread*, so only arm it
        # when starting from the main thread, which lives as long as pytest.
        if setpriv and threading.current_thread() is threading.main_thread():
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The process's id (setpriv executes the program in its own process)."""
        return None if self._proc is None else self._proc.pid

    def stop(self, grace: float = 10.0, *, kill: bool = False) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (at once if ``kill``)."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


# Every started server, so that an interpreter exit still kills the children.
_LIVE: set[KubeAPIServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


class KubeAPIServer:
    """etcd + kube-apiserver on 127.0.0.1, with throwaway PKI and data dir.

    Attributes available after :meth:`start`: ``url`` (``https://127.0.0.1:PORT``),
    ``token`` (admin bearer token, group ``system:masters``), ``ca_path``,
    ``kubeconfig_path`` (admin kubeconfig), ``etcd_url``, ``workdir`` (logs are
    ``etcd.log`` and ``kube-apiserver.log`` in it).
    """

    def __init__(
        self,
        *,
        startup_timeout: float = 120.0,
        build_timeout: float = 1800.0,
        watch_cache: bool = False,
        extra_apiserver_args: Sequence[str] = (),
        extra_etcd_args: Sequence[str] = (),
        keep_workdir: bool = False,
        etcd_data_dir: Path | None = None,
    ) -> None:
        """Configure (not start) the pair.

        ``watch_cache`` is off by default: every list and watch then goes
        straight to etcd, so :meth:`compact_etcd` makes a watch from any older
        resourceVersion fail with 410 Gone at once, as the tests of relist
        logic need. With ``watch_cache=True`` (as in a real cluster) the
        apiserver serves watches from its in-memory window instead and etcd
        compaction alone no longer yields 410; see :meth:`compact_etcd`.
        ``extra_apiserver_args`` (``extra_etcd_args``) are appended to (and so
        override) the kube-apiserver (etcd) flags. ``etcd_data_dir`` keeps etcd's
        data there instead of in the throwaway workdir, and starts on whatever it
        already holds (a benchmark fills a big cluster once and starts on it
        again later); it is never removed.
        """
        self.startup_timeout = startup_timeout
        self.build_timeout = build_timeout
        self.watch_cache = watch_cache
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.extra_etcd_args = list(extra_etcd_args)
        self.etcd_data_dir = etcd_data_dir
        self.keep_workdir = keep_workdir or bool(os.environ.get("MESHBRIDGE_KEEP_KUBEAPI_DIR"))

        self.workdir: Path | None = None
        self.bindir: Path | None = None
        self.token = secrets.token_urlsafe(32)
        self.url = ""
        self.etcd_url = ""
        self.ca_path = Path()
        self.kubeconfig_path = Path()
        self._port = 0
        self._pki: _PKI | None = None
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._webhook: _TokenReviewServer | None = None
        self._kubeconfigs: dict[tuple[str, tuple[str, ...]], Path] = {}

    # ----------------------------------------------------------- lifecycle

    def __enter__(self) -> KubeAPIServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def started(self) -> bool:
        return self._apiserver is not None

    @property
    def apiserver_pid(self) -> int | None:
        """The kube-apiserver's process id (a benchmark reads its CPU time)."""
        return None if self._apiserver is None else self._apiserver.pid

    def start(self) -> None:
        """Build if needed, then start etcd and kube-apiserver; wait for /readyz."""
        if self.workdir is not None:
            raise KubeAPIServerError("already started")
        self.bindir = envtest_binaries(self.build_timeout)
        self.workdir = Path(tempfile.mkdtemp(prefix="meshbridge-kubeapi-"))
        _LIVE.add(self)
        try:
            self._start_all()
        except BaseException:
            keep, self.keep_workdir = self.keep_workdir, True  # for the logs
            try:
                self.stop()
            finally:
                self.keep_workdir = keep
            raise

    def _start_all(self) -> None:
        assert self.workdir is not None and self.bindir is not None
        wd = self.workdir
        self._pki = _make_pki(wd)
        self.ca_path = self._pki.ca_path

        etcd_client, etcd_peer, self._port = free_ports(3)
        self.etcd_url = f"http://127.0.0.1:{etcd_client}"
        self.url = f"https://127.0.0.1:{self._port}"
        peer_url = f"http://127.0.0.1:{etcd_peer}"
        self._etcd = _Process(
            "etcd",
            [
                str(self.bindir / "etcd"),
                "--name=meshbridge-test",
                f"--data-dir={self.etcd_data_dir or wd / 'etcd-data'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=meshbridge-test={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                *self.extra_etcd_args,
            ],
            wd / "etcd.log",
        )
        self._etcd.start()
        self._wait_for(self._etcd, "etcd", self._etcd_healthy)

        self._webhook = _TokenReviewServer()
        self._webhook.start()
        webhook_kubeconfig = wd / "token-webhook.kubeconfig"
        webhook_kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "webhook", "cluster": {"server": self._webhook.url}}],
                    "users": [{"name": "apiserver", "user": {}}],
                    "contexts": [
                        {"name": "webhook", "context": {"cluster": "webhook", "user": "apiserver"}}
                    ],
                    "current-context": "webhook",
                }
            )
        )
        token_file = wd / "tokens.csv"
        groups = ",".join(ADMIN_GROUPS)
        _write_private(token_file, f'{self.token},{ADMIN_USER},{ADMIN_USER},"{groups}"\n'.encode())

        pki = self._pki
        args = [
            str(self.bindir / "kube-apiserver"),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self._port}",
            f"--cert-dir={wd / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert_path}",
            f"--tls-private-key-file={pki.serving_key_path}",
            f"--etcd-servers={self.etcd_url}",
            f"--token-auth-file={token_file}",
            f"--authentication-token-webhook-config-file={webhook_kubeconfig}",
            "--authentication-token-webhook-version=v1",
            "--authentication-token-webhook-cache-ttl=10s",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_key_path}",
            f"--service-account-signing-key-file={pki.sa_key_path}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # No controller-manager creates "default" ServiceAccounts, so the
            # ServiceAccount admission plugin would reject every Pod.
            "--disable-admission-plugins=ServiceAccount",
            # The apiserver would publish 127.0.0.1 as the endpoint of
            # default/kubernetes, which Endpoints validation rejects forever.
            "--endpoint-reconciler-type=none",
            f"--watch-cache={'true' if self.watch_cache else 'false'}",
            "--profiling=false",
            *self.extra_apiserver_args,
        ]
        self._apiserver = _Process("kube-apiserver", args, wd / "kube-apiserver.log")
        self.start_apiserver()

        self.kubeconfig_path = self._write_kubeconfig(
            wd / "admin.kubeconfig", ADMIN_USER, self.token
        )

    def stop(self) -> None:
        """Kill kube-apiserver and etcd and remove the temp dir (idempotent)."""
        try:
            for proc in (self._apiserver, self._etcd):
                if proc is not None:
                    proc.stop()
        finally:
            self._apiserver = None
            self._etcd = None
            if self._webhook is not None:
                self._webhook.stop()
                self._webhook = None
            _LIVE.discard(self)
            if self.workdir is not None and not self.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def stop_apiserver(self, *, kill: bool = False) -> None:
        """Stop kube-apiserver only (etcd keeps its data): an API outage.

        By default a graceful SIGTERM (open watches end cleanly, as in a
        rolling restart); ``kill=True`` sends SIGKILL (connections just drop).
        Clients then get connection refused until :meth:`start_apiserver`.
        """
        if self._apiserver is None:
            raise KubeAPIServerError("not started")
        self._apiserver.stop(kill=kill)

    def start_apiserver(self) -> None:
        """(Re)start kube-apiserver on the same port and wait for /readyz."""
        if self._apiserver is None:
            raise KubeAPIServerError("not started")
        if self._apiserver.running:
            return
        self._apiserver.start()
        self._wait_for(self._apiserver, "kube-apiserver", self._apiserver_ready)

    @property
    def apiserver_running(self) -> bool:
        return self._apiserver is not None and self._apiserver.running

    # ------------------------------------------------------------- waiting

    def _logs_tail(self) -> str:
        parts = []
        for proc in (self._etcd, self._apiserver):
            if proc is not None:
                parts.append(f"--- last lines of {proc.log_path} ---\n{_tail(proc.log_path)}")
        return "\n".join(parts)

    def _wait_for(self, proc: _Process, what: str, ready: Callable[[], bool]) -> None:
        last_error = ""

        def up() -> bool:
            nonlocal last_error
            code = proc.exit_code()
            if code is not None:
                raise KubeAPIServerError(
                    f"{what} exited with code {code} during startup\n{self._logs_tail()}"
                )
            try:
                return ready()
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last_error = repr(exc)
                return False

        try:
            eventually_sync(up, self.startup_timeout, period=0.1)
        except AssertionError:
            raise KubeAPIServerError(
                f"{what} not ready after {self.startup_timeout:.0f}s"
                f" (last error: {last_error or 'none'})\n{self._logs_tail()}"
            ) from None

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
            return bool(json.load(resp).get("health") == "true")

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_path))

    def _apiserver_ready(self) -> bool:
        req = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=2, context=self._ssl_context()) as resp:
                return int(resp.status) == 200
        except urllib.error.HTTPError:
            return False

    # ------------------------------------------------------------- helpers

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> Path:
        ca_data = base64.b64encode(self.ca_path.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "meshbridge-test",
                    "cluster": {"server": self.url, "certificate-authority-data": ca_data},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "meshbridge-test", "user": user}}],
            "current-context": user,
        }
        # JSON is YAML: every kubeconfig loader reads it.
        _write_private(path, json.dumps(config, indent=2).encode())
        return path

    def token_for(self, user: str, groups: Sequence[str] = ()) -> str:
        """A bearer token that authenticates as ``user`` in ``groups``.

        The identity has no permissions until a (Cluster)RoleBinding grants
        some, so it is the one to use for RBAC tests. ``system:authenticated``
        is added by the apiserver. Works at any time after :meth:`start`.
        """
        if self._webhook is None:
            raise KubeAPIServerError("not started")
        return self._webhook.token_for(user, groups)

    def token_kubeconfig_for(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig file that authenticates as ``user`` in ``groups``."""
        if self.workdir is None:
            raise KubeAPIServerError("not started")
        key = (user, tuple(groups))
        path = self._kubeconfigs.get(key)
        if path is None:
            token = self.token_for(user, groups)
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
            path = self.workdir / f"user-{safe}-{len(self._kubeconfigs)}.kubeconfig"
            self._write_kubeconfig(path, user, token)
            self._kubeconfigs[key] = path
        return path

    def _etcd_post(self, endpoint: str, body: Mapping[str, object]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.etcd_url}{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            result: dict[str, Any] = json.load(resp)
            return result

    def etcd_revision(self) -> int:
        """etcd's current revision (= the newest resourceVersion handed out)."""
        if not self.etcd_url:
            raise KubeAPIServerError("not started")
        reply = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})
        return int(reply["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd to its current revision; return that revision.

        Afterwards a watch from any resourceVersion older than the newest one
        the apiserver has handed out fails with 410 Gone
        (the client sees an ERROR event whose Status has code 410, reason
        Expired); watches already open are not disturbed. This holds with
        the default ``watch_cache=False``. With the watch cache on, the
        apiserver keeps answering such watches from its cache window; a
        restart (:meth:`stop_apiserver` then :meth:`start_apiserver`) starts
        that window afresh, after which older resourceVersions get 410.
        """
        # Compacting at revision R keeps R itself (but not the previous value
        # that a watch event at R carries), so first write a key outside the
        # apiserver's /registry prefix: every resourceVersion the apiserver
        # handed out is then older than R, and a watch from the newest of
        # them (which starts at R) still works.
        reply = self._etcd_post(
            "/v3/kv/put",
            {
                "key": base64.b64encode(b"/meshbridge-test/compaction-marker").decode(),
                "value": base64.b64encode(str(time.time()).encode()).decode(),
            },
        )
        revision = int(reply["header"]["revision"])
        self._etcd_post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision


_shared_lock = threading.Lock()
_shared: KubeAPIServer | None = None
_shared_users = 0
_shared_error: BaseException | None = None


@pytest.fixture(scope="session")
def kube_apiserver() -> Iterator[KubeAPIServer]:
    """A started :class:`KubeAPIServer`, shared by the whole test session.

    pytest makes a separate session fixture for every module that imports
    this one, so all of them share one server here; it stops when the last
    of them is torn down (at the end of the session). A failed start is
    remembered and re-raised instead of retried by every module.
    """
    global _shared, _shared_users, _shared_error
    with _shared_lock:
        if _shared_error is not None:
            raise KubeAPIServerError(f"kube-apiserver failed to start: {_shared_error}")
        if _shared is None:
            server = KubeAPIServer()
            try:
                server.start()
            except BaseException as exc:
                _shared_error = exc
                raise
            _shared = server
        _shared_users += 1
        server = _shared
    try:
        yield server
    finally:
        with _shared_lock:
            _shared_users -= 1
            if _shared_users == 0 and _shared is not None:
                _shared.stop()
                _shared = None


def put_endpoint_slice(discovery: Any, namespace: str, body: dict[str, Any]) -> None:
    """Create the EndpointSlice `body`, or replace it when a slice of that name is
    there already (from an earlier step of the test), through a DiscoveryV1Api."""
    from kubernetes import client  # only the tests that write objects need it

    try:
        discovery.create_namespaced_endpoint_slice(namespace, body)
    except client.ApiException as e:
        if e.status != 409:
            raise
        discovery.replace_namespaced_endpoint_slice(body["metadata"]["name"], namespace, body)
