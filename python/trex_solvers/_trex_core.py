"""Shared core of the T-Rex solver look-alikes (gurobipy, coptpy, pyscipopt, pulp).

Expressions, variables and constraints live here; a model is solved by writing a CPLEX LP file with
internal names (v0, v1, ... / r0, r1, ...) and running `$TREX_BIN solve FILE --json`, which uses the open
solvers (CBC/CLP, GLPK, Ipopt). Only the standard library is used; Python >= 3.9.
"""
import itertools
import json
import math
import numbers
import os
import re
import subprocess
import time

INF = float("inf")
BIG = 1e30  # bounds at or beyond this magnitude are infinite (Gurobi's GRB.INFINITY is 1e100)

_uid_counter = itertools.count()
_models = []  # every model created in this process, in creation order (the runner looks here)


class SolverError(Exception):
    """Raised for operations the look-alike cannot perform (the vendor error classes derive from it)."""


def _is_number(x):
    return isinstance(x, numbers.Number) and not isinstance(x, complex)


def _num(x):
    return float(x)


class _Operand:
    """Arithmetic shared by Var, LinExpr and QuadExpr; numpy defers to these operators."""

    __array_ufunc__ = None
    __array_priority__ = 1000

    def _as_quad(self):
        return QuadExpr(self._as_lin())

    def __add__(self, other):
        if isinstance(other, QuadExpr) or isinstance(self, QuadExpr):
            q = self._as_quad().copy()
            q._iadd(other, 1.0)
            return q
        e = self._as_lin().copy()
        e._iadd(other, 1.0)
        return e

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, QuadExpr) or isinstance(self, QuadExpr):
            q = self._as_quad().copy()
            q._iadd(other, -1.0)
            return q
        e = self._as_lin().copy()
        e._iadd(other, -1.0)
        return e

    def __rsub__(self, other):
        return (-self) + other

    def __neg__(self):
        return self * -1.0

    def __pos__(self):
        return self

    def __mul__(self, other):
        if _is_number(other):
            c = _num(other)
            if isinstance(self, QuadExpr):
                return self._scaled(c)
            return self._as_lin()._scaled(c)
        if isinstance(other, (Var, LinExpr, QuadExpr)):
            if isinstance(self, QuadExpr) or isinstance(other, QuadExpr):
                if isinstance(other, QuadExpr) and other._is_linear():
                    return self * other.lin
                if isinstance(self, QuadExpr) and self._is_linear():
                    return self.lin * other
                raise SolverError("expressions above degree 2 are not supported")
            return _lin_times_lin(self._as_lin(), other._as_lin())
        return NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, other):
        if _is_number(other):
            return self * (1.0 / _num(other))
        if isinstance(other, (Var, LinExpr, QuadExpr)):
            lin = other._as_lin() if not isinstance(other, QuadExpr) else None
            if lin is not None and not lin.terms:
                return self * (1.0 / lin.constant)
            raise SolverError("division by a decision variable is not supported (nonlinear)")
        return NotImplemented

    def __rtruediv__(self, other):
        raise SolverError("division by a decision variable is not supported (nonlinear)")

    def __pow__(self, p):
        if _is_number(p) and float(p) == 2.0:
            return self * self
        if _is_number(p) and float(p) == 1.0:
            return self + 0
        if _is_number(p) and float(p) == 0.0:
            return LinExpr(1.0)
        raise SolverError("only squares (** 2) of expressions are supported")

    def __le__(self, other):
        return TempConstr(self - other, "<")

    def __ge__(self, other):
        return TempConstr(self - other, ">")

    def __eq__(self, other):
        return TempConstr(self - other, "=")

    def __hash__(self):
        return id(self)

    def __bool__(self):
        raise SolverError("an expression has no truth value (a constraint was used in an `if`?)")


class Var(_Operand):

    def __init__(self, model, index, lb, ub, vtype, obj, name):
        self.model = model
        self.index = index
        self.uid = next(_uid_counter)
        self.lb = lb
        self.ub = ub
        self.vtype = vtype  # 'C', 'I', 'B'
        self.obj = obj
        self.name = name
        self.sol = None

    def _as_lin(self):
        e = LinExpr()
        e.terms[self.uid] = [self, 1.0]
        return e

    def __hash__(self):
        return self.uid

    def __bool__(self):
        return True

    def __repr__(self):
        return "<Var %s>" % self.name

    def solution_value(self):
        if self.sol is None:
            raise SolverError("no solution value for variable %s (model not solved to optimality)" % self.name)
        return self.sol


