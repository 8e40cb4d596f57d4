"""HiGHS keeps one scheduler per process, sized by the first solver that runs; a later solver
asking for another number of threads does not run (status error, no point). A verification's LP
followed by a counterfactual's MILP in one process must both solve. Runs in a fresh process: the
scheduler of the test process may already exist."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import numpy as np
    import highspy
    from assay._lp import silent_highs
    from assay.cfx._model import MilpBuilder

    # An LP as the verifier builds them (leaf LPs, LP refinement): max x0 + x1 on [0, 1]^2.
    lp = silent_highs()
    lp.addVars(2, np.zeros(2), np.ones(2))
    lp.changeColsCost(2, np.array([0, 1], dtype=np.int32), np.array([-1.0, -1.0]))
    lp.run()
    assert lp.getModelStatus() == highspy.HighsModelStatus.kOptimal, lp.getModelStatus()

    # Then a counterfactual's MILP: min -x0 - 2 x1 with x binary and x0 + x1 <= 1.
    milp = MilpBuilder()
    x = milp.add(2, 0.0, 1.0, integer=True)
    milp.row({int(x[0]): 1.0, int(x[1]): 1.0}, upper=1.0)
    solution = milp.solve(cost=[-1.0, -2.0])
    print(solution.status, solution.objective)
""")


def test_an_lp_then_a_milp_in_one_process_both_solve():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    status, objective = done.stdout.split()
    assert status == "optimal" and float(objective) == -2.0
