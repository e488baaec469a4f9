"""An availability file is read held to the job's GPUs: its ids cost what the job's do."""

import re
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.errors import InputError
from nereus.sim import traces as T
from nereus.sim.scenarios import load_scenario

JOB = ("job: {model: llama-3.1-8b, algo: ppo, gpus: 16, cluster: {device: h100-sxm-80gb, "
       "devices_per_node: 8}}\nsteps: 5\navailability: {csv: a.csv}\n")


def test_a_small_file_naming_a_million_ids_costs_what_the_jobs_gpus_do(tmp_path):
    """Rows alternating 0-999999 and 0-999998 (300 of them: 4 KB) built a million-id set per
    row before cutting it to the job's 16 GPUs: 14 GB and a MemoryError. Each row is cut as it
    is read."""
    rows = "".join(f"{60 * i},0-{999_999 - i % 2}\n" for i in range(6))
    (tmp_path / "a.csv").write_text("time_s,gpus\n" + rows)
    (tmp_path / "s.yaml").write_text(JOB)
    tracemalloc.start()
    try:
        av = load_scenario(tmp_path / "s.yaml").availability
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # one row's million ids alone took more than 40 MiB
    assert av.pools == (tuple(range(16)),)  # every row: the job's 16, one pool from time 0
    assert "the job's GPUs of it (0-15, job.gpus)" in av.source


def test_a_pool_file_held_to_ids_lists_what_it_names(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("time_s,gpus\n0,0-999999\n60,3 900000-900001\n120,0\n")
    av, listed = T.read_availability(p, [900001, 3, 5])
    assert av.pools == ((3, 5, 900001), (3, 900001), ())
    assert listed == ((0, 999_999),)
    with pytest.raises(InputError, match=rf"^availability \({re.escape(str(p))}\) row 3\.gpus: "
                       r"device id 3 listed more than once"):
        p.write_text("time_s,gpus\n0,0-999999\n60,0-999998 3\n")
        T.read_availability(p, range(16))
    with pytest.raises(InputError, match=rf"^availability \({re.escape(str(p))}\) row 2\.gpus: "
                       r"device id 1000000 is above 999,999"):
        p.write_text("time_s,gpus\n0,0-1000000\n")
        T.read_availability(p, range(16))


_FIELD = st.lists(st.one_of(
    st.integers(0, 60).map(str),
    st.tuples(st.integers(0, 60), st.integers(0, 60)).map(lambda r: f"{r[0]}-{r[1]}"),
    st.sampled_from(["x", "-3", "70", "5-"])), min_size=1, max_size=6).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(_FIELD, st.sets(st.integers(0, 64)))
def test_ids_held_to_keep_are_the_ids_read_then_cut_and_the_errors_the_same(text, keep):
    """Cutting a field while reading it changes neither its result (after the cut) nor which
    error a malformed one gets."""
    def read(**kw):
        try:
            return T.parse_ids(text, "f", 64, **kw)
        except InputError as e:
            return str(e)

    whole, held = read(), read(keep=keep)
    assert held == (whole if isinstance(whole, str) else tuple(g for g in whole if g in keep))


def test_a_huge_time_in_a_pool_file_is_printed_short(tmp_path):
    """A change at 1e308 s was printed with str(int(v)): a 309-digit number in a one-line
    error."""
    from nereus.sim.scenarios import simulator
    (tmp_path / "a.csv").write_text("time_s,gpus\n0,16\n1e308,8\n")
    (tmp_path / "s.yaml").write_text(JOB.replace("steps: 5", "steps: 3"))
    # a.csv is resolved beside s.yaml, and named by that path
    with pytest.raises(InputError, match=r"^availability\.csv: the first change of the job's "
                       rf"pool in {re.escape(str(tmp_path / 'a.csv'))}, at 1e\+308 s, comes "
                       r"after the run ends") as e:
        simulator(load_scenario(tmp_path / "s.yaml"))
    # short but for the file's path, which is as long as pytest's tmp_path makes it
    assert len(str(e.value).replace(str(tmp_path / "a.csv"), "a.csv")) < 400