class LinExpr(_Operand):
    def __init__(self, arg1=None, arg2=None):
        self.terms = {}  # uid -> [var, coef]
        self.constant = 0.0
        if arg1 is None:
            return
        if arg2 is not None:  # LinExpr(coeffs, vars)
            for c, v in zip(arg1, arg2):
                self._iadd(v, _num(c))
            return
        if isinstance(arg1, (list, tuple)) and arg1 and isinstance(arg1[0], tuple):  # [(c, v), ...]
            for c, v in arg1:
                self._iadd(v, _num(c))
            return
        self._iadd(arg1, 1.0)

    def _as_lin(self):
        return self

    def copy(self):
        e = LinExpr()
        e.terms = {k: [v[0], v[1]] for k, v in self.terms.items()}
        e.constant = self.constant
        return e

    def _scaled(self, c):
        e = LinExpr()
        e.terms = {k: [v[0], v[1] * c] for k, v in self.terms.items()}
        e.constant = self.constant * c
        return e

    def _iadd(self, other, sign):
        if _is_number(other):
            self.constant += sign * _num(other)
        elif isinstance(other, Var):
            t = self.terms.get(other.uid)
            if t is None:
                self.terms[other.uid] = [other, sign]
            else:
                t[1] += sign
        elif isinstance(other, LinExpr):
            for k, (v, c) in other.terms.items():
                t = self.terms.get(k)
                if t is None:
                    self.terms[k] = [v, sign * c]
                else:
                    t[1] += sign * c
            self.constant += sign * other.constant
        elif isinstance(other, QuadExpr):
            raise SolverError("cannot add a quadratic expression to a linear one in place")
        else:
            raise SolverError("unsupported operand in a linear expression: %r" % (other,))
        return self

    def __iadd__(self, other):
        if isinstance(other, QuadExpr):
            return self._as_quad() + other
        return self._iadd(other, 1.0)

    def __isub__(self, other):
        if isinstance(other, QuadExpr):
            return self._as_quad() - other
        return self._iadd(other, -1.0)

    # gurobipy API
    def add(self, expr, mult=1.0):
        self._iadd(expr, _num(mult))

    def addTerms(self, coeffs, vars):
        if _is_number(coeffs):
            coeffs, vars = [coeffs], [vars]
        for c, v in zip(coeffs, vars):
            self._iadd(v, _num(c))

    def addConstant(self, c):
        self.constant += _num(c)

    def size(self):
        return len(self.terms)

    def getVar(self, i):
        return list(self.terms.values())[i][0]

    def getCoeff(self, i):
        return list(self.terms.values())[i][1]

    def getConstant(self):
        return self.constant

    def getValue(self):
        return self.constant + sum(c * v.solution_value() for v, c in self.terms.values())

    def __repr__(self):
        return "<LinExpr %s>" % " + ".join("%g %s" % (c, v.name) for v, c in self.terms.values())


