"""harness.order_audit on hand-written dyn_topo graphs: a later loop fed by the last iteration
only is flagged; one fed by every iteration, or ordered through a chain, is not."""

from __future__ import annotations

import pytest

from harness.order_audit import audit_dir, findings, main, parse_topo, summary_lines

HEADER = "seqNo,taskId,rootIndex,rootHash,opmagic,leafIndex,leafHash,coreType,psgId,successors"
F = 1 << 20  # task ids: root function index in the bits above 20


def topo(rows: list[tuple[int, str, list[int]]]) -> str:
    """dyn_topo text from (task id, root hash, successor ids), all in submission 0."""
    return "\n".join([HEADER] + [f"0,{t},0,{h},1,0,0,0,0,,{','.join(map(str, s))}"
                                 for t, h, s in rows]) + "\n"


# functions 1 and 2: two iterations of loop W (hash "w"); 3 and 4: iterations of reader loop R
LAST_ONLY = topo([(1 * F, "w", [1 * F + 1]), (1 * F + 1, "w", []),
                  (2 * F, "w", [2 * F + 1]), (2 * F + 1, "w", [3 * F, 4 * F]),
                  (3 * F, "r", []), (4 * F, "r", [])])
EVERY = topo([(1 * F, "w", [3 * F, 4 * F]), (2 * F, "w", [3 * F, 4 * F]),
              (3 * F, "r", []), (4 * F, "r", [])])
CHAIN = topo([(1 * F, "w", [2 * F]), (2 * F, "w", [3 * F, 4 * F]),
              (3 * F, "r", []), (4 * F, "r", [])])


def test_last_iteration_only_is_flagged():
    found = findings(*parse_topo(LAST_ONLY), names={"w": "TENSOR_W"})
    assert {(f.loop, f.reader[1], tuple(i[1] for i in f.unordered)) for f in found} == {
        ("TENSOR_W", 3, (1,)), ("TENSOR_W", 4, (1,))}
    assert summary_lines(found) == [
        "loop TENSOR_W (iterations 1, 2): iterations 1 reach none of 2 functions the loop "
        "feeds (3, 4)"]


@pytest.mark.parametrize("text", [EVERY, CHAIN], ids=["every_iteration", "chained"])
def test_ordered_loops_pass(text):
    assert findings(*parse_topo(text)) == []


def test_separate_submissions_are_not_mixed():
    # the same function index in submission 1 is another function
    text = LAST_ONLY.replace("\n0,", "\n1,", 2)
    roots, succ = parse_topo(text)
    assert (1, 1) in roots and (0, 2) in roots


def test_bad_header_names_the_file_format():
    with pytest.raises(ValueError, match="seqNo,taskId"):
        parse_topo("taskId\n1,2\n")


def test_cli_exit_codes(tmp_path, capsys):
    bad = tmp_path / "bad" / "launch-0001-x-rank0" / "output" / "o1"
    good = tmp_path / "good" / "launch-0001-x-rank0" / "output" / "o1"
    for d, text in ((bad, LAST_ONLY), (good, EVERY)):
        d.mkdir(parents=True)
        (d / "dyn_topo.txt").write_text(text)
    assert main([str(tmp_path / "good")]) == 0
    assert main([str(tmp_path / "bad")]) == 1
    assert "FLAG launch-0001-x-rank0" in capsys.readouterr().out
    assert main([str(tmp_path / "none")]) == 2
    assert set(audit_dir(tmp_path / "bad")) == {"launch-0001-x-rank0 (o1)"}


def test_an_iterations_own_nested_functions_are_not_readers():
    # loop W iterations 1 and 3; functions 2 and 4 are each iteration's nested loop
    text = topo([(1 * F, "w", [2 * F]), (2 * F, "n", []), (3 * F, "w", [4 * F]),
                 (4 * F, "n", [])])
    assert findings(*parse_topo(text)) == []
    # ... while a later loop fed by the last iteration only is still a finding
    text = topo([(1 * F, "w", [2 * F]), (2 * F, "n", []), (3 * F, "w", [4 * F, 5 * F]),
                 (4 * F, "n", []), (5 * F, "r", [])])
    assert [(f.reader[1], f.unordered) for f in findings(*parse_topo(text))] == [(5, ((0, 1),))]


def test_row_tracked_edges_from_several_iterations_pass():
    # iteration 1 feeds reader 3 and iteration 2 feeds reader 4: each reader its own rows
    text = topo([(1 * F, "w", [3 * F]), (2 * F, "w", [4 * F]), (3 * F, "r", []),
                 (4 * F, "r", [])])
    assert findings(*parse_topo(text)) == []
