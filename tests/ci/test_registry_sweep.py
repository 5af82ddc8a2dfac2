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
