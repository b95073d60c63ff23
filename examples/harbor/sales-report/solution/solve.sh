#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import csv
import json

totals = {}
count = 0
with open("sales.csv", newline="") as handle:
    for row in csv.DictReader(handle):
        totals[row["region"]] = totals.get(row["region"], 0.0) + float(row["amount"])
        count += 1
totals = {region: round(total, 2) for region, total in totals.items()}
with open("report.json", "w") as handle:
    json.dump({"totals": totals, "top_region": max(totals, key=totals.get), "count": count}, handle)
PY
