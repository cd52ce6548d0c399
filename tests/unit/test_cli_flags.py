"""Every flag of every subcommand: help text, its default shown, MESHBRIDGE_<FLAG>."""

from __future__ import annotations

import argparse

import pytest

from meshbridge import cli, layers

COMMANDS = ["serve", *layers.COMMANDS]


def flags(command: str) -> list[argparse.Action]:
    parser = cli.subparsers(cli.build_parser(command))[command]
    return [a for a in parser._actions if a.option_strings
            and not isinstance(a, argparse._HelpAction | argparse._VersionAction)]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help_text_that_shows_its_default(command: str) -> None:
    formatter = cli.HelpFormatter(f"meshbridge {command}")
    actions = flags(command)
    assert actions
    for action in actions:
        assert action.help, f"{command} {action.option_strings[0]} has no help text"
        shown = formatter._get_help_string(action)
        assert "default" in shown, f"{command} {action.option_strings[0]}: {shown!r}"
        assert cli.env_name(action) is not None


def test_the_help_output_renders_for_every_subcommand() -> None:
    for command in COMMANDS:
        parser = cli.subparsers(cli.build_parser(command))[command]
        text = parser.format_help()
        assert "(default: " in text, command


def test_flags_come_from_the_environment_and_the_command_line_wins() -> None:
    env = {"MESHBRIDGE_LISTEN": "127.0.0.1:1234", "MESHBRIDGE_LOG_LEVEL": "debug",
           "MESHBRIDGE_H2_IDLE_TIMEOUT": "42.5", "MESHBRIDGE_DISABLE_IPV6": "true",
           "MESHBRIDGE_MAX_MESSAGE_BYTES": "1000"}
    args = cli.parse_args(["serve", "--log-level", "warning"], env)
    assert args.listen == "127.0.0.1:1234"
    assert args.log_level == "warning"  # the command line wins
    assert args.h2_idle_timeout == 42.5
    assert args.disable_ipv6 is True
    assert args.max_message_bytes == 1000
    assert cli.parse_args(["serve"], {}).listen == "0.0.0.0:8086"


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("1", True), ("TRUE", True),
                                                ("false", False), ("0", False)])
def test_boolean_variables_take_true_false_1_0(text: str, expected: bool) -> None:
    args = cli.parse_args(["serve"], {"MESHBRIDGE_DISABLE_H2_UPGRADE": text})
    assert args.disable_h2_upgrade is expected


def test_subcommand_flags_come_from_the_environment_too() -> None:
    args = cli.parse_args(["xds", "--type", "cds"], {"MESHBRIDGE_SERVER": "10.0.0.1:1",
                                                     "MESHBRIDGE_JSON": "1"})
    assert args.server == "10.0.0.1:1" and args.json is True


@pytest.mark.parametrize(("name", "value", "says"), [
    ("MESHBRIDGE_MAX_MESSAGE_BYTES", "lots", "invalid literal"),
    ("MESHBRIDGE_DISABLE_IPV6", "maybe", "expected true or false"),
    ("MESHBRIDGE_LOG_FORMAT", "xml", "expected one of json, console"),
])
def test_a_bad_variable_is_one_line_naming_it(
        name: str, value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["serve"], {name: value})
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name}={value!r}" in err[0] and says in err[0], err


def test_a_tool_missing_its_extra_says_which_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import harness.compare.cli

    def without_matplotlib(_args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr(harness.compare.cli, "run", without_matplotlib)
    assert cli.main(["compare", "scenario.yaml"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["meshbridge compare: error: needs the Python package 'matplotlib', which "
                   "`serve` does not: pip install 'meshbridge[compare]'"]
