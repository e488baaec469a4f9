"""Trace generators, CSV formats, the shipped spot trace, and progress alignment."""

import re

import numpy as np
import pytest

from nereus.cost.ops import OpClass
from nereus.errors import InputError, count
from nereus.sim import traces as T
from nereus.sim.scenarios import SPOT_MIN_RUNNING, SPOT_WINDOW_TICKS
from nereus.sim.simulator import align


def test_growth_is_seeded_and_spans_the_papers_range():
    a, b = T.growth(1000, seed=3), T.growth(1000, seed=3)
    assert a == b and T.growth(1000, seed=4) != a
    assert len(a) == 1000
    head, tail = np.mean(a.mean[:20]), np.mean(a.mean[-20:])
    assert 450 < head < 700 and 7500 < tail < 8500
    assert all(x >= m for m, x in zip(a.mean, a.longest))
    s = T.stationary(200, 2000, seed=1)
    assert abs(np.mean(s.mean) - 2000) < 50 and np.std(np.log(s.mean)) < 0.08


def test_length_csv_round_trip_and_errors(tmp_path):
    a = T.growth(50, seed=1)
    p = tmp_path / "lengths.csv"
    T.save_lengths(a, p)
    b = T.load_lengths(p)
    assert b.mean == a.mean and b.longest == a.longest
    p.write_text("step,response_len_mean\n0,100\n")
    with pytest.raises(InputError, match="response_len_max"):
        T.load_lengths(p)
    p.write_text("step,response_len_mean,response_len_max\n0,100,50\n")
    with pytest.raises(InputError, match=rf"lengths \({re.escape(str(p))}\) row 2: "
                       r"response_len_mean"):
        T.load_lengths(p)
    p.write_text("step,response_len_mean,response_len_max\n0,500.5,500.7\n")
    assert T.load_lengths(p).longest == (501,)  # a fractional longest rounds up
    with pytest.raises(InputError, match="no file"):
        T.load_lengths(tmp_path / "missing.csv")


def test_availability_csv_counts_ids_and_pauses(tmp_path):
    p = tmp_path / "pool.csv"
    p.write_text("time_s,gpus\n0,16\n600,0-7 12 13\n1200,\n1800,16\n")
    av = T.load_availability(p)
    assert av.at(0) == tuple(range(16)) and av.at(700) == (*range(8), 12, 13)
    assert av.at(1500) == () and av.at(10_000) == tuple(range(16))
    assert av.changes() == 3 and av.next_change(0) == 600
    T.save_availability(av, tmp_path / "again.csv")
    assert T.load_availability(tmp_path / "again.csv").pools == av.pools
    p.write_text("time_s,gpus\n60,16\n")
    with pytest.raises(InputError, match="first time"):
        T.load_availability(p)


def test_the_shipped_spot_trace_loads_from_the_package():
    counts, tick = T.spot_counts()
    assert tick == 300 and len(counts) == 4736 and max(counts) == 16 and min(counts) == 0
    start = T.busiest_window(counts, SPOT_WINDOW_TICKS, SPOT_MIN_RUNNING)
    seg = counts[start:start + SPOT_WINDOW_TICKS]
    assert seg[0] > 0 and sum(n > 0 for n in seg) >= SPOT_MIN_RUNNING * len(seg)
    av = T.spot_window(start, max_gpus=16)
    assert av.at(0) == tuple(range(counts[start]))      # n instances -> ids 0..n-1
    with pytest.raises(InputError, match="start_tick"):
        T.spot_window(10**6)


