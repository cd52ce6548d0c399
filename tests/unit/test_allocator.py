"""meshbridge.allocator: `serve` runs on malloc unless told otherwise, nothing else
is executed again."""

from __future__ import annotations

from meshbridge.allocator import reexec_environment

ENV = {"PATH": "/usr/bin", "HOME": "/root"}


def test_serve_is_executed_again_with_malloc_keeping_the_rest_of_the_environment() -> None:
    env = reexec_environment(["serve", "--listen", "127.0.0.1:1"], ENV, "glibc")
    assert env == {**ENV, "PYTHONMALLOC": "malloc"}


def test_global_flags_before_the_command_do_not_hide_it() -> None:
    assert reexec_environment(["--debug", "serve"], ENV, "glibc") is not None


def test_an_allocator_chosen_by_the_environment_is_obeyed() -> None:
    for chosen in ("pymalloc", "malloc", "debug"):
        assert reexec_environment(["serve"], {**ENV, "PYTHONMALLOC": chosen}, "glibc") is None


def test_short_lived_commands_and_other_c_libraries_go_on_as_they_are() -> None:
    for argv in (["get", "web.emojivoto:80"], ["compare", "x.yaml"], [], ["--help"]):
        assert reexec_environment(argv, ENV, "glibc") is None
    assert reexec_environment(["serve"], ENV, "") is None  # musl, macOS: no malloc_trim
