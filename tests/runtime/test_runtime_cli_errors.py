"""``nereus transition --execute``: a run that fails ends in one line and exit code 4."""

import pytest

from nereus.runtime import demo
from nereus.runtime.memory import CapacityError
from nereus.transition.instances import make_job, paper_example_b


@pytest.mark.parametrize("error", [CapacityError(3, 9 << 30, 0, 8 << 30, "a Merge"),
                                   RuntimeError("a bug")])
def test_a_failed_run_is_one_line_and_exit_4(monkeypatch, capsys, error) -> None:
    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(demo, "execute_transition", boom)
    job = make_job("llama-3.1-8b", 32)
    cur, tgt = paper_example_b()
    if isinstance(error, CapacityError):
        assert demo.cli_execute(job, cur, tgt) == demo.EXIT_RUN_FAILED
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: the transition did not run")
        assert "CapacityError" in err[0] and "worker 3" in err[0]
    else:  # a bug is not dressed up as a user-facing failure
        with pytest.raises(RuntimeError, match="a bug"):
            demo.cli_execute(job, cur, tgt)
