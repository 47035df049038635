"""Runs one generated program the way `trex eval` scores it, and writes a JSON verdict.

usage: python3 _trex_run.py PROGRAM.py RESULT.json MODE    (MODE: objective | lp)

The program is executed at module level (so `if __name__ == "__main__":` blocks run) with the solver
look-alikes importable as gurobipy / coptpy / pyscipopt / pulp. Then, as the T-Rex harness does, the model is
the global `model`, else `m` (else the last model the program created); if it was never optimised it is
optimised now. In lp mode nothing is solved by us: the .lp files the program wrote are listed, and if there
is none the model is written to `model.lp`.
"""
import json
import os
import sys
import traceback


def _dump(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _find_lp_files(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".trex_solve"]
        for fn in filenames:
            if fn.lower().endswith(".lp"):
                full = os.path.join(dirpath, fn)
                found.append((os.path.getmtime(full), full))
    found.sort()
    return [f for _, f in found]


def main():
    program, result_path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.dont_write_bytecode = True
    root = os.getcwd()
    result_path = os.path.abspath(result_path)
    import _trex_sandbox
    _trex_sandbox.install(root)
    import _trex_core
    with open(program) as f:
        source = f.read()
    result = {"status": "error", "objective": None, "values": {}, "message": ""}
    glb = {"__name__": "__main__", "__file__": os.path.join(root, "answer.py"), "__builtins__": __builtins__}
    try:
        code = compile(source, "answer.py", "exec")
    except SyntaxError as e:
        result.update(status="exception", error_type="SyntaxError", message="%s (line %s)" % (e.msg, e.lineno))
        _dump(result_path, result)
        return
    try:
        exec(code, glb)
    except SystemExit:
        pass
    except BaseException as e:  # the program's own failure is the verdict, not ours
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        result.update(status="exception", error_type=type(e).__name__, message=str(e)[:2000],
                      traceback="".join(tb[-6:])[-4000:])
        if mode != "lp":
            _dump(result_path, result)
            return
    model = None
    for name in ("model", "m"):
        cand = glb.get(name)
        if isinstance(cand, _trex_core.BaseModel):
            model = cand
            break
    if model is None:
        models = _trex_core.all_models()
        solved = [mm for mm in models if mm.solved]
        model = solved[-1] if solved else (models[-1] if models else None)
    if mode == "lp":
        lps = _find_lp_files(root)
        if not lps and model is not None:
            model.write_lp_file(os.path.join(root, "model.lp"))
            lps = [os.path.join(root, "model.lp")]
        if lps:
            result = {"status": "lp_written", "lp_files": lps, "message": result.get("message", "")}
        elif result["status"] != "exception":
            result.update(status="no_model", message="the program wrote no .lp file and built no model")
        _dump(result_path, result)
        return
    if model is None:
        result.update(status="no_model", message="no model found (expected a global `model` or `m`)")
        _dump(result_path, result)
        return
    try:
        if not model.solved:
            model.run_solver()
        result = model.trex_result()
    except BaseException as e:
        result.update(status="exception", error_type=type(e).__name__, message=str(e)[:2000])
    _dump(result_path, result)


if __name__ == "__main__":
    main()
