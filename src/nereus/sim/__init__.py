"""sim layer: traces, a job simulator with a hidden ground truth, policies, scenarios."""

from nereus.sim.policies import POLICIES
from nereus.sim.scenarios import SCENARIOS, Scenario, builtin, load_scenario, run_scenario
from nereus.sim.simulator import PolicyResult, SimResult, Simulator, StepRow

__all__ = ["POLICIES", "SCENARIOS", "PolicyResult", "Scenario", "SimResult", "Simulator",
           "StepRow", "builtin", "load_scenario", "run_scenario"]
