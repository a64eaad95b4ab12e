#!/usr/bin/env python3
"""Writes the e-commerce example's test set (tests.jsonl) and scripted policy
(policy.jsonl): 60 shipping-delay conversations. Deterministic; the files are
committed, so run this only after changing it:  python3 generate.py

The expected shipment of each order comes from services/tracking.py's own
`shipment()` — one source of truth for the service and the expectations.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "services"))
from tracking import shipment  # noqa: E402

ORDERS = [f"ORD-{1000 + i}" for i in range(60)]
QUESTIONS = [
    "Where is my order {o}? It should have arrived by now.",
    "My package {o} is late again. What is going on?",
    "Can you check the shipping status of {o}?",
    "Order {o} hasn't shown up. I want to know when it will.",
]


def logprobs(tokens):
    """A few tokens with top-2 alternatives, as a served model would give."""
    out = []
    for i, token in enumerate(tokens):
        lp = -0.05 * (i + 1)
        out.append({"token": token, "logprob": lp,
                    "top_logprobs": [{"token": token, "logprob": lp}, {"token": token.upper(), "logprob": lp - 2.3}]})
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    tests, script = [], []
    for i, order in enumerate(ORDERS):
        ship = shipment(order)
        calls = [{"name": "track_order", "arguments": {"order_id": order}}]
        memory = {"customer_id": f"C-{7000 + i}", "order_id": order,
                  "shipping_status": ship["status"], "eta": ship["eta"]}
        turns = [{"tool_calls": [calls[0]], "logprobs": logprobs(["track", "_order", "("])}]
        if ship["status"] == "delayed":
            credit = {"name": "issue_credit", "arguments": {"order_id": order, "days_late": ship["days_late"]}}
            calls.append(credit)
            memory["credit_usd"] = float(min(25, 5 * ship["days_late"]))
            turns.append({"tool_calls": [credit], "logprobs": logprobs(["issue", "_credit", "("])})
            answer = f"Your order {order} is {ship['days_late']} day(s) late; new ETA {ship['eta']}. I've added a credit."
        elif ship["status"] == "delivered":
            answer = f"Your order {order} shows as delivered."
        else:
            answer = f"Your order {order} is on its way, expected {ship['eta']}."
        turns.append({"content": answer, "logprobs": logprobs(["Your", " order", " " + order])})
        tests.append({
            "id": f"ship-{i:03d}",
            "instruction": QUESTIONS[i % len(QUESTIONS)].format(o=order),
            "expected_tool_calls": calls,
            "initial_memory": {"customer_id": memory["customer_id"], "order_id": order},
            "expected_memory": memory,
        })
        script.append({"episode": f"ship-{i:03d}", "turns": turns})
    for name, rows in (("tests.jsonl", tests), ("policy.jsonl", script)):
        with open(os.path.join(here, name), "w") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
    print(f"wrote {len(tests)} episodes")


if __name__ == "__main__":
    main()
