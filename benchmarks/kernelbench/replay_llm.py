#!/usr/bin/env python3
"""A stand-in LLM on 127.0.0.1 for a device run of kevo-llm-search on a KernelBench file: it answers each
POST /v1/chat/completions (OpenAI's wire format) with the next recorded answer, in file order, and repeats
the last once they run out.

  python3 benchmarks/kernelbench/replay_llm.py --port 8765 llm_answers/19_scaled_residual_cuda.1_wrong.md \
      llm_answers/19_scaled_residual_cuda.2_right.md &
  KEVO_LLM_BASE_URL=http://127.0.0.1:8765/v1 KEVO_LLM_MODEL=replay kevo-llm-search problems/kernelbench/19_scaled_residual.py --device cuda

Each request and the answer it got are printed, one line each, so the run's log shows the order."""
import argparse
import http.server
import json
import threading

parser = argparse.ArgumentParser()
parser.add_argument("answers", nargs="+", help="files whose text is answered, in order")
parser.add_argument("--port", type=int, default=8765)
args = parser.parse_args()
answers = [open(path).read() for path in args.answers]
served = 0
lock = threading.Lock()


class Replay(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global served
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            k = min(served, len(answers) - 1)
            served += 1
        try:
            model = json.loads(body).get("model", "replay")
        except ValueError:
            model = "replay"
        reply = json.dumps({"id": f"replay-{served}", "object": "chat.completion", "model": model,
                            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answers[k]}}],
                            "usage": {"prompt_tokens": len(body) // 4, "completion_tokens": len(answers[k]) // 4}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        print(f"replay: request {served} ({len(body)} bytes) answered with {args.answers[k]}", flush=True)

    def log_message(self, *_):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Replay).serve_forever()
