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
start after each run (docs/reliability.md, "Memory after a burst").

How: the interpreter chooses its allocator when it starts (`PYTHONMALLOC`), so
`serve` executes itself again, once, with `PYTHONMALLOC=malloc`, before it has
imported or started anything of its own. A `PYTHONMALLOC` already set is obeyed
(`PYTHONMALLOC=pymalloc` keeps CPython's allocator; `debug` for tests), and so is a
platform without glibc (no `malloc_trim`: nothing to gain).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, Sequence

ALLOCATOR = "malloc"
COMMANDS = frozenset({"serve"})  # the long-lived servers


def reexec_environment(argv: Sequence[str], environ: Mapping[str, str],
                       libc: str) -> dict[str, str] | None:
    """The environment to execute this command again in, or None to go on as is.
    `argv` is the command line without the program, `libc` the C library's name
    (`platform.libc_ver()[0]`)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS or "PYTHONMALLOC" in environ or libc != "glibc":
        return None
    return {**environ, "PYTHONMALLOC": ALLOCATOR}


def use_malloc(argv: Sequence[str]) -> None:
    """Execute this process again with malloc as the allocator, if `argv` is a
    command that should run on it (see the module's text). Returns only if not."""
    env = reexec_environment(argv, os.environ, platform.libc_ver()[0])
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.orig_argv is the interpreter's own command line (`python -m meshbridge.cli
    # serve ...` or the console script's), so the new process starts as this one did.
    os.execve(sys.executable, sys.orig_argv, env)
