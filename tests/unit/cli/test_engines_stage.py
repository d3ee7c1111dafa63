"""`hydractl engines`'s stage column: a load's percentage, or the model file's transfer when it is fetched."""

from __future__ import annotations

from hydrad.cli.ctl.coordinator import _stage


def test_the_stage_shows_the_fetch_in_place_of_the_loads_percentage() -> None:
    assert _stage({"stage": "loading_model", "progress": 0.5}) == "loading_model 50%"
    fetching = {"stage": "loading_model", "progress": 0.0,
                "fetch": {"bytes": 37, "total": 100, "text": "fetching 37%, 120 MB/s, ETA 12 s"}}
    assert _stage(fetching) == "loading_model (fetching 37%, 120 MB/s, ETA 12 s)"
    assert _stage({"stage": "ready", "progress": None, "fetch": None}) == "ready"
