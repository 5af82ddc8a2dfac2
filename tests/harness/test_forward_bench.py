"""bench --forward: the decode step sums each distinct piece times its count in the schedule.

Launch-free: the runner is replaced by a fake whose estimate per entry the test sets.
"""

import json
import math

import pytest

from goldens.config import preset
from harness import bench, forward_bench as fb

TINY = ["--forward", "--preset", "tiny", "--tokens", "8", "--tp", "2", "--dp", "1", "--ep", "2"]


def test_schedule_counts_are_the_presets_layer_config():
    counts = fb.layer_counts(preset("flash"))
    assert sum(counts.values()) == 40
    assert counts == {"swa": 2, "c2a_full": 3, "c2a_reuse": 15, "c1a_full": 1,
                      "c1a_reindex": 4, "c1a_reuse": 15}
    assert sum(fb.layer_counts(preset("tiny")).values()) == preset("tiny").num_layers


def test_step_is_the_weighted_sum_of_each_piece_run_once(est, capsys):
    est.update({"decode_swa": 100.0, "decode_c1a_full": 300.0, "moe": 1000.0, "lm_head": 7.0})
    # input_pack and hc_head 1.0 (unset), the final rmsnorm 10.0 (the fixture's)
    assert bench.main([*TINY, "--json"]) == 0
    step = json.loads(capsys.readouterr().out)
    counts = fb.layer_counts(preset("tiny"))
    assert len(est["calls"]) == len(set(est["calls"])) == len(counts) + 1 + 4  # each piece once
    attn = {m: {"swa": 100.0, "c1a_full": 300.0}.get(m, 1.0) for m in counts}
    want = sum(n * (attn[m] + 1000.0) for m, n in counts.items()) + 7.0 + 1.0 + 1.0 + 10.0
    assert step["step_us"] == pytest.approx(want)
    assert {x["mode"]: x["layers"] for x in step["layers"]} == counts
    roof = sum(x["layers"] * x["roofline_us"] for x in step["layers"]) + sum(
        b["roofline_us"] for b in step["boundary"])
    assert step["roofline_us"] == pytest.approx(roof) and roof > 0
    assert step["ratio"] == pytest.approx(want / roof)
    assert step["tokens_per_s_per_dp_group"] == pytest.approx(8 / (want * 1e-6))
    assert step["pieces"]["moe"]["case"].startswith("moe-tp2-dp1-ep2-t8-")
    # EP bytes: ceil(T/tp) * k rows, BF16 both ways plus id and weight, publish + read
    cfg = preset("tiny")
    k, d = cfg.moe.num_experts_per_tok, cfg.hidden_size
    assert step["collective_bytes_per_layer"]["moe"] == math.ceil(8 / 2) * k * (8 * d + 16)


def test_table_names_every_mode_and_the_step(est, capsys):
    assert bench.main(TINY) == 0
    out = capsys.readouterr().out
    for mode in fb.layer_counts(preset("tiny")):
        assert mode in out
    assert "tokens/s per DP group" in out and "lm_head" in out


def test_a_piece_without_estimate_fails_naming_it(est, capsys):
    est["decode_c2a_full"] = None
    assert bench.main(TINY) == 1
    assert "no estimate for attention:c2a_full" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--forward", "--ep", "4"], "--ep: 4 must equal tp * dp = 8"),
    (["--forward", "--tp", "0"], "--tp: must be an integer >= 1, got 0"),
    (["--forward", "--tokens", "193"], "--tokens: 193 decode rows per DP group exceed"),
    (["--forward", "--tokens", "4", "--tokens", "8"], "one --tokens"),
    (["--forward", "rmsnorm"], "takes no entry names"),
    (["--forward", "--gate"], "takes no --gate"),
    (["--tp", "2"], "--tp/--dp/--ep and --rows are options of --forward"),
])
def test_bad_flags_are_refused_before_any_launch(est, capsys, argv, message):
    assert bench.main(argv) == 2
    assert message in capsys.readouterr().err
    assert est["calls"] == []


def test_saved_rows_replace_their_pieces(est, capsys, tmp_path):
    est["decode_swa"] = 100.0
    assert bench.main([*TINY, "--json"]) == 0
    step = json.loads(capsys.readouterr().out)
    swa = dict(step["pieces"]["attention:swa"], estimated_us=55.0)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(swa) + "\n")
    est["calls"].clear()
    assert bench.main([*TINY, "--json", "--rows", str(rows)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert swa["case"] not in est["calls"] and len(est["calls"]) == len(step["pieces"]) - 1
    assert again["step_us"] == pytest.approx(step["step_us"] - 2 * (100.0 - 55.0))
    swa["topology"] = dict(swa["topology"], cube_cores=1)
    rows.write_text(json.dumps(swa) + "\n")
    assert bench.main([*TINY, "--rows", str(rows)]) == 2
    assert "estimated on" in capsys.readouterr().err
