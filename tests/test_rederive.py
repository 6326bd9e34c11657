"""benchmarks/rederive.py on the H100 head study: the current rules (the median noise, a schedule
finalist judged by its ranges) find no schedule there, and the stored fresh engines answer the rest."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.rederive import rederive
from tests.conftest import ROOT

RESULTS = ROOT / "benchmarks" / "results" / "eagle3-wide-h100-20261207"


def test_the_head_study_needs_no_schedule_and_no_new_engine(tmp_path: Path) -> None:
    db = tmp_path / "optuna.db"
    shutil.copy(RESULTS / "optuna.db", db)
    result = rederive(ROOT / "studies" / "wide-h200-eagle3.yaml", f"sqlite:///{db}")
    # Under the largest CV (29% at batch 16) this was "1-4: k=3; 5-16: k=0; 17-1024: k=3".
    assert result["schedule"] is None and result["note"].startswith("constant: k=3 at every level")
    assert [c["k"] for c in result["levels"]] == [3, 3, 3, 3]
    assert result["finalists"] == ["eagle3 trained-head k=3 compiled", "no speculation compiled"]
    answer = result["confirmation"]
    assert (answer["complete"], answer["engines"], answer["engines_to_run"], answer["winner"]) == (True, 4, 0, 1)
