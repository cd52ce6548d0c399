"""What `meshbridge shadow` follows: the targets of a --targets file (short names
expanded), and the template that gives theirs' EDS name for each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bridge.authority import parse_target


def read_targets(path: Path, cluster_domain: str) -> list[str]:
    out: list[str] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(parse_target(line, cluster_domain))  # one grammar
    return list(dict.fromkeys(out))


def eds_name_template(template: str) -> Callable[[str], str]:
    def name(target: str) -> str:
        host, _, port = target.rpartition(":")
        return template.format(authority=target, host=host, port=port)

    name("web.emojivoto.svc.cluster.local:80")  # a bad template fails now, not later
    return name