class QuadExpr(_Operand):
    def __init__(self, expr=None):
        self.lin = LinExpr()
        self.quad = {}  # (uid_a, uid_b) with uid_a <= uid_b -> [va, vb, coef]
        if expr is not None:
            self._iadd(expr, 1.0)

    def _as_lin(self):
        if self.quad:
            raise SolverError("a quadratic expression was used where a linear one is needed")
        return self.lin

    def _as_quad(self):
        return self

    def _is_linear(self):
        return all(abs(t[2]) == 0.0 for t in self.quad.values())

    def copy(self):
        q = QuadExpr()
        q.lin = self.lin.copy()
        q.quad = {k: list(v) for k, v in self.quad.items()}
        return q

    def _scaled(self, c):
        q = QuadExpr()
        q.lin = self.lin._scaled(c)
        q.quad = {k: [v[0], v[1], v[2] * c] for k, v in self.quad.items()}
        return q

    def _add_pair(self, va, vb, c):
        if va.uid > vb.uid:
            va, vb = vb, va
        key = (va.uid, vb.uid)
        t = self.quad.get(key)
        if t is None:
            self.quad[key] = [va, vb, c]
        else:
            t[2] += c

    def _iadd(self, other, sign):
        if isinstance(other, QuadExpr):
            self.lin._iadd(other.lin, sign)
            for va, vb, c in other.quad.values():
                self._add_pair(va, vb, sign * c)
        else:
            self.lin._iadd(other, sign)
        return self

    def __iadd__(self, other):
        return self._iadd(other, 1.0)

    def __isub__(self, other):
        return self._iadd(other, -1.0)

    def add(self, expr, mult=1.0):
        self._iadd(expr, _num(mult))

    def addTerms(self, coeffs, vars1, vars2=None):
        if vars2 is None:
            self.lin.addTerms(coeffs, vars1)
            return
        if _is_number(coeffs):
            coeffs, vars1, vars2 = [coeffs], [vars1], [vars2]
        for c, a, b in zip(coeffs, vars1, vars2):
            self._add_pair(a, b, _num(c))

    def addConstant(self, c):
        self.lin.constant += _num(c)

    def getLinExpr(self):
        return self.lin

    def getConstant(self):
        return self.lin.constant

    def size(self):
        return len(self.quad)

    def getValue(self):
        return self.lin.getValue() + sum(c * a.solution_value() * b.solution_value() for a, b, c in self.quad.values())


def _lin_times_lin(a, b):
    q = QuadExpr()
    q.lin = a._scaled(b.constant)
    q.lin._iadd(b._scaled(a.constant), 1.0)
    q.lin.constant = a.constant * b.constant
    for va, ca in a.terms.values():
        for vb, cb in b.terms.values():
            q._add_pair(va, vb, ca * cb)
    return q


def as_expr(x):
    """Var / LinExpr / QuadExpr / number -> LinExpr or QuadExpr (a fresh object)."""
    if isinstance(x, QuadExpr):
        return x.copy()
    if isinstance(x, (Var, LinExpr)):
        return x._as_lin().copy()
    if _is_number(x):
        return LinExpr(_num(x))
    raise SolverError("not an expression: %r" % (x,))


def quicksum(items):
    e = LinExpr()
    q = None
    for it in items:
        if isinstance(it, QuadExpr):
            if q is None:
                q = QuadExpr()
            q._iadd(it, 1.0)
        else:
            e._iadd(it, 1.0)
    if q is not None:
        q._iadd(e, 1.0)
        return q
    return e


class TempConstr:
    """`expr sense 0`, produced by <=, >=, == on expressions."""

    __slots__ = ("expr", "sense")

    def __init__(self, expr, sense):
        self.expr = as_expr(expr)
        self.sense = sense  # '<', '>', '='

    def __bool__(self):
        raise SolverError("a constraint has no truth value")

    def __le__(self, other):
        raise SolverError("chained comparisons are not supported; use two constraints or addRange")

    __ge__ = __le__


class Row:
    """A constraint stored in a model: expr (without constant) sense rhs."""

    def __init__(self, model, index, expr, sense, rhs, name):
        self.model = model
        self.index = index
        self.expr = expr
        self.sense = sense
        self.rhs = rhs
        self.name = name
        self.dual = None
        self.activity = None

    def __repr__(self):
        return "<Constr %s>" % self.name


def make_row(model, index, tc, name):
    expr = tc.expr
    const = expr.lin.constant if isinstance(expr, QuadExpr) else expr.constant
    expr = expr.copy()
    if isinstance(expr, QuadExpr):
        expr.lin.constant = 0.0
        if not expr.quad:
            expr = expr.lin
    else:
        expr.constant = 0.0
    return Row(model, index, expr, tc.sense, -const, name)


# ----------------------------------------------------------------------------------------------------
# CPLEX LP writer
# ----------------------------------------------------------------------------------------------------
_BAD_NAME = re.compile(r"[^A-Za-z0-9_!\"#$%&()/,.;?@`'{}|~\[\]]")


