#!/usr/bin/env python3
"""Re-solves the `lp` field of random kept samples of an `trex ordata generate` run with Debian's command-line
solvers (glpsol --lp and cbc) and compares status and objective with the recorded ones.

usage: ordata_resolve_check.py SFT.jsonl [--n 50] [--seed 0] [--rel-tol 1e-6]

cbc's "Pre-processing says infeasible or unbounded" counts as agreeing with a recorded infeasible or unbounded
status. Quadratic (QP) samples are skipped: neither glpsol nor the cbc binary reads a quadratic LP-file objective
(`trex ordata check` re-solves those with Ipopt). Exit status 1 when any comparison disagrees.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile


def glpsol(lp_path, work):
    out = os.path.join(work, "glpsol.txt")
    subprocess.run(["glpsol", "--lp", lp_path, "-o", out], capture_output=True, text=True, timeout=600)
    text = open(out).read() if os.path.exists(out) else ""
    status = re.search(r"^Status:\s+(.*)$", text, re.M)
    status = status.group(1).strip() if status else "NO OUTPUT"
    obj = re.search(r"^Objective:\s+\S+ = (\S+)", text, re.M)
    if "OPTIMAL" in status and obj:
        return "optimal", float(obj.group(1))
    if "EMPTY" in status or "INFEASIBLE" in status:
        return "infeasible", None
    if "UNBOUNDED" in status:
        return "unbounded", None
    # glpsol reports an LP with no primal feasible solution as UNDEFINED after the simplex says so.
    run = subprocess.run(["glpsol", "--lp", lp_path], capture_output=True, text=True, timeout=600).stdout
    if "NO PRIMAL FEASIBLE" in run or "NO INTEGER FEASIBLE" in run or "has no feasible" in run.lower():
        return "infeasible", None
    if "NO DUAL FEASIBLE" in run or "UNBOUNDED" in run:
        return "unbounded", None
    return "unknown:" + status, None


def cbc(lp_path):
    run = subprocess.run(["cbc", lp_path, "solve"], capture_output=True, text=True, timeout=600).stdout
    # The verdict is the "Result - ..." line; earlier lines such as "Analysis indicates model infeasible or
    # unbounded" are presolve chatter.
    result = re.search(r"^Result - (.*)$", run, re.M)
    verdict = result.group(1).lower() if result else run.lower()
    m = re.search(r"Objective value:\s+(\S+)", run) or re.search(r"Optimal - objective value (\S+)", run)
    if "optimal" in verdict and m:
        # cbc prints the objective in the file's sense (a Maximize file gives the maximum).
        return "optimal", float(m.group(1))
    if "says infeasible or unbounded" in run:  # CBC's MIP preprocessing stops without telling which
        return "infeasible_or_unbounded", None
    if "unbounded" in verdict:
        return "unbounded", None
    if "infeasible" in verdict:
        return "infeasible", None
    return "unknown", None


def agrees(status, obj, sample, tol):
    if status == "infeasible_or_unbounded" and sample["status"] in ("infeasible", "unbounded"):
        return True
    if status != sample["status"]:
        return False
    if status != "optimal":
        return True
    ref = sample["objective"]
    return abs(obj - ref) <= tol * max(1.0, abs(obj), abs(ref))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sft")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rel-tol", type=float, default=1e-6)
    a = ap.parse_args()
    samples = [json.loads(line) for line in open(a.sft)]
    linear = [s for s in samples if s["problem_class"] != "QP"]
    pick = random.Random(a.seed).sample(linear, min(a.n, len(linear)))
    bad = 0
    by_status = {}
    with tempfile.TemporaryDirectory() as work:
        for s in pick:
            path = os.path.join(work, "sample.lp")
            with open(path, "w") as f:
                f.write(s["lp"])
            g = glpsol(path, work)
            c = cbc(path)
            ok = agrees(*g, s, a.rel_tol) and agrees(*c, s, a.rel_tol)
            by_status[s["status"]] = by_status.get(s["status"], 0) + 1
            if not ok:
                bad += 1
            print("%-22s %-26s %-10s recorded=%-14s glpsol=%-24s cbc=%-24s %s" % (
                s["id"], s["family"], s["status"], s["objective"], "%s %s" % g, "%s %s" % c,
                "ok" if ok else "DISAGREE"))
    print("re-solved %d samples (%s; %d QP samples in the file skipped), %d disagree" % (
        len(pick), ", ".join("%s %d" % kv for kv in sorted(by_status.items())), len(samples) - len(linear), bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
