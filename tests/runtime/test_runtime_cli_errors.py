"""``nereus transition --execute``: a run that fails ends in one line and exit code 4."""

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.commands.common import EXIT_RUN_FAILED
from nereus.runtime import demo
from nereus.runtime.memory import CapacityError
from nereus.transition.instances import paper_example_b

runner = CliRunner()


@pytest.mark.parametrize("error", [CapacityError(3, 9 << 30, 0, 8 << 30, "a Merge"),
                                   RuntimeError("a bug")])
def test_a_failed_run_is_one_line_and_exit_4(monkeypatch, tmp_path, error) -> None:
    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(demo, "execute_transition", boom)
    paths = []
    for name, plan in zip(("cur.json", "tgt.json"), paper_example_b()):
        paths.append(tmp_path / name)
        paths[-1].write_text(plan.to_json())
    r = runner.invoke(app, ["transition", *map(str, paths), "--model", "llama-3.1-8b",
                            "--execute"])
    if isinstance(error, CapacityError):
        assert r.exit_code == EXIT_RUN_FAILED == 4, r.output
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: the transition did not run")
        assert "CapacityError" in err[0] and "worker 3" in err[0]
        assert "Traceback" not in r.output
    else:  # a bug is not dressed up as a user-facing failure
        assert isinstance(r.exception, RuntimeError) and "a bug" in str(r.exception)
