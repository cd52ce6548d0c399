"""meshbridge.allocator: a process started as `meshbridge serve` runs on malloc
unless told otherwise; nothing else is executed again."""

from __future__ import annotations

from meshbridge.allocator import cli_arguments, reexec_environment

ENV = {"PATH": "/usr/bin", "HOME": "/root"}
GLIBC = "glibc 2.36"


def test_the_cli_is_recognised_however_it_was_started() -> None:
    assert cli_arguments(["/v/bin/python", "-m", "meshbridge.cli", "serve", "-v"]) == [
        "serve", "-v"]
    assert cli_arguments(["python3", "-u", "-m", "meshbridge", "serve"]) == ["serve"]
    assert cli_arguments(["/v/bin/python", "/v/bin/meshbridge", "serve"]) == ["serve"]


def test_other_programs_importing_the_package_are_not_the_cli() -> None:
    for argv in (["python", "-m", "pytest", "tests/unit", "-k", "serve"],
                 ["python", "-m", "bench.fanout", "serve"],
                 ["python", "-c", "import meshbridge"], ["python", "-m"],
                 ["python", "/x/meshbridge_tool.py", "serve"]):
        assert cli_arguments(argv) is None, argv


def test_serve_is_executed_again_with_malloc_keeping_the_rest_of_the_environment() -> None:
    env = reexec_environment(["serve", "--listen", "127.0.0.1:1"], ENV, GLIBC)
    assert env == {**ENV, "PYTHONMALLOC": "malloc"}
    assert reexec_environment(["--debug", "serve"], ENV, GLIBC) is not None


def test_an_allocator_chosen_by_the_environment_is_obeyed() -> None:
    for chosen in ("pymalloc", "malloc", "debug"):
        assert reexec_environment(["serve"], {**ENV, "PYTHONMALLOC": chosen}, GLIBC) is None


def test_short_lived_commands_and_other_c_libraries_go_on_as_they_are() -> None:
    for argv in (["get", "web.emojivoto:80"], ["compare", "x.yaml"], [], ["--help"]):
        assert reexec_environment(argv, ENV, GLIBC) is None
    assert reexec_environment(["serve"], ENV, "") is None  # musl, macOS: no malloc_trim