def lp_name(name, fallback):
    if not name:
        return fallback
    s = _BAD_NAME.sub("_", str(name))
    if s[0].isdigit() or s[0] == "." or re.match(r"^[eE][0-9+-]", s):
        s = "_" + s
    return s


def _fmt(c):
    r = repr(float(c))
    return r[:-2] if r.endswith(".0") else r


def _terms_text(pairs, first):
    out = []
    for coef, label in pairs:
        if coef == 0.0:
            continue
        sign = "-" if coef < 0 else "+"
        mag = abs(coef)
        body = label if mag == 1.0 else "%s %s" % (_fmt(mag), label)
        if first and sign == "+":
            out.append(body)
        else:
            out.append("%s %s" % (sign, body))
        first = False
    return out


def _expr_text(expr, names, objective):
    if isinstance(expr, QuadExpr):
        lin, quad = expr.lin, expr.quad.values()
    else:
        lin, quad = expr, ()
    parts = _terms_text([(c, names[v.uid]) for v, c in lin.terms.values()], True)
    qpairs = []
    for a, b, c in quad:
        label = "%s ^2" % names[a.uid] if a.uid == b.uid else "%s * %s" % (names[a.uid], names[b.uid])
        qpairs.append((2.0 * c if objective else c, label))
    qparts = _terms_text(qpairs, True)
    if qparts:
        parts.append("+ [ " + " ".join(qparts) + (" ] / 2" if objective else " ]"))
    return parts


def _wrap(prefix, parts, suffix=""):
    lines, cur = [], prefix
    for p in parts:
        if len(cur) + len(p) + 1 > 100 and cur.strip():
            lines.append(cur)
            cur = "   "
        cur += " " + p
    if suffix:
        cur += " " + suffix
    lines.append(cur)
    return "\n".join(lines)


def write_lp(model, path, internal_names):
    """Writes the model as CPLEX LP. internal_names: v<i>/r<i> (for solving) or the user's names."""
    vars_ = model.vars
    names = {}
    used = set()
    for v in vars_:
        n = "v%d" % v.index if internal_names else lp_name(v.name, "C%d" % v.index)
        names[v.uid] = n
        used.add(n)
    out = ["\\ Model %s" % (model.name or "model"), "\\ written by the T-Rex solver look-alike"]
    out.append("Maximize" if model.sense < 0 else "Minimize")
    obj = model.objective
    obj_parts = _expr_text(obj, names, True) if obj is not None else []
    const = (obj.lin.constant if isinstance(obj, QuadExpr) else obj.constant) if obj is not None else 0.0
    if const != 0.0:
        obj_parts += _terms_text([(const, "Constant")], not obj_parts)
    _check_names(names, vars_)
    out.append(_wrap(" obj:", obj_parts))
    out.append("Subject To")
    for r in model.rows:
        rname = "r%d" % r.index if internal_names else lp_name(r.name, "R%d" % r.index)
        parts = _expr_text(r.expr, names, False)
        if not parts:
            parts = ["0 %s" % names[vars_[0].uid]] if vars_ else []
            if not parts:
                continue
        op = {"<": "<=", ">": ">=", "=": "="}[r.sense]
        out.append(_wrap(" %s:" % rname, parts, "%s %s" % (op, _fmt(r.rhs))))
    out.append("Bounds")
    for v in vars_:
        n = names[v.uid]
        lb = -INF if v.lb <= -BIG else v.lb
        ub = INF if v.ub >= BIG else v.ub
        if v.vtype == "B":
            lb, ub = max(lb, 0.0), min(ub, 1.0)
            if lb == 0.0 and ub == 1.0:
                continue
        if lb == ub:
            out.append(" %s = %s" % (n, _fmt(lb)))
        elif lb == -INF and ub == INF:
            out.append(" %s free" % n)
        elif lb == -INF:
            out.append(" -infinity <= %s <= %s" % (n, _fmt(ub)))
        elif ub == INF:
            if lb != 0.0:
                out.append(" %s >= %s" % (n, _fmt(lb)))
        else:
            out.append(" %s <= %s <= %s" % (_fmt(lb), n, _fmt(ub)))
    if const != 0.0:
        out.append(" Constant = 1")
    bins = [names[v.uid] for v in vars_ if v.vtype == "B"]
    ints = [names[v.uid] for v in vars_ if v.vtype == "I"]
    if bins:
        out.append("Binaries")
        out.append(_wrap("", bins))
    if ints:
        out.append("Generals")
        out.append(_wrap("", ints))
    out.append("End")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def _check_names(names, vars_):
    if "Constant" in names.values():
        raise SolverError("a variable is called 'Constant', which clashes with the LP objective constant")


