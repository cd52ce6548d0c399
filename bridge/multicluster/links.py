"""What names a linked cluster: a Linkerd cluster-credentials Secret, or `--link`.

A link is a value: the cluster's name (the key everything else uses), its cluster
domain and trust domain, and where its objects come from (a kubeconfig, or for
development a folder of manifests or a sim scenario). Reading one never reaches the
network; a link that cannot be used is a `LinkError` that says which Secret or flag
and what is wrong with it (docs/multicluster.md, "Linking a cluster").
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bridge.objects import Secret
from bridge.sources import kubeconfig as kubeconfig_reader
from bridge.sources.kubeconfig import Credentials

# Linkerd's cluster-store contract (`linkerd multicluster link` writes these).
CLUSTER_NAME_LABEL = "multicluster.linkerd.io/cluster-name"
CLUSTER_DOMAIN_ANNOTATION = "multicluster.linkerd.io/cluster-domain"
TRUST_DOMAIN_ANNOTATION = "multicluster.linkerd.io/trust-domain"
KUBECONFIG_KEY = "kubeconfig"

DEFAULT_DOMAIN = "cluster.local"
# A cluster name ends up in Service names (`<svc>-<cluster>`): a DNS label.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Development sources a --link may name instead of a kubeconfig.
DEV_SOURCES = ("files:", "sim:")


class LinkError(ValueError):
    """A link that cannot be used; `reason` is a short metric label, str() the line."""

    def __init__(self, origin: str, reason: str, detail: str, cluster: str = "") -> None:
        super().__init__(f"{origin}: {detail}")
        self.origin = origin
        self.reason = reason
        self.detail = detail
        self.cluster = cluster


@dataclass(frozen=True, slots=True)
class Link:
    """One linked cluster, as configured."""

    name: str
    cluster_domain: str
    trust_domain: str
    origin: str  # "Secret linkerd/cluster-credentials-east" or "--link east"
    kubeconfig: bytes = b""  # for a cluster reached through its API server
    dev_source: str = ""  # or "files:DIR" / "sim:FILE" (development, tests)

    @property
    def fingerprint(self) -> str:
        """Changes whenever anything that reaching or reading the cluster depends on
        changes: a Secret rewritten with the same content is no change."""
        h = hashlib.sha256()
        for part in (self.kubeconfig, self.cluster_domain.encode(), self.trust_domain.encode(),
                     self.dev_source.encode()):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.hexdigest()[:16]


def link_from_secret(secret: Secret) -> Link:
    """Linkerd's rules for a cluster-credentials Secret (its type is already checked
    where it was decoded): the cluster-name label, both domain annotations and the
    `kubeconfig` key, each required."""
    origin = f"Secret {secret.meta.namespace}/{secret.meta.name}"
    name = secret.meta.labels.get(CLUSTER_NAME_LABEL, "")
    if not name:
        raise LinkError(origin, "missing_label", f"no {CLUSTER_NAME_LABEL} label")
    if not _NAME.match(name):
        raise LinkError(origin, "bad_name", f"cluster name {name!r} is not a DNS label",
                        name)
    missing = [a for a in (CLUSTER_DOMAIN_ANNOTATION, TRUST_DOMAIN_ANNOTATION)
               if not secret.meta.annotations.get(a)]
    if missing:
        raise LinkError(origin, "missing_annotation",
                        f"no {' or '.join(missing)} annotation", name)
    kubeconfig = secret.data.get(KUBECONFIG_KEY)
    if not kubeconfig:
        raise LinkError(origin, "missing_kubeconfig", f"no {KUBECONFIG_KEY!r} data key", name)
    return Link(name, secret.meta.annotations[CLUSTER_DOMAIN_ANNOTATION].strip("."),
                secret.meta.annotations[TRUST_DOMAIN_ANNOTATION], origin, kubeconfig)


def parse_link_flag(text: str) -> Link:
    """`NAME=KUBECONFIG[,trust-domain=D][,cluster-domain=D]`; KUBECONFIG may instead be
    `files:DIR` or `sim:FILE` (a cluster from manifests or a scenario, for development).
    The kubeconfig is read now, so a missing file is a start-up error."""
    origin = f"--link {text}"
    name, sep, rest = text.partition("=")
    if not sep or not rest:
        raise LinkError(origin, "bad_flag", "expected NAME=KUBECONFIG[,trust-domain=D]"
                                            "[,cluster-domain=D]")
    if not _NAME.match(name):
        raise LinkError(origin, "bad_name", f"cluster name {name!r} is not a DNS label")
    target, *options = rest.split(",")
    domains = {"trust-domain": "", "cluster-domain": DEFAULT_DOMAIN}
    for option in options:
        key, eq, value = option.partition("=")
        if key not in domains or not eq or not value:
            raise LinkError(origin, "bad_flag", f"unknown option {option!r} (trust-domain=D or "
                                                "cluster-domain=D)", name)
        domains[key] = value.strip(".")
    cluster_domain = domains["cluster-domain"]
    trust_domain = domains["trust-domain"] or cluster_domain
    origin = f"--link {name}"
    if target.startswith(DEV_SOURCES):
        return Link(name, cluster_domain, trust_domain, origin, dev_source=target)
    try:
        kubeconfig = Path(target).expanduser().read_bytes()
    except OSError as e:
        raise LinkError(origin, "bad_kubeconfig", f"kubeconfig {target}: {e.strerror or e}",
                        name) from None
    return Link(name, cluster_domain, trust_domain, origin, kubeconfig)


def link_credentials(link: Link) -> Credentials:
    """The credentials of the kubeconfig's current context; LinkError naming what is
    wrong (it does not parse, has no usable context, or names no server)."""
    try:
        loaded: Any = yaml.safe_load(link.kubeconfig)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise LinkError(link.origin, "bad_kubeconfig",
                        f"kubeconfig does not parse: {problem}{at}", link.name) from None
    if not isinstance(loaded, dict):
        raise LinkError(link.origin, "bad_kubeconfig", "kubeconfig is not a mapping",
                        link.name)
    # The kubeconfig reader reads files (kubectl's rules, inline certificates written
    # to private files of its own): the Secret's kubeconfig is one for that long only.
    with tempfile.TemporaryDirectory(prefix="meshbridge-link-") as folder:
        path = Path(folder) / "kubeconfig"
        path.write_bytes(link.kubeconfig)
        try:
            return kubeconfig_reader.from_kubeconfig(str(path))
        except kubeconfig_reader.KubeconfigError as e:
            raise LinkError(link.origin, "bad_kubeconfig", f"kubeconfig: {e}",
                            link.name) from None
