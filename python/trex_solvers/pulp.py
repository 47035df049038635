"""A thin `pulp` look-alike (open solvers through `trex solve`). Variables default to free, as in PuLP."""
import itertools

import _trex_core as core
from _trex_core import LinExpr, QuadExpr, Var

LpMinimize = 1
LpMaximize = -1
LpContinuous = "Continuous"
LpInteger = "Integer"
LpBinary = "Binary"
LpStatusNotSolved, LpStatusOptimal, LpStatusInfeasible, LpStatusUnbounded, LpStatusUndefined = 0, 1, -1, -2, -3
LpStatus = {0: "Not Solved", 1: "Optimal", -1: "Infeasible", -2: "Unbounded", -3: "Undefined"}
LpConstraintLE, LpConstraintEQ, LpConstraintGE = -1, 0, 1
PulpSolverError = core.SolverError
_TYPES = {"Continuous": "C", "Integer": "I", "Binary": "B"}


def LpVariable(name, lowBound=None, upBound=None, cat="Continuous", e=None):
    t = _TYPES.get(cat, "C")
    if t == "B":
        lowBound, upBound = 0, 1
    lb = -core.INF if lowBound is None else float(lowBound)
    ub = core.INF if upBound is None else float(upBound)
    return Var(None, -1, lb, ub, t, 0.0, str(name))


def _dicts(name, indices=None, lowBound=None, upBound=None, cat="Continuous", indexs=None, indexStart=None):
    indices = indices if indices is not None else indexs
    out = {}
    for k in indices:
        nm = "%s_%s" % (name, "_".join(str(p) for p in k) if isinstance(k, tuple) else k)
        out[k] = LpVariable(nm, lowBound, upBound, cat)
    return out


def _matrix(name, indices, lowBound=None, upBound=None, cat="Continuous"):
    return [LpVariable("%s_%s" % (name, i), lowBound, upBound, cat) for i in indices]


LpVariable.dicts = _dicts
LpVariable.matrix = _matrix
Var.varValue = property(lambda self: self.sol)
Var.value = lambda self: self.sol
LinExpr.value = lambda self: self.getValue()
QuadExpr.value = lambda self: self.getValue()


def LpAffineExpression(e=None, constant=0, name=None):
    expr = LinExpr()
    if isinstance(e, dict):
        for v, c in e.items():
            expr += c * v
    elif isinstance(e, (list, tuple)):
        for v, c in e:
            expr += c * v
    elif e is not None:
        expr += e
    expr += constant
    return expr


def LpConstraint(e, sense=0, name=None, rhs=0):
    d = core.as_expr(e) - rhs
    return core.TempConstr(d, {-1: "<", 0: "=", 1: ">"}[sense])


def lpSum(items):
    if isinstance(items, dict):
        items = items.values()
    return core.quicksum(items)


def lpDot(a, b):
    return core.quicksum(x * y for x, y in zip(a, b))


def value(x):
    if x is None:
        return None
    if isinstance(x, Var):
        return x.sol
    if isinstance(x, (LinExpr, QuadExpr)):
        try:
            return x.getValue()
        except core.SolverError:
            return None
    return x


class _Solver:
    def __init__(self, *a, **k):
        self.timeLimit = k.get("timeLimit")


PULP_CBC_CMD = COIN_CMD = GLPK_CMD = GLPK = SCIP_CMD = HiGHS_CMD = HiGHS = GUROBI = GUROBI_CMD = CPLEX_CMD = _Solver
COINMP_DLL = PULP_CHOCO_CMD = _Solver


def listSolvers(onlyAvailable=False):
    return ["PULP_CBC_CMD"]


class LpProblem(core.BaseModel):
    def __init__(self, name="NoName", sense=LpMinimize):
        super().__init__(name)
        self.sense = sense
        self.objective = None
        self.constraints = {}
        self.status = LpStatusNotSolved
        self.sol_status = 0

    def __iadd__(self, other):
        name = None
        if isinstance(other, tuple):
            other, name = other[0], other[1]
        if isinstance(other, core.TempConstr):
            self.constraints[name or "_C%d" % (len(self.constraints) + 1)] = other
        elif isinstance(other, bool):
            if not other:
                raise core.SolverError("a constraint with constant sides is always false")
        else:
            self.objective = core.as_expr(other)
        return self

    def addConstraint(self, c, name=None):
        self += (c, name)

    def setObjective(self, obj):
        self.objective = core.as_expr(obj)

    def _collect(self):
        seen = {}
        exprs = [self.objective] if self.objective is not None else []
        exprs += [c.expr for c in self.constraints.values()]
        for e in exprs:
            lin = e.lin if isinstance(e, QuadExpr) else e
            for v, _ in lin.terms.values():
                seen.setdefault(v.uid, v)
            if isinstance(e, QuadExpr):
                for a, b, _ in e.quad.values():
                    seen.setdefault(a.uid, a)
                    seen.setdefault(b.uid, b)
        self.vars = list(seen.values())
        for i, v in enumerate(self.vars):
            v.index = i
            v.model = self
        self.rows = []
        for name, c in self.constraints.items():
            r = core.make_row(self, len(self.rows), c, name)
            self.rows.append(r)

    def solve(self, solver=None, **k):
        self._collect()
        obj = self.objective
        self.objective = obj if obj is not None else LinExpr()
        try:
            st = self.run_solver()
        finally:
            self.objective = obj
        self.status = {"optimal": 1, "infeasible": -1, "unbounded": -2}.get(st, -3)
        self.sol_status = self.status
        return self.status

    def writeLP(self, filename, *a, **k):
        self._collect()
        obj = self.objective
        self.objective = obj if obj is not None else LinExpr()
        try:
            self.write_lp_file(filename)
        finally:
            self.objective = obj

    def variables(self):
        self._collect()
        return sorted(self.vars, key=lambda v: v.name)

    def numVariables(self):
        return len(self.variables())

    def numConstraints(self):
        return len(self.constraints)

    @property
    def name_(self):
        return self.name
