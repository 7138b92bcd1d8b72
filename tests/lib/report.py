"""report.py - the PASS / FAIL lines of the Python test scripts, printed as
the C tests print theirs (scripts/run-tests.sh counts them), and the exit
status they add up to."""

_failures = 0


def report(name, ok, why=""):
    """PASS name, or FAIL name: why (and the failure is counted)."""
    global _failures
    if ok:
        print(f"PASS {name}", flush=True)
    else:
        _failures += 1
        print(f"FAIL {name}: {why}", flush=True)


def exit_status():
    """1 if any case failed, else 0."""
    return 1 if _failures else 0
