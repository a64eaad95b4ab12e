#!/usr/bin/env python3
"""A local order-tracking API for the e-commerce example (loopback only).

GET /orders/<id>   -> {"order_id", "status", "eta", "days_late"}
GET /healthz       -> ok

It misbehaves the way real carrier APIs do, deterministically per order so
runs are comparable:
  * every 5th order (order number % 5 == 0) answers after SLOW_MS (1200 ms);
  * orders with number % 7 == 3 answer their FIRST request with
    429 Too Many Requests and `Retry-After: 0.2`, then normally.
Listens on $HOST:$PORT (the sandbox's services section sets both).
"""
import json
import os
import re
import threading
import time
from urllib.parse import unquote
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_MS = int(os.environ.get("SLOW_MS", "1200"))
STATUSES = ["in_transit", "delayed", "delivered", "delayed", "in_transit", "delayed"]
seen_lock = threading.Lock()
seen = set()


def order_number(order_id):
    digits = re.sub(r"\D", "", order_id)
    return int(digits) if digits else 0


def shipment(order_id):
    n = order_number(order_id)
    status = STATUSES[n % len(STATUSES)]
    days_late = (n % 4) + 1 if status == "delayed" else 0
    eta = {"delivered": "delivered", "in_transit": "2026-12-03"}.get(status, f"2026-12-0{3 + days_late}")
    return {"order_id": order_id, "status": status, "eta": eta, "days_late": days_late}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def send_json(self, code, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            return self.send_json(200, {"ok": True})
        match = re.fullmatch(r"/orders/([A-Za-z0-9_-]+)", unquote(self.path))
        if not match:
            return self.send_json(404, {"error": f"no route {self.path}"})
        order_id = match.group(1)
        n = order_number(order_id)
        if n % 7 == 3:
            with seen_lock:
                first = order_id not in seen
                seen.add(order_id)
            if first:
                return self.send_json(429, {"error": "rate limited"}, [("Retry-After", "0.2")])
        if n % 5 == 0:
            time.sleep(SLOW_MS / 1000)
        self.send_json(200, shipment(order_id))

    def log_message(self, fmt, *args):  # one line per request, to the service log
        print(f"{self.address_string()} {fmt % args}", flush=True)


if __name__ == "__main__":
    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ["PORT"])
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    print(f"tracking service on http://{host}:{port}", flush=True)
    server.serve_forever()
