"""Sweep mode over harness registry entries: matrix from the entry's Support, harness CLI."""

from ci import collect, submit


def test_registry_matrix_reads_support():
    choices, err = collect.registry_matrix("rmsnorm")
    assert err is None and choices == {"tp": [1], "dp": [1]}
    _, err = collect.registry_matrix("no_such_entry")
    assert "not registered" in err


def test_sweep_node_runs_the_harness_cli():
    [node] = collect.sweep_nodes("rmsnorm", {"tp": [1], "dp": [1]}, ["-p", "a5"])
    argv = submit.node_argv(node, "python", "3")
    assert argv == ["python", "-m", "harness", "run", "rmsnorm", "-p", "a5", "--tp", "1",
                    "--dp", "1", "-d", "3"]
    assert node["cards"] == 1


def test_kernel_and_entry_changes_select_their_case_files():
    """Kernels are named by string and entries by name: the selection must still see them."""
    from pathlib import Path

    from ci.select import reverse_closure
    root = Path(__file__).resolve().parents[2]

    def cases_hit(seed):
        return {h for h in reverse_closure(root, {seed}) if h.startswith("cases/")}

    assert "cases/test_rmsnorm.py" in cases_hit("v41/rmsnorm.py")
    assert "cases/test_gate.py" in cases_hit("harness/entries/gate.py")
    assert "cases/test_gate.py" not in cases_hit("v41/rmsnorm.py")
