"""The argument builders the commands share (trace_dspy/cli/common.py): what each adds, in which order, and the
refit commands' contract that a parser's names are its refit's keywords."""

from __future__ import annotations

import inspect

import pytest

from trace_dspy.cli.common import CommandParser, add_run_args, ed_refit_parser, refit_main
from trace_dspy.workflows.fits import Refit, refit_empathy, refit_relevance, refit_tone


def _flags(parser) -> list[str]:
    return [action.option_strings[-1] for action in parser._actions if action.option_strings][1:]  # no --help


def test_the_run_args_come_in_one_order_with_the_optional_groups_where_asked():
    full = CommandParser()
    add_run_args(full, situations=True, pricing=True)
    flags = _flags(full)
    assert flags[:4] == ["--verbose", "--data", "--seed", "--situations"]
    assert flags.index("--lm") < flags.index("--tracking-uri") < flags.index("--price-input")
    bare = CommandParser()
    add_run_args(bare, model=False)
    assert _flags(bare) == ["--verbose", "--data", "--seed", "--tracking-uri", "--experiment", "--no-mlflow"]


@pytest.mark.parametrize("refit", [refit_relevance, refit_tone])
def test_an_ed_refit_parser_names_exactly_its_refit_s_keywords(refit):
    args = vars(ed_refit_parser("fit_x", "Refit a head.\n\nMore.", None, seed_help="the seed").parse_args([]))
    assert set(args) | {"command"} == set(inspect.signature(refit).parameters)


def test_the_empathy_refit_parser_names_exactly_its_refit_s_keywords():
    from trace_dspy.cli.fit_empathy import build_parser

    args = vars(build_parser().parse_args([]))
    assert set(args) | {"command"} == set(inspect.signature(refit_empathy).parameters)


def test_refit_main_passes_the_flags_as_keywords_and_records_the_command_without_check(tmp_path, capsys):
    seen = {}

    def refit(**kwargs):
        seen.update(kwargs)
        return Refit("the table", tmp_path / "w.npz", matches=True)

    parser = ed_refit_parser("fit_x", "Refit a head.", None, seed_help="the seed")
    argv = ["--data", "ed dir", "--limit", "400", "--check", "--json", str(tmp_path / "t.json")]
    assert refit_main(argv, parser, "fit_x", refit) == 0
    assert seen == {"data": "ed dir", "seed": 0, "limit": 400, "output": None, "json_path": tmp_path / "t.json",
                    "check": True, "command": f"python -m trace_dspy.fit_x --data 'ed dir' --limit 400 --json "
                                              f"{tmp_path / 't.json'}"}
    assert capsys.readouterr().out.splitlines() == ["the table", f"matches {tmp_path / 'w.npz'}"]
