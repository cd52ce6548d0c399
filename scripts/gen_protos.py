"""Regenerate the Python bindings for the Linkerd proxy API protos.

Usage:
    python scripts/gen_protos.py          # rewrite linkerd_api/proto/*_pb2*.py[i]
    python scripts/gen_protos.py --check  # exit 1 listing stale files, write nothing

The .proto files in linkerd_api/proto/ import each other as "net.proto" etc. (the same
import paths as upstream linkerd2-proxy-api, so the registered descriptor file names
match too). protoc therefore emits top-level imports such as ``import net_pb2 as net__pb2``.
After generation this script rewrites exactly those lines into package imports
(``from linkerd_api.proto import net_pb2 as net__pb2``); nothing else is touched. The
output depends only on the .proto inputs and the grpcio-tools version, so it is
byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO_ROOT / "linkerd_api" / "proto"
PACKAGE = "linkerd_api.proto"

# Every .proto we compile, in a fixed order.
PROTOS: tuple[str, ...] = ("destination.proto", "grpc_route.proto", "http_route.proto",
                           "http_types.proto", "identity.proto", "inbound.proto",
                           "meta.proto", "net.proto", "opaque_route.proto", "outbound.proto",
                           "tls_route.proto")
# Only these define services, so only these get a *_pb2_grpc.py.
GRPC_PROTOS: tuple[str, ...] = ("destination.proto", "identity.proto", "inbound.proto",
                                "outbound.proto")

GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _local_modules() -> frozenset[str]:
    return frozenset(f"{Path(p).stem}_pb2" for p in PROTOS)


def expected_outputs() -> list[str]:
    """File names (relative to PROTO_DIR) that generation must produce."""
    names: list[str] = []
    for proto in PROTOS:
        stem = Path(proto).stem
        names += [f"{stem}_pb2.py", f"{stem}_pb2.pyi"]
    names += [f"{Path(p).stem}_pb2_grpc.py" for p in GRPC_PROTOS]
    return sorted(names)


_IMPORT_RE = re.compile(r"^import (?P<mod>\w+_pb2) as (?P<alias>\w+)$", re.MULTILINE)


def rewrite_imports(text: str) -> str:
    """Turn protoc's top-level imports of sibling modules into package imports."""
    local = _local_modules()

    def repl(m: re.Match[str]) -> str:
        if m.group("mod") not in local:
            return m.group(0)
        return f"from {PACKAGE} import {m.group('mod')} as {m.group('alias')}"

    out = _IMPORT_RE.sub(repl, text)
    leftover = [m.group(0) for m in _IMPORT_RE.finditer(out) if m.group("mod") in local]
    if leftover:  # pragma: no cover - would mean protoc changed its output format
        raise RuntimeError(f"unrewritten sibling imports: {leftover}")
    return out


def _protoc(args: Sequence[str]) -> None:
    # `python -m grpc_tools.protoc` adds grpc_tools' bundled include dir (for
    # google/protobuf/duration.proto) itself. Run from PROTO_DIR with relative file
    # names so that no absolute path can leak into the output.
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I.", *args]
    result = subprocess.run(cmd, cwd=PROTO_DIR, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"protoc failed ({result.returncode}): {' '.join(cmd)}")


def generate(out_dir: Path) -> list[str]:
    """Generate every binding into out_dir; return the file names written."""
    with tempfile.TemporaryDirectory(prefix="gen_protos_raw_") as raw_name:
        raw = Path(raw_name)
        _protoc([f"--python_out={raw}", f"--pyi_out={raw}", *PROTOS])
        _protoc([f"--grpc_python_out={raw}", *GRPC_PROTOS])
        produced = sorted(p.name for p in raw.iterdir())
        expected = expected_outputs()
        if produced != expected:
            raise SystemExit(f"protoc produced {produced}, expected {expected}")
        for name in expected:
            text = (raw / name).read_bytes().decode("utf-8")
            (out_dir / name).write_bytes(rewrite_imports(text).encode("utf-8"))
    return expected


def _committed_generated() -> set[str]:
    return {
        p.name for p in PROTO_DIR.iterdir() if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def stale_files() -> list[str]:
    """Regenerate into a temp dir; return committed paths that differ, are missing or extra."""
    stale: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gen_protos_check_") as tmp_name:
        tmp = Path(tmp_name)
        names = generate(tmp)
        for name in names:
            committed = PROTO_DIR / name
            if not committed.is_file() or committed.read_bytes() != (tmp / name).read_bytes():
                stale.append(name)
        stale += sorted(_committed_generated() - set(names))
    return [str((PROTO_DIR / n).relative_to(REPO_ROOT)) for n in sorted(stale)]


def _tool_version_hint() -> str | None:
    """Explain a staleness that comes from a different grpcio-tools, not from the .proto files.

    protoc embeds its own version in the output (runtime checks in *_pb2.py and
    GRPC_GENERATED_VERSION in *_pb2_grpc.py), so output is only reproducible with the
    grpcio-tools version that produced the committed files.
    """
    grpc_file = PROTO_DIR / f"{Path(GRPC_PROTOS[0]).stem}_pb2_grpc.py"
    if not grpc_file.is_file():
        return None
    m = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'$", grpc_file.read_text(), re.MULTILINE)
    try:
        installed = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        return None
    if m is None or m.group(1) == installed:
        return None
    return (
        f"note: committed files were generated by grpcio-tools {m.group(1)}, "
        f"but grpcio-tools {installed} is installed"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temp dir and exit 1 if any committed file is stale",
    )
    args = parser.parse_args(argv)

    if args.check:
        stale = stale_files()
        if stale:
            print("stale generated proto files (run `python scripts/gen_protos.py`):")
            for path in stale:
                print(f"  {path}")
            hint = _tool_version_hint()
            if hint:
                print(hint)
            return 1
        print("generated proto files are up to date")
        return 0

    names = generate(PROTO_DIR)
    for orphan in sorted(_committed_generated() - set(names)):
        (PROTO_DIR / orphan).unlink()
        print(f"removed {PROTO_DIR.relative_to(REPO_ROOT) / orphan}")
    for name in names:
        print(f"wrote {PROTO_DIR.relative_to(REPO_ROOT) / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
