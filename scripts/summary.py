"""Prints one closing line 'N passed, N failed, N skipped' over meson test logs,
after a line per failed test (which log, its name, its result): CI shows the
tail of the output, so the names of what failed come last."""
import json
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
failed = []
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        t = json.loads(line)
        r = t.get("result")
        if r in ("OK", "EXPECTEDFAIL"):
            counts["passed"] += 1
        elif r == "SKIP":
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
            failed.append(f"FAILED: {path}: {t.get('name')} ({r}, {t.get('duration', 0):.1f} s)")
for f in failed:
    print(f)
print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
sys.exit(1 if counts["failed"] else 0)
