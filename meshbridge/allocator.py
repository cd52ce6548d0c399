"""`meshbridge serve` allocates through the C library's malloc, not CPython's
small-object allocator (pymalloc), so that what a burst of streams freed goes back
to the system.

Why: pymalloc carves 1 MiB arenas into 16 KiB pools and returns an arena only when
every pool in it is empty. A burst of thousands of streams (one connection opening
5,000 `Get` streams, say) takes dozens of arenas; when the streams end, the few
objects made during the burst that live on (a changed endpoint, a metric's new
label set) are scattered over those arenas and keep each of them. Measured on
`meshbridge serve` after such a connection ended, with every object freed and a
full collection done: 46 arenas, 1,286 of their pools empty (21 MiB resident, held
for good), RSS 24 MiB above the start and 26 MiB after three runs. glibc's
`malloc_trim`, which `h2grpc.heap` calls once a burst is over, returns every free
page wherever it lies; with every object allocated by malloc, RSS came back to its
start after each run (docs/reliability.md, "Memory after a burst goes back to the system").

How: the interpreter chooses its allocator when it starts (`PYTHONMALLOC`), so a
process started as `meshbridge serve` executes itself again, once, with
`PYTHONMALLOC=malloc`, as the `meshbridge` package is first imported (before the
CLI's own imports, which take seconds on a loaded machine). A `PYTHONMALLOC`
already set is obeyed (`PYTHONMALLOC=pymalloc` keeps CPython's allocator; `debug`
for tests), and so is a C library other than glibc (no `malloc_trim`: nothing to
gain). Importing the package from anything else (a test, a benchmark) changes
nothing: only the process's own command line counts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

ALLOCATOR = "malloc"
COMMANDS = frozenset({"serve"})  # the long-lived servers
ENTRY_MODULES = frozenset({"meshbridge", "meshbridge.cli"})  # python -m ...
ENTRY_SCRIPT = "meshbridge"  # the console script


def cli_arguments(orig_argv: Sequence[str]) -> list[str] | None:
    """The `meshbridge` command's arguments if this interpreter was started as the
    meshbridge CLI (`python -m meshbridge[.cli] ...` or the `meshbridge` script),
    else None."""
    if "-m" in orig_argv:
        i = list(orig_argv).index("-m")
        if orig_argv[i + 1:i + 2] and orig_argv[i + 1] in ENTRY_MODULES:
            return list(orig_argv[i + 2:])
        return None
    if len(orig_argv) > 1 and os.path.basename(orig_argv[1]) == ENTRY_SCRIPT:
        return list(orig_argv[2:])
    return None


def reexec_environment(argv: Sequence[str], environ: Mapping[str, str],
                       libc: str) -> dict[str, str] | None:
    """The environment to execute this command again in, or None to go on as is.
    `argv` is the meshbridge command line without the program, `libc` the C
    library's name and version (`os.confstr("CS_GNU_LIBC_VERSION")`, None off glibc)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS or "PYTHONMALLOC" in environ \
            or not (libc or "").startswith("glibc"):
        return None
    return {**environ, "PYTHONMALLOC": ALLOCATOR}


def use_malloc() -> None:
    """Execute this process again with malloc as the allocator if it was started as
    a command that should run on it (see the module's text). Returns only if not."""
    argv = cli_arguments(sys.orig_argv)
    if argv is None:
        return
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        libc = None
    env = reexec_environment(argv, os.environ, libc or "")
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # The interpreter's own command line, so the new process starts as this one did.
    os.execve(sys.executable, sys.orig_argv, env)