def test_a_spot_trace_shorter_than_the_window_is_one_window_from_its_start():
    # regression: 10 ticks, all with GPUs, failed with "no 360-tick window runs 80% of the
    # time" -- the whole trace is the only window there is
    short = [16, 16, 8, 16, 16, 8, 16, 16, 16, 16]
    assert T.busiest_window(short, SPOT_WINDOW_TICKS, SPOT_MIN_RUNNING) == 0
    # a long trace still picks its busiest qualifying window
    assert T.busiest_window([0, 4, 4, 4, 2, 4, 2, 4], 4, 0.8) == 3
    # no qualifying window: the error names the field to set and its range
    with pytest.raises(InputError) as e:
        T.busiest_window([0, 16, 0, 0], SPOT_WINDOW_TICKS, SPOT_MIN_RUNNING)
    assert str(e.value) == ("availability.spot.start_tick: the 4-tick trace does not start "
                            "with GPUs and hold them in 80% of its ticks, so no start can be "
                            "chosen for you (allowed: a start tick 0..3 of your choice)")
    with pytest.raises(InputError, match=r"^availability.spot.start_tick: no 2-tick window of "
                       r"the 4-tick trace starts with GPUs"):
        T.busiest_window([0, 16, 0, 0], 2, 1.0)


def test_node_churn_changes_whole_nodes_more_than_ten_times_in_ten_hours():
    for seed in range(5):
        av = T.node_churn(2, 8, hours=10, changes=12, min_nodes=1, seed=seed)
        assert sum(1 for t in av.times[1:] if t <= 10 * 3600) == 12
        assert sum(1 for t in av.times[1:] if 10 * 3600 < t <= 20 * 3600) == 12
        for pool in av.pools:
            nodes = {g // 8 for g in pool}
            assert pool == tuple(g for n in sorted(nodes) for g in range(n * 8, n * 8 + 8))
            assert len(nodes) >= 1
    assert T.node_churn(2, 8, seed=1) == T.node_churn(2, 8, seed=1)
    with pytest.raises(InputError, match="min_nodes"):
        T.node_churn(2, 8, min_nodes=2)


@pytest.mark.parametrize("min_nodes", [1, 2])
def test_node_churn_on_one_node_says_it_needs_two_nodes(min_nodes):
    """It said "min_nodes: leaves no node to take away (allowed: 1..0)": no min_nodes helps."""
    with pytest.raises(InputError) as e:
        T.node_churn(1, 8, min_nodes=min_nodes)
    assert e.value.field == "availability.churn"
    assert "at least 2 nodes" in e.value.problem and "job.gpus" in str(e.value.allowed)


def test_drift_periods_scale_one_class_and_round_trip(tmp_path):
    d = T.congestion(1000, periods=3, seed=2)
    assert len({(p.start_step, p.end_step) for p in d.periods}) == 3
    p0 = d.periods[0]
    from nereus.cost.efficiency import Efficiencies
    base = Efficiencies({p0.op_class: 0.5})
    assert d.apply(base, p0.start_step)[p0.op_class] == pytest.approx(0.5 * p0.factor)
    assert d.apply(base, p0.end_step + 10_000)[p0.op_class] == 0.5
    path = tmp_path / "drift.csv"
    T.save_drift(d, path)
    assert T.load_drift(path).periods == d.periods
    path.write_text("start_step,end_step,op_class,factor\n0,10,flops,0.5\n")
    with pytest.raises(InputError, match="op_class"):
        T.load_drift(path)


def test_alignment_puts_every_change_at_a_step_and_stops_the_clock_in_pauses():
    av = T.Availability((0.0, 150.0, 250.0, 400.0), ((0, 1), (0,), (), (0, 1)))
    ev = align(av, [100.0, 100.0, 100.0])
    assert ev[0].pause_s == 0 and ev[0].pool == (0, 1) and ev[0].changes == ()
    # step 1 covers [100, 200): GPU 1 leaves half way; step 2 starts at 200 and sees the pool
    # empty from 250 to 400 (a pause of 150 s) after half of it
    assert ev[1].changes == ((0.5, 0.0, (0,)),)
    assert ev[2].pool == (0,) and ev[2].changes == ((0.5, 150.0, (0, 1)),)
    # pools that are not usable (here: under 2 GPUs) count as empty: the job waits before
    # step 1 instead
    ev = align(av, [100.0, 100.0], usable=lambda pool: len(pool) >= 2)
    assert ev[1].changes == ((0.5, 250.0, (0, 1)),)
    with pytest.raises(InputError, match="never changes again"):
        align(T.Availability((0.0, 50.0), ((0,), ())), [100.0, 100.0])


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_csv_numbers_must_be_finite(tmp_path, bad):
    """NaN compares False with everything, so without a finite check it slips past ordering."""
    p = tmp_path / "pool.csv"
    p.write_text(f"time_s,gpus\n0,16\n{bad},8\n600,16\n")
    with pytest.raises(InputError, match=r"^availability row 3\.time_s: .*pool\.csv") as e:
        T.load_availability(p)
    assert "\n" not in str(e.value) and "finite" in str(e.value)
    p.write_text(f"time_s,gpus\n{bad},16\n")
    with pytest.raises(InputError, match=r"^availability row 2\.time_s"):
        T.load_availability(p)
    p = tmp_path / "lengths.csv"
    p.write_text(f"step,response_len_mean,response_len_max\n0,100,200\n1,{bad},200\n")
    with pytest.raises(InputError, match=r"^lengths row 3\.response_len_mean: .*lengths\.csv"):
        T.load_lengths(p)
    p = tmp_path / "drift.csv"
    p.write_text(f"start_step,end_step,op_class,factor\n0,10,gemm,{bad}\n")
    with pytest.raises(InputError, match=r"^drift row 2\.factor: .*drift\.csv"):
        T.load_drift(p)


def test_a_drift_period_must_start_inside_the_run(tmp_path):
    """One that starts at or after the run's last step would never run: it was left out with
    a note only --notes printed."""
    p = tmp_path / "drift.csv"
    p.write_text("start_step,end_step,op_class,factor\n0,10,gemm,0.5\n\n60,70,gemm,0.5\n")
    with pytest.raises(InputError, match=rf"^drift \({re.escape(str(p))}\) row 4\.start_step: "
                       r"60 is past the run's last step 59 \(60 steps\).*\(allowed: 0\.\.59, "
                       r"or a longer run\)$") as e:
        T.load_drift(p, 60)
    assert "\n" not in str(e.value)
    assert len(T.load_drift(p, 61).periods) == 2 and len(T.load_drift(p).periods) == 2


def test_congestion_periods_slow_each_named_class_once():
    with pytest.raises(InputError, match=r"^drift\.congestion\.op_classes: gemm is listed "
                       r"twice"):
        T.congestion(100, op_classes=("gemm", " gemm"))
    with pytest.raises(InputError, match=r"^drift\.congestion\.op_classes: an empty list"):
        T.congestion(100, op_classes=())
    assert T.congestion(100, periods=0, op_classes=()).periods == ()


def test_drift_factors_have_a_floor(tmp_path):
    p = tmp_path / "drift.csv"
    p.write_text("start_step,end_step,op_class,factor\n0,10,gemm,1e-300\n")
    with pytest.raises(InputError,
                       match=rf"^drift \({re.escape(str(p))}\) row 2\.factor: "
                             rf".*{T.MIN_DRIFT_FACTOR:g}"):
        T.load_drift(p)
    with pytest.raises(InputError, match=r"^drift\.congestion\.factor"):
        T.congestion(100, factor=1e-300)
    p.write_text(f"start_step,end_step,op_class,factor\n0,10,gemm,{T.MIN_DRIFT_FACTOR}\n")
    assert T.load_drift(p).periods[0].factor == T.MIN_DRIFT_FACTOR


def test_drift_may_not_lift_an_efficiency_above_the_peak():
    from nereus.cost.efficiency import Efficiencies
    hidden = Efficiencies({OpClass.GEMM: 0.5}, "h100-sxm-80gb")
    ok = T.DriftTrace((T.DriftPeriod(0, 10, OpClass.GEMM, 2.0),))
    ok.check(hidden)                                   # 0.5 x 2 = the peak exactly
    over = T.DriftTrace((T.DriftPeriod(0, 10, OpClass.GEMM, 50.0),))
    with pytest.raises(InputError, match=r"^drift: gemm .*above") as e:
        over.check(hidden)
    assert "\n" not in str(e.value)
    # overlapping periods multiply: each is fine, together they pass the peak
    both = T.DriftTrace((T.DriftPeriod(0, 10, OpClass.GEMM, 1.5),
                         T.DriftPeriod(5, 20, OpClass.GEMM, 1.5)))
    with pytest.raises(InputError, match=r"step 5"):
        both.check(hidden)
    # ... or push the product under the floor
    low = T.DriftTrace((T.DriftPeriod(0, 10, OpClass.GEMM, 0.05),
                        T.DriftPeriod(0, 10, OpClass.GEMM, 0.05)))
    with pytest.raises(InputError, match=rf"{T.MIN_DRIFT_FACTOR:g}"):
        low.check(hidden)
    # the cpu device has no peak to pass
    T.DriftTrace((T.DriftPeriod(0, 10, OpClass.GEMM, 50.0),)).check(
        Efficiencies({OpClass.GEMM: 0.5}, "cpu"))


@pytest.mark.parametrize("gpus", ["1000000000000", "0-100000000000", "5 2000000-2000001",
                                  "1000001"])
def test_availability_gpu_counts_and_ids_are_capped(tmp_path, gpus):
    """A huge count or range used to build the whole list of ids (MemoryError)."""
    p = tmp_path / "pool.csv"
    p.write_text(f"time_s,gpus\n0,16\n600,{gpus}\n")
    with pytest.raises(InputError,
                       match=rf"^availability \({re.escape(str(p))}\) row 3\.gpus: "
                             rf".*{T.MAX_DEVICES:,}"
                       ) as e:
        T.load_availability(p)
    assert "\n" not in str(e.value)
    p.write_text(f"time_s,gpus\n0,{T.MAX_DEVICES}\n")
    assert len(T.load_availability(p).pools[0]) == T.MAX_DEVICES


def test_availability_ids_are_bounded_by_the_cluster_when_given(tmp_path):
    p = tmp_path / "pool.csv"
    p.write_text("time_s,gpus\n0,16\n600,17\n")
    with pytest.raises(InputError, match=rf"^availability \({re.escape(str(p))}\) row 3\.gpus: "
                       r".*0\.\.15"):
        T.load_availability(p, max_gpus=16)
    p.write_text("time_s,gpus\n0,0-7\n600,8-16\n")
    with pytest.raises(InputError, match=rf"^availability \({re.escape(str(p))}\) row 3\.gpus: "
                       r".*16"):
        T.load_availability(p, max_gpus=16)


@pytest.mark.parametrize("gpus", ["7-0", "0-3 9-8"])
def test_a_reversed_range_is_an_error_not_an_empty_pool(tmp_path, gpus):
    p = tmp_path / "pool.csv"
    p.write_text(f"time_s,gpus\n0,16\n600,{gpus}\n")
    with pytest.raises(InputError, match=rf"^availability \({re.escape(str(p))}\) row 3\.gpus: "
                       r".*range"):
        T.load_availability(p)


@pytest.mark.parametrize("rows", ["0,16\n600,16\n300,16\n", "0,16\n600,8\n600,8\n",
                                  "0,16\n0,16\n"])
def test_availability_times_must_increase_even_when_the_pool_does_not_change(tmp_path, rows):
    p = tmp_path / "pool.csv"
    p.write_text("time_s,gpus\n" + rows)
    with pytest.raises(InputError, match=r"^availability row \d\.time_s: .*increas"):
        T.load_availability(p)


def test_node_churn_has_a_floor_on_hours():
    with pytest.raises(InputError, match=rf"^availability\.churn\.hours: .*{T.MIN_CHURN_HOURS:g}"):
        T.node_churn(2, 8, hours=1e-300)
    assert T.node_churn(2, 8, hours=T.MIN_CHURN_HOURS).changes() > 0


_HEADERS = {"lengths": ("step,response_len_mean,response_len_max", "0,100,200"),
            "availability": ("time_s,gpus", "0,16"),
            "drift": ("start_step,end_step,op_class,factor", "0,10,gemm,0.5")}
_LOADERS = {"lengths": T.load_lengths, "availability": T.load_availability,
            "drift": T.load_drift}


def _one_line_error(load, path, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern) as e:
        load(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("what", list(_HEADERS))
@pytest.mark.parametrize("extra, problem", [
    ("note", r"{p} has an unknown column 'note' in its header"),
    ("", r"column {n} of the header of {p} has no name"),
    ("{first}", r"{p} names column '{first}' twice in its header"),
], ids=["stray", "unnamed", "doubled"])
def test_a_trace_header_names_exactly_its_columns(tmp_path, what, extra, problem):
    """A stray column was read past (its values dropped unread), an unnamed one too, and of a
    doubled one the last value counted."""
    h, row = _HEADERS[what]
    cols = h.split(",")
    p = tmp_path / "t.csv"
    problem = problem.format(n=len(cols) + 1, first=cols[0], p=re.escape(str(p)))
    p.write_text(f"{h},{extra.format(first=cols[0])}\n{row},{row.split(',')[0]}\n")
    _one_line_error(_LOADERS[what], p, rf"^{what}: {problem} \(allowed: {', '.join(cols)}\)$")


def test_a_misspelt_column_is_named_beside_the_one_it_replaced(tmp_path):
    """It was reported only as the column it replaced ('lacks column response_len_mean')."""
    p = tmp_path / "lengths.csv"
    p.write_text("step,response_len_mena,response_len_max\n0,100,200\n")
    with pytest.raises(InputError, match=rf"^lengths: {re.escape(str(p))} has an unknown column "
                       r"'response_len_mena' in its header, and lacks column "
                       r"'response_len_mean' \(allowed: step, response_len_mean, "
                       r"response_len_max\)$"):
        T.load_lengths(p)


@pytest.mark.parametrize("what", list(_HEADERS))
@pytest.mark.parametrize("more", [True, False], ids=["one-more", "one-fewer"])
def test_a_trace_row_has_a_field_for_each_column(tmp_path, what, more):
    """A row with a stray field had it dropped (``600,8,12``: 8 GPUs, not ids 8 and 12), and
    in an availability trace a row short of its gpus field read as an empty pool."""
    h, row = _HEADERS[what]
    bad = row + ",7" if more else row.rsplit(",", 1)[0]
    n = h.count(",") + 1 + (1 if more else -1)
    p = tmp_path / "t.csv"
    p.write_text(f"{h}\n{row}\n{bad}\n")
    _one_line_error(_LOADERS[what], p, rf"^{what} row 3: {n} fields? in {re.escape(str(p))}, "
                    rf"but its header has {h.count(',') + 1} columns \(allowed: a field for "
                    rf"each of {h.replace(',', ', ')}")


def test_comma_separated_device_ids_are_an_error_that_says_how_to_write_them(tmp_path):
    p = tmp_path / "pool.csv"
    p.write_text("time_s,gpus\n0,16\n600,8,12\n")
    with pytest.raises(InputError, match=rf"^availability row 3: 3 fields in {re.escape(str(p))}.*"
                                         r"separated by spaces, as in 0-7 12 13"):
        T.load_availability(p)
    p.write_text("time_s,gpus\n0,16\n600,\n1200,8 12\n")   # an empty field: no GPU
    assert T.load_availability(p).pools == (tuple(range(16)), (), (8, 12))


def test_a_row_is_named_by_its_line_in_the_file_blank_lines_included(tmp_path):
    """Blank lines are skipped, but a row keeps the number of the line it is on: with two
    blank lines before it, the bad row on line 5 was reported as row 3."""
    p = tmp_path / "pool.csv"
    p.write_text("time_s,gpus\n0,8\n\n\n600,8,12\n")
    with pytest.raises(InputError, match=r"^availability row 5: 3 fields"):
        T.load_availability(p)
    p.write_text("time_s,gpus\n0,8\n\n600,x\n")
    with pytest.raises(InputError, match=rf"^availability \({re.escape(str(p))}\) row 4\.gpus"):
        T.load_availability(p)
    p.write_text("step,response_len_mean,response_len_max\n\n0,10,20\n1,nan,20\n")
    with pytest.raises(InputError, match=r"^lengths row 4\.response_len_mean"):
        T.load_lengths(p)


@pytest.mark.parametrize("rows, problem, allowed", [
    ("0,500,700\n5,510,720\n", "row 3.step: step 5 where step 1 is expected: steps 1..4 missing",
     "step 1 on this row; the rows number the steps 0, 1, 2, ... in order"),
    ("0,500,700\n2,510,720\n", "row 3.step: step 2 where step 1 is expected: step 1 missing",
     "step 1 on this row"),
    ("1,500,700\n", "row 2.step: step 1 where step 0 is expected: step 0 missing",
     "step 0 on this row"),
    ("0,500,700\n1,500,700\n1,500,700\n", "row 4.step: step 1 after step 1: a repeated step",
     "step 2 on this row"),
    # read as "step -1 after step -1: a repeated step": there was no step before it
    ("-1,500,700\n", "row 2.step: step -1 is negative", "step 0 on this row"),
])
def test_a_lengths_row_out_of_order_says_which_step_is_missing(tmp_path, rows, problem, allowed):
    """A gap read "step 5 out of order (allowed: 1)"."""
    p = tmp_path / "l.csv"
    p.write_text("step,response_len_mean,response_len_max\n" + rows)
    with pytest.raises(InputError) as e:
        T.load_lengths(p)
    msg = str(e.value)
    assert msg.startswith(f"lengths ({p}) ") and problem in msg, msg
    assert f"(allowed: {allowed}" in msg and "\n" not in msg


def test_files_of_the_same_name_in_different_folders_are_told_apart(tmp_path, monkeypatch):
    """A trace file was named by its basename: a bad row in b/lengths.csv read as one in
    lengths.csv, which a/lengths.csv is too. It is named by its path as given."""
    monkeypatch.chdir(tmp_path)
    head = "step,response_len_mean,response_len_max\n0,500,700\n"
    for folder, row in (("a", "1,510,720"), ("b", "2,510,720")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "lengths.csv").write_text(f"{head}{row}\n")
    assert T.load_lengths("a/lengths.csv").mean == (500, 510)
    with pytest.raises(InputError) as e:
        T.load_lengths("b/lengths.csv")
    assert str(e.value) == ("lengths (b/lengths.csv) row 3.step: step 2 where step 1 is "
                            "expected: step 1 missing (allowed: step 1 on this row; the rows "
                            "number the steps 0, 1, 2, ... in order, one row each)")
    # a message that names the file in its problem names it the same way
    (tmp_path / "b" / "lengths.csv").write_text(f"{head}x,510,720\n")
    with pytest.raises(InputError, match=r"^lengths row 3\.step: 'x' in b/lengths\.csv is not "
                       r"an integer \(allowed: an integer, step 1 on this row;"):
        T.load_lengths("b/lengths.csv")


@pytest.mark.parametrize("what, text, pattern", [
    ("lengths", "step,response_len_mean,response_len_max\n0,abc,700\n",
     (r"^lengths row 2\.response_len_mean: 'abc' in {p} is not a finite number \(allowed: a "
     r"finite number of tokens >= 1\)$")),
    ("lengths", "step,response_len_mean,response_len_max\n0.0,500,700\n",
     (r"^lengths row 2\.step: '0\.0' in {p} is not an integer \(allowed: an integer, step 0 "
     r"on this row; the rows number the steps 0, 1, 2, \.\.\. in order, one row each\)$")),
    ("availability", "time_s,gpus\n0,16\nnan,8\n",
     (r"^availability row 3\.time_s: 'nan' in {p} is not a finite number \(allowed: a finite "
     r"number of seconds >= 0")),
    ("drift", "start_step,end_step,op_class,factor\n0,x,gemm,0.5\n",
     (r"^drift row 2\.end_step: 'x' in {p} is not an integer \(allowed: a step number, "
     r"0 <= start_step < end_step\)$")),
    ("drift", "start_step,end_step,op_class,factor\n0,5,gemm,abc\n",
     (r"^drift row 2\.factor: 'abc' in {p} is not a finite number \(allowed: a finite number "
     r">= 0\.01\)$")),
    ("drift", "start_step,end_step,op_class,factor\n5,5,gemm,0.5\n",
     (r"^drift \({p}\) row 2: start_step 5 and end_step 5 \(allowed: 0 <= start_step < "
     r"end_step")),
    ("lengths", "step,response_len_mean,response_len_max\n",
     r"^lengths: {p} has no rows \(allowed: a header, then one row per step\)$"),
])
def test_a_bad_csv_value_says_what_is_allowed(tmp_path, what, text, pattern):
    p = tmp_path / "t.csv"
    p.write_text(text)
    _one_line_error(_LOADERS[what], p, pattern.format(p=re.escape(str(p))))


def test_overlapping_drift_periods_say_their_factors_multiply():
    from nereus.cost.efficiency import Efficiencies
    hidden = Efficiencies({OpClass.GEMM: 0.5}, "h100-sxm-80gb")
    low = T.DriftTrace((T.DriftPeriod(0, 10, OpClass.GEMM, 0.05),
                        T.DriftPeriod(5, 10, OpClass.GEMM, 0.1)))
    with pytest.raises(InputError) as e:
        low.check(hidden)
    assert str(e.value).startswith("drift: gemm at step 5: 2 periods overlap, so their factors "
                                   "0.05 x 0.1 multiply to 0.005, below 0.01"), e.value
    assert "multiply their factors" in str(e.value)


def test_count_says_one_in_the_singular():
    assert count(1, "step") == "1 step" and count(0, "step") == "0 steps"
    assert count(2, "GPU") == "2 GPUs" and count(1000, "step", fmt=",") == "1,000 steps"
    assert count(2, "policy", "policies") == "2 policies"
    d = T.DriftTrace((T.DriftPeriod(0, 10, OpClass.GEMM, 0.5),))
    assert d.head(1).source.endswith("cut to its first 1 step: 1 period cut to end at step 1")
    assert "whole-node churn of 2 x 1 GPU, 1 change every" in T.node_churn(2, 1, 10, 1).source


@pytest.mark.parametrize("what, text, column", [
    ("lengths", "step,response_len_mean,response_len_max\n0,5_00,7_00\n", "response_len_mean"),
    ("lengths", "step,response_len_mean,response_len_max\n1_0,500,700\n", "step"),
    ("lengths", "step,response_len_mean,response_len_max\n0,\u0665\u0660\u0660,700\n",
     "response_len_mean"),
    ("availability", "time_s,gpus\n0_0,8\n", "time_s"),
    ("drift", "start_step,end_step,op_class,factor\n0,1_0,gemm,0.5\n", "end_step"),
    ("drift", "start_step,end_step,op_class,factor\n0,10,gemm,0_5\n", "factor"),
])
def test_csv_numbers_are_plain_decimals(tmp_path, what, text, column):
    """float() and int() take Python's '5_00' and other scripts' digits: a lengths row
    '0,5_00,7_00' loaded as 500 and 700 tokens."""
    p = tmp_path / "t.csv"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError,
                       match=rf"^{what} row 2\.{column}: '.+' in {re.escape(str(p))} is not "):
        _LOADERS[what](p)


@pytest.mark.parametrize("text", ["1e3", "+5", "5.", ".5e3", "1E+02", " 7 "])
def test_csv_numbers_in_the_forms_a_spreadsheet_writes_still_load(tmp_path, text):
    p = tmp_path / "t.csv"
    p.write_text(f"step,response_len_mean,response_len_max\n0,{text},2000\n")
    assert T.load_lengths(p).mean == (float(text),)
