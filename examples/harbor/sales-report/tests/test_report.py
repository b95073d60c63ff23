import json
import os

REPORT = os.environ.get("REPORT_PATH", "/app/report.json")


def load():
    with open(REPORT) as handle:
        return json.load(handle)


def test_totals():
    assert load()["totals"] == {"north": 42.95, "south": 27.24, "east": 26.1}


def test_top_region():
    assert load()["top_region"] == "north"


def test_count():
    assert load()["count"] == 7
