"""The reward from pytest's JUnit report: 1.0 only when every test passed; the counts beside it."""

import json
import sys
import xml.etree.ElementTree as ET

try:
    suite = ET.parse(sys.argv[1]).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total = int(suite.get("tests"))
    failed = int(suite.get("failures")) + int(suite.get("errors")) + int(suite.get("skipped"))
except (OSError, ET.ParseError, AttributeError, TypeError, ValueError):
    total, failed = 0, 0
passed = total - failed
print(
    json.dumps(
        {
            "reward": 1.0 if total and not failed else 0.0,
            "tests_passed": passed,
            "tests_total": total,
            "fraction": passed / total if total else 0.0,
        }
    )
)
