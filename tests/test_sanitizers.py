"""The sanitized runs (tests/sanitizers.py) fail on a report: each
sanitizer's bug in sanfail fails the run under that sanitizer, and none
fails it plain (the check itself fails nothing)."""
from __future__ import annotations

import pytest

REPORTED_BY = {"overflow": "asan", "shift": "asan", "race": "tsan"}


@pytest.mark.sanitizers("asan", "tsan")
@pytest.mark.parametrize("bug", sorted(REPORTED_BY))
def test_a_sanitizer_report_fails_the_run(shimenv, cbin, flavour, bug):
    run = [str(cbin / "sanfail"), bug]
    if REPORTED_BY[bug] == flavour.name:
        with pytest.raises(AssertionError, match=f"{flavour.name} reported"):
            shimenv.run(run)
    else:
        r = shimenv.run(run)
        assert (r.returncode, r.stdout.split()[-1:]) == (0, ["ok"]), r.stderr
