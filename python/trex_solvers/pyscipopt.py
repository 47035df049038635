"""A thin `pyscipopt` look-alike (open solvers through `trex solve`)."""
import _trex_core as core
from _trex_core import LinExpr as Expr, QuadExpr, quicksum

__all__ = ["Model", "quicksum", "quickprod", "Expr", "exp", "log", "sqrt"]


def _nonlinear(name):
    def f(*a, **k):
        raise core.SolverError("%s() is not supported by the open-solver look-alike" % name)
    return f


exp, log, sqrt, quickprod = _nonlinear("exp"), _nonlinear("log"), _nonlinear("sqrt"), _nonlinear("quickprod")


class Model(core.BaseModel):
    def __init__(self, problemName="model", *a, **k):
        super().__init__(problemName)

    def addVar(self, name="", vtype="C", lb=0.0, ub=None, obj=0.0, **k):
        t = str(vtype).upper()[:1]
        t = {"C": "C", "I": "I", "B": "B"}.get(t, "C")
        return self.new_var(lb, ub, t, obj, name)

    def addCons(self, cons, name="", **k):
        return self.new_row(cons, name)

    def addConss(self, conss, name="", **k):
        return [self.addCons(c, "%s_%d" % (name, i) if name else "") for i, c in enumerate(conss)]

    def setObjective(self, expr, sense="minimize", clear=True):
        self.set_objective(expr, -1 if str(sense).lower().startswith("max") else 1)

    def setMaximize(self):
        self.sense = -1

    def setMinimize(self):
        self.sense = 1

    def getObjective(self):
        return self.objective

    def optimize(self):
        self.run_solver()

    def hideOutput(self, quiet=True):
        pass

    def setRealParam(self, name, value):
        if name == "limits/time":
            self.time_limit = float(value)

    def setParam(self, name, value):
        if name == "limits/time":
            self.time_limit = float(value)

    setIntParam = setBoolParam = setLongintParam = setStringParam = setParam

    def getStatus(self):
        return {"optimal": "optimal", "infeasible": "infeasible", "unbounded": "unbounded",
                "infeasible_or_unbounded": "inforunbd", "limit": "timelimit", "loaded": "unknown"}.get(
                    self.status_text, "unknown")

    def getObjVal(self):
        if self.objective_value is None:
            raise core.SolverError("no solution available (status %s)" % self.status_text)
        return self.objective_value

    def getPrimalbound(self):
        return self.getObjVal()

    def getVal(self, expr):
        if isinstance(expr, core.Var):
            return expr.solution_value()
        return expr.getValue()

    def getVars(self):
        return list(self.vars)

    def getNVars(self):
        return len(self.vars)

    def getNConss(self):
        return len(self.rows)

    def getSolvingTime(self):
        return self.solve_seconds

    def getBestSol(self):
        return self

    def writeProblem(self, filename="model.cip", **k):
        if str(filename).lower().endswith(".lp"):
            self.write_lp_file(str(filename))

    def __getitem__(self, var):  # sol[x] on getBestSol()
        return self.getVal(var)


core.Var.getLbOriginal = lambda self: self.lb
core.Var.getUbOriginal = lambda self: self.ub
