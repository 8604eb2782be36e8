"""Prints one closing line 'N passed, N failed, N skipped' over meson test logs."""
import json
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        r = json.loads(line).get("result")
        if r in ("OK", "EXPECTEDFAIL"):
            counts["passed"] += 1
        elif r == "SKIP":
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
sys.exit(1 if counts["failed"] else 0)
