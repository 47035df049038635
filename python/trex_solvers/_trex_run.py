"""Runs one generated program the way `trex eval` grades it and leaves its model in the work directory.

usage: python3 _trex_run.py PROGRAM.py MODE    (MODE: objective | lp)

The program is executed at module level (so `if __name__ == "__main__":` blocks run) with the solver
look-alikes importable as gurobipy / coptpy / pyscipopt / pulp. Then, as the T-Rex harness does, the model is
the global `model`, else `m` (else the last model the program solved, else the last it created).

This script reports nothing the harness believes: it runs inside the jail with the program and could be
replaced by it. It only writes the model, as an LP file under a fixed name, and the harness, outside the jail,
solves that file itself and reads the objective from its own solver:
  objective mode: the model with internal names (v0, v1, ...) -> .trex_model.lp
  lp mode:        the newest .lp file the program wrote (else the model with its own names) -> .trex_answer.lp
Exit status: 0 the file was written, 3 the program raised (traceback on stderr), 4 no model.
"""
import os
import sys
import traceback

MODEL_FILE = ".trex_model.lp"
ANSWER_FILE = ".trex_answer.lp"
EXIT_PROGRAM_ERROR = 3
EXIT_NO_MODEL = 4


def _find_lp_files(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".trex_solve"]
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            if fn.lower().endswith(".lp") and fn not in (MODEL_FILE, ANSWER_FILE) and os.path.isfile(full):
                found.append((os.path.getmtime(full), full))
    found.sort()
    return [f for _, f in found]


def _publish(write, root, name):
    tmp = os.path.join(root, name + ".tmp")
    write(tmp)
    os.replace(tmp, os.path.join(root, name))


def _report_exception(e):
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    sys.stderr.write("".join(tb[-6:])[-4000:])
    sys.stderr.flush()


def main():
    program, mode = sys.argv[1], sys.argv[2]
    sys.dont_write_bytecode = True
    root = os.getcwd()
    import _trex_core
    # Taken before the program runs, so that what it rebinds in the module does not change which writer
    # and which model list this script uses.
    base_model, write_lp, models = _trex_core.BaseModel, _trex_core.write_lp, _trex_core._models
    with open(program) as f:
        source = f.read()
    glb = {"__name__": "__main__", "__file__": os.path.join(root, "answer.py"), "__builtins__": __builtins__}
    try:
        code = compile(source, "answer.py", "exec")
    except SyntaxError as e:
        sys.stderr.write("SyntaxError: %s (line %s)\n" % (e.msg, e.lineno))
        sys.exit(EXIT_PROGRAM_ERROR)
    raised = False
    try:
        exec(code, glb)
    except SystemExit:
        pass
    except BaseException as e:  # the program's own failure is its result
        _report_exception(e)
        raised = True
        if mode != "lp":
            sys.exit(EXIT_PROGRAM_ERROR)
    model = None
    for name in ("model", "m"):
        cand = glb.get(name)
        if isinstance(cand, base_model):
            model = cand
            break
    if model is None:
        built = [mm for mm in list(models) if isinstance(mm, base_model)]
        solved = [mm for mm in built if mm.solved]
        model = solved[-1] if solved else (built[-1] if built else None)
    if mode == "lp":
        lps = _find_lp_files(root)
        if lps:
            with open(lps[-1], "rb") as f:
                text = f.read()

            def copy(path):
                with open(path, "wb") as out:
                    out.write(text)

            _publish(copy, root, ANSWER_FILE)
        elif model is not None:
            _publish(lambda path: write_lp(model, path, False), root, ANSWER_FILE)
        else:
            if not raised:
                sys.stderr.write("no model: the program wrote no .lp file and built no model\n")
            sys.exit(EXIT_PROGRAM_ERROR if raised else EXIT_NO_MODEL)
        return
    if model is None:
        sys.stderr.write("no model found (expected a global `model` or `m`)\n")
        sys.exit(EXIT_NO_MODEL)
    try:
        _publish(lambda path: write_lp(model, path, True), root, MODEL_FILE)
    except BaseException as e:
        _report_exception(e)
        sys.exit(EXIT_PROGRAM_ERROR)


if __name__ == "__main__":
    main()
