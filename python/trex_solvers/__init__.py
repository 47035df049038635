"""T-Rex solver look-alikes: gurobipy / coptpy / pyscipopt / pulp APIs backed by open solvers via `trex solve`.

Put this directory on PYTHONPATH so that `import gurobipy` finds the look-alike; `trex eval` does so for every
program it runs.
"""
