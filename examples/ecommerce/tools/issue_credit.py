#!/usr/bin/env python3
"""exec tool: compute and issue a goodwill credit for a late order.

stdin:  {"order_id": "ORD-1001", "days_late": 2}
stdout: {"order_id": ..., "credit_usd": 10.0, "status": "issued"}
$5 per day late, at most $25; a non-positive delay is refused.
"""
import json
import sys

args = json.load(sys.stdin)
days = args.get("days_late")
if not isinstance(days, (int, float)) or days <= 0:
    json.dump({"order_id": args.get("order_id"), "status": "refused", "reason": "order is not late"}, sys.stdout)
else:
    json.dump({"order_id": args.get("order_id"), "credit_usd": float(min(25, 5 * days)), "status": "issued"}, sys.stdout)
