"""The multi-node benchmark's report: the table and the plot are made again
from the committed results, and the README shows that same table."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import REPO, report_from_results

RESULTS = REPO / "bench" / "results"


@pytest.mark.slow
def test_the_report_is_made_from_the_results_and_is_the_readme_table(tmp_path: Path):
    res = report_from_results("multinode", "multinode", tmp_path)
    rows = {(x["nodes"], x["config"]) for x in res["runs"]}
    assert rows == {(1, "pfs"), (1, "lower-bound"), (1, "local"), (2, "pfs"), (2, "lower-bound"), (2, "local"),
                    (2, "peers"), (3, "pfs"), (3, "lower-bound"), (3, "local"), (3, "peers")}
    for x in res["runs"]:     # the lower bound reads no PFS within the job
        if x["config"] == "lower-bound":
            assert x["pfs_job"] == {"opens": 0, "bytes": 0} and sum(x["peer_bytes"]) == 0
    # same samples in every configuration of a node count
    for n in (1, 2, 3):
        assert len({x["checksum"] for x in res["runs"] if x["nodes"] == n}) == 1
