"""A thin `coptpy` look-alike over the gurobipy one (open solvers through `trex solve`)."""
import _trex_core as core
import gurobipy as _g
from _trex_core import LinExpr, QuadExpr, quicksum

__all__ = ["COPT", "Envr", "EnvrConfig", "Model", "LinExpr", "QuadExpr", "quicksum", "tupledict", "tuplelist",
           "multidict", "CoptError"]

tupledict, tuplelist, multidict = _g.tupledict, _g.tuplelist, _g.multidict


class CoptError(core.SolverError):
    def __init__(self, msg, retcode=1):
        super().__init__(msg)
        self.message = msg
        self.retcode = retcode


class COPT:
    INFINITY = 1e30
    MINIMIZE = 1
    MAXIMIZE = -1
    CONTINUOUS = "C"
    INTEGER = "I"
    BINARY = "B"
    LESS_EQUAL = "L"
    GREATER_EQUAL = "G"
    EQUAL = "E"
    UNSTARTED, OPTIMAL, INFEASIBLE, UNBOUNDED, INF_OR_UNB, NUMERICAL, NODELIMIT = 0, 1, 2, 3, 4, 5, 6
    TIMEOUT, UNFINISHED, INTERRUPTED = 8, 9, 10

    class Param:
        TimeLimit = "TimeLimit"
        Logging = "Logging"
        RelGap = "RelGap"

    class Attr:
        ObjVal = "ObjVal"
        LpObjval = "LpObjval"
        BestObj = "BestObj"


_STATUS = {"optimal": COPT.OPTIMAL, "infeasible": COPT.INFEASIBLE, "unbounded": COPT.UNBOUNDED,
           "infeasible_or_unbounded": COPT.INF_OR_UNB, "limit": COPT.TIMEOUT, "error": COPT.NUMERICAL,
           "loaded": COPT.UNSTARTED}

_SENSE = {"L": "<", "G": ">", "E": "=", "<": "<", ">": ">", "=": "=", "<=": "<", ">=": ">", "==": "="}


class EnvrConfig:
    def set(self, *a):
        pass


class Envr:
    def __init__(self, *a, **k):
        pass

    def createModel(self, name=""):
        return Model(self, name)

    def close(self):
        pass


class Model(_g.Model):
    def __init__(self, env=None, name=""):
        super().__init__(name if isinstance(name, str) else "")

    def addConstr(self, lhs, sense=None, rhs=None, name=""):
        if isinstance(lhs, core.TempConstr):
            return super().addConstr(lhs, sense if isinstance(sense, str) else name)
        return super().addLConstr(lhs, _SENSE[str(sense)], rhs, name)

    def addBoundConstr(self, expr, lb=-COPT.INFINITY, ub=COPT.INFINITY, name=""):
        return self.addRange(expr, lb, ub, name)

    def setObjSense(self, sense):
        self.sense = int(sense)

    def solve(self):
        self.run_solver()

    solveLP = solve

    def setParam(self, name, value):
        if str(name).lower() == "timelimit":
            self.time_limit = float(value)

    @property
    def status(self):
        return _STATUS.get(self.status_text, COPT.NUMERICAL)

    Status = status

    @property
    def objval(self):
        if self.objective_value is None:
            raise CoptError("no objective value: the model was not solved to optimality")
        return self.objective_value

    ObjVal = objval
    LpObjval = objval
    BestObj = objval

    def getAttr(self, name, objs=None):
        if objs is None:
            return getattr(self, name)
        return super().getAttr(name, objs)

    def getInfo(self, name, objs):
        key = {"value": "X"}.get(str(name).lower(), name)
        if isinstance(objs, dict):
            return {k: getattr(v, key) for k, v in objs.items()}
        if isinstance(objs, (list, tuple)):
            return [getattr(v, key) for v in objs]
        return getattr(objs, key)

    def getValues(self, vars=None):
        return [v.X for v in (vars if vars is not None else self.vars)]


core.Var.getInfo = lambda self, name: self.X if str(name).lower() == "value" else getattr(self, name)
core.Var.getName = lambda self: self.name