# ----------------------------------------------------------------------------------------------------
# Solving through `trex solve`
# ----------------------------------------------------------------------------------------------------
_solve_counter = itertools.count()


def trex_binary():
    b = os.environ.get("TREX_BIN")
    if not b:
        raise SolverError("TREX_BIN is not set: the T-Rex solver look-alikes solve through `$TREX_BIN solve`")
    return b


def solve_model(model, time_limit=None):
    """Solves `model` with `trex solve`; sets var.sol and returns (status, objective, message, seconds)."""
    workdir = os.path.join(os.getcwd(), ".trex_solve")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "model_%d_%d.lp" % (os.getpid(), next(_solve_counter)))
    write_lp(model, path, internal_names=True)
    cmd = [trex_binary(), "solve", path, "--json"]
    if time_limit is not None and time_limit < 1e9:
        cmd += ["--time-limit", str(float(time_limit))]
    t0 = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    seconds = time.time() - t0
    text = proc.stdout.strip()
    start = text.rfind('{"status"')
    if start < 0:
        start = text.find("{")
    try:
        res = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        res = None
    if res is None:
        msg = (proc.stderr or proc.stdout or "").strip()[-2000:]
        return "error", None, "trex solve failed (exit %d): %s" % (proc.returncode, msg), seconds
    status = res.get("status", "error")
    values = res.get("values") or {}
    for v in model.vars:
        val = values.get("v%d" % v.index)
        v.sol = float(val) if val is not None and status == "optimal" else None
    obj = res.get("objective")
    msg = res.get("message") or res.get("error") or (proc.stderr.strip()[-2000:] if status == "error" else "")
    return status, (float(obj) if obj is not None and status == "optimal" else None), msg, seconds


class BaseModel:
    """State shared by every vendor look-alike; the runner (_trex_run.py) writes the chosen model as LP."""

    def __init__(self, name=""):
        self.name = name or ""
        self.vars = []
        self.rows = []
        self.objective = LinExpr()
        self.sense = 1  # 1 minimise, -1 maximise
        self.solved = False
        self.status_text = "loaded"
        self.objective_value = None
        self.solve_message = ""
        self.solve_seconds = 0.0
        self.time_limit = None
        _models.append(self)

    def new_var(self, lb, ub, vtype, obj, name):
        lb = -INF if lb is None or _num(lb) <= -BIG else _num(lb)
        ub = INF if ub is None or _num(ub) >= BIG else _num(ub)
        v = Var(self, len(self.vars), lb, ub, vtype, _num(obj), name if name is not None else "")
        self.vars.append(v)
        if obj:
            self.objective = as_expr(self.objective) + v * _num(obj)
        return v

    def new_row(self, tc, name):
        if isinstance(tc, bool):
            raise SolverError("constraint is a plain bool (%s): both sides were constants" % tc)
        if not isinstance(tc, TempConstr):
            raise SolverError("not a constraint: %r" % (tc,))
        r = make_row(self, len(self.rows), tc, name if name is not None else "")
        self.rows.append(r)
        return r

    def set_objective(self, expr, sense):
        self.objective = as_expr(expr if expr is not None else 0.0)
        if sense is not None:
            self.sense = sense

    def run_solver(self):
        status, obj, msg, secs = solve_model(self, self.time_limit)
        self.solved = True
        self.status_text = status
        self.objective_value = obj
        self.solve_message = msg
        self.solve_seconds = secs
        return status

    def write_lp_file(self, path):
        write_lp(self, path, internal_names=False)


def all_models():
    return list(_models)


def values_of(keys, fn):
    return {k: fn(k) for k in keys}


def is_finite(x):
    return not (math.isinf(x) or math.isnan(x))
