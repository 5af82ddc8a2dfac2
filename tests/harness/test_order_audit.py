"""harness.order_audit on hand-written dyn_topo graphs: a later loop fed by the last iteration
only is flagged; one fed by every iteration, or ordered through a chain, is not."""

from __future__ import annotations

import pytest

from harness.order_audit import (audit_dir, findings, main, parse_topo, strand_dir,
                                  stranded_lines, stranded_writers, summary_lines, verdict)

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


def topo_ops(rows: list[tuple[int, str, int, list[int]]]) -> str:
    """dyn_topo text from (task id, root hash, opmagic, successor ids), submission 0."""
    return "\n".join([HEADER] + [f"0,{t},0,{h},{op},0,0,0,0,,{','.join(map(str, s))}"
                                 for t, h, op, s in rows]) + "\n"


# function 1 ("w") writes tensor 7 with ops 10 and 11 (and tensor 8 with op 12); function 2
# ("r") reads it.  Only op 11's task has the cross-function edge.
PROGRAM = {"functions": [
    {"hash": "w", "func_magicname": "TENSOR_W_root", "topo": {}, "outcasts": [[7, []], [8, []]],
     "operations": [{"opmagic": 10, "ooperands": [7]}, {"opmagic": 11, "ooperands": [7]},
                    {"opmagic": 12, "ooperands": [8]}]},
    {"hash": "r", "func_magicname": "TENSOR_R_root", "topo": {}, "outcasts": [],
     "operations": []}]}


def test_a_writer_no_later_function_waits_for_is_stranded():
    text = topo_ops([(1 * F, "w", 10, []), (1 * F + 1, "w", 11, [2 * F]),
                     (1 * F + 2, "w", 12, []), (2 * F, "r", 1, [])])
    found = stranded_writers(text, PROGRAM)
    assert [(s.function, s.tensor, s.writers, s.stranded, s.readers) for s in found] == [
        ((0, 1), 7, 2, 1, ((0, 2),))]
    assert stranded_lines(found) == [
        "function 1 (TENSOR_W_root) tensor 7: 1 of 2 writers reach none of the 1 later "
        "functions that read it (2)"]


def test_writers_ordered_inside_their_function_are_not_stranded():
    # op 10's task feeds op 11's task, which the reader waits for
    text = topo_ops([(1 * F, "w", 10, [1 * F + 1]), (1 * F + 1, "w", 11, [2 * F]),
                     (2 * F, "r", 1, [])])
    assert stranded_writers(text, PROGRAM) == []
    # a tensor no later function reads (a kernel output) is not a finding either
    text = topo_ops([(1 * F, "w", 10, []), (1 * F + 1, "w", 11, []), (2 * F, "r", 1, [])])
    assert stranded_writers(text, PROGRAM) == []


def test_cli_reports_stranded_writers(tmp_path, capsys):
    import json
    d = tmp_path / "launch-0001-x-rank0" / "output" / "o1"
    d.mkdir(parents=True)
    (d / "dyn_topo.txt").write_text(topo_ops([(1 * F, "w", 10, []), (1 * F + 1, "w", 11, [2 * F]),
                                              (2 * F, "r", 1, [])]))
    (d / "program.json").write_text(json.dumps(PROGRAM))
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "0 unordered (loop, reader) pairs, 1 outcasts with stranded writers" in out
    assert set(strand_dir(tmp_path)) == {"launch-0001-x-rank0 (o1)"}


def test_verdict_names_the_first_unordered_launch(tmp_path):
    for name, text in (("launch-0001-x-rank0", EVERY), ("launch-0002-x-rank1", LAST_ONLY)):
        d = tmp_path / name / "output" / "o1"
        d.mkdir(parents=True)
        (d / "dyn_topo.txt").write_text(text)
    assert verdict(tmp_path / "launch-0001-x-rank0") == "ordered"
    assert verdict(tmp_path) == (
        "unordered (1 of 2 launches): launch-0002-x-rank1 (o1): loop w (iterations 1, 2): "
        "iterations 1 reach none of 2 functions the loop feeds (3, 4)")
    assert verdict(tmp_path / "empty") == "no task graph"
