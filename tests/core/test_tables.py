"""Markdown tables (core.tables)."""

from __future__ import annotations

import pytest

from trace_dspy.core.tables import markdown_table


def test_first_column_left_the_others_right_by_default():
    table = markdown_table(["metric", "a", "b"], [["empathy", "0.5000", "0.6000"], ["n", 5, 5]])
    assert table == ("| metric | a | b |\n"
                     "| --- | ---: | ---: |\n"
                     "| empathy | 0.5000 | 0.6000 |\n"
                     "| n | 5 | 5 |")


def test_alignment_per_column():
    assert markdown_table(["x", "y", "z"], [], align="rlc").splitlines()[1] == "| ---: | --- | :---: |"
    assert markdown_table(["only"], [["one"]]) == "| only |\n| --- |\n| one |"


def test_cells_are_written_as_given_and_pipes_are_escaped():
    table = markdown_table(["name | kind", "value"], [["a|b", None], ["c", True]])
    assert table.splitlines() == ["| name \\| kind | value |", "| --- | ---: |", "| a\\|b | None |", "| c | True |"]


def test_a_row_of_the_wrong_length_is_refused_by_number():
    with pytest.raises(ValueError, match=r"row 2 has 1 cells, the table has 2 columns"):
        markdown_table(["a", "b"], [["1", "2"], ["3"]])
    with pytest.raises(ValueError, match="row 1 has 3 cells"):
        markdown_table(["a", "b"], [("1", "2", "3")])


@pytest.mark.parametrize("align", ["l", "lrr", "lx"])
def test_a_bad_alignment_is_refused(align):
    with pytest.raises(ValueError, match="align"):
        markdown_table(["a", "b"], [], align=align)


def test_a_table_needs_a_column():
    with pytest.raises(ValueError, match="at least one column"):
        markdown_table([], [])
