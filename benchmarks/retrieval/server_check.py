"""End-to-end check of retrieval_server's GPU backend against its CPU backend, on loopback.

Starts two servers over the same workload (same seed and ad count), one with --backend gpu and
one with --backend cpu, then:
  - sends the same random requests to both and compares the answers (each ordered by score, ties
    by lower id, no id twice; the same ids both ways, except at the K-th score's tolerance boundary;
    scores within the spec's 1e-3 * (1 + |score|));
  - sends a batch of 8 of them to both through /search_batch (the GPU's one-pass path) and compares
    each answer the same way;
  - sends 12 searches to the GPU server at once (it answers searches that queue together, as a
    batch) and compares each answer with the CPU server's;
  - sends malformed requests to the GPU server and expects 400s, each with {"error": message},
    then a good answer;
  - upserts an ad that must rank first, sees it first on both, expires it, and sees it gone.
With --via-file PATH the first server writes its pool there (--save-ads) and the second loads it
(--ads-file) instead of generating it, so the comparison covers the ad file too.
First checks compare() itself on made-up answers. Exits non-zero on the first failure. Standard library only (the device has no extra packages).

  python3 benchmarks/retrieval/server_check.py BINARY [--ads 200000] [--requests 20] [--dtype int8] [--via-file PATH]

With --first cpu both servers run the CPU backend: no GPU needed, and what is checked is the
binary's HTTP path end to end (CI runs it so, tests/cli).
"""
import argparse
import json
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def post(url, payload, expect=200):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    if status != expect:
        sys.exit(f"FAIL: POST {url} -> {status}, expected {expect}: {body[:300]!r}")
    try:
        return json.loads(body) if body else None
    except ValueError:
        sys.exit(f"FAIL: POST {url} -> {status} with a body that is not JSON: {body[:300]!r}")


def post_bad(url, payload):
    """A request the server must refuse: a 400 whose body is {"error": "<a message>"}."""
    reply = post(url, payload, expect=400)
    if not isinstance(reply, dict) or not isinstance(reply.get("error"), str) or not reply["error"].strip():
        sys.exit(f"FAIL: POST {url} -> 400 without an error message: {reply!r}")
    return reply


def start(binary, backend, port, ads, seed, dtype, extra=()):
    proc = subprocess.Popen([binary, "--backend", backend, "--port", str(port), "--ads", str(ads), "--seed",
                             str(seed), "--dtype", dtype, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    line = proc.stdout.readline()  # "serving N ads on http://... with the X backend" once loaded
    print(f"{backend}: {line.strip()}", flush=True)
    if f"with the {'cuda' if backend == 'gpu' else 'cpu'} backend" not in line:
        proc.kill()
        sys.exit(f"FAIL: the {backend} server did not come up as asked: {line!r}")
    return proc, f"http://127.0.0.1:{port}", line


def close(a, b):
    return abs(a - b) <= 1e-3 * (1 + abs(b))


def ranking_problem(results, k, who):
    """One answer on its own: at most k results, score descending, ties by lower id, no id twice."""
    if len(results) > k:
        return f"{who}: {len(results)} results for k {k}"
    seen = set()
    for i, r in enumerate(results):
        if r["id"] in seen:
            return f"{who}: id {r['id']} twice"
        seen.add(r["id"])
        if i and not (results[i - 1]["score"] > r["score"] or
                      (results[i - 1]["score"] == r["score"] and results[i - 1]["id"] < r["id"])):
            return f"{who}: out of order at {i}: {results[i - 1]} before {r}"
    return None


def compare(gpu, cpu, k):
    """The spec's rules, simplified (the CPU's answer stands in for the reference; no routing
    near-ties): each answer ordered and without duplicates; the same count; every shared id's score
    close; an id in only one answer, either way, only where its score is within tolerance of the
    CPU's K-th score, and only when K ads came back (fewer means every eligible ad did)."""
    for who, results in (("GPU", gpu), ("CPU", cpu)):
        problem = ranking_problem(results, k, who)
        if problem:
            return problem
    if len(gpu) != len(cpu):
        return f"{len(gpu)} results vs {len(cpu)}"
    gpu_score = {r["id"]: r["score"] for r in gpu}
    cpu_score = {r["id"]: r["score"] for r in cpu}
    kth = cpu[-1]["score"] if len(cpu) == k else None
    for r in gpu:
        if r["id"] in cpu_score:
            if not close(r["score"], cpu_score[r["id"]]):
                return f"id {r['id']}: score {r['score']} vs {cpu_score[r['id']]}"
        elif kth is None or not close(r["score"], kth):
            return f"id {r['id']} (score {r['score']}) is not in the CPU's top-{k}"
    for r in cpu:
        if r["id"] not in gpu_score and (kth is None or not close(r["score"], kth)):
            return f"id {r['id']} (CPU score {r['score']}) is missing from the GPU's top-{k}"
    return None


def check_compare():
    """compare() itself, on made-up answers: it must pass the good ones and catch each fault."""
    def res(*pairs):
        return [{"id": i, "score": s} for i, s in pairs]
    cpu = res((1, 3.0), (2, 2.0), (4, 1.0), (5, 1.0), (9, 0.5))
    cases = [  # (what, GPU's answer, CPU's answer, k, None to pass or the words of the failure)
        ("the same answer", res((1, 3.0), (2, 2.0), (4, 1.0), (5, 1.0), (9, 0.5)), cpu, 5, None),
        ("a swap at the K-th score", res((1, 3.0), (2, 2.0), (4, 1.0), (5, 1.0), (7, 0.5004)), cpu, 5, None),
        ("tied scores, higher id first", res((1, 3.0), (2, 2.0), (5, 1.0), (4, 1.0), (9, 0.5)), cpu, 5, "GPU: out of order"),
        ("scores out of order", res((2, 2.0), (1, 3.0), (4, 1.0), (5, 1.0), (9, 0.5)), cpu, 5, "GPU: out of order"),
        ("a duplicate id", res((1, 3.0), (1, 3.0), (4, 1.0), (5, 1.0), (9, 0.5)), cpu, 5, "twice"),
        ("the CPU's answer out of order", cpu, res((2, 2.0), (1, 3.0), (4, 1.0), (5, 1.0), (9, 0.5)), 5, "CPU: out of order"),
        ("a CPU id far from the K-th score missing, an extra one at it",
         res((1, 3.0), (4, 1.0), (5, 1.0), (7, 0.5), (9, 0.5)), cpu, 5, "id 2 (CPU score 2.0) is missing"),
        ("an extra id far from the K-th score", res((1, 3.0), (2, 2.0), (8, 1.5), (4, 1.0), (5, 1.0)), cpu, 5, "id 8"),
        ("a score off", res((1, 3.0), (2, 2.1), (4, 1.0), (5, 1.0), (9, 0.5)), cpu, 5, "id 2: score"),
        ("a swap when fewer than K came back", res((1, 3.0), (2, 2.0), (4, 1.0), (5, 1.0), (7, 0.5)), cpu, 6, "id 7"),
        ("more than K", cpu, cpu, 4, "results for k 4"),
    ]
    for what, gpu_answer, cpu_answer, k, failure in cases:
        problem = compare(gpu_answer, cpu_answer, k)
        if (problem is None) != (failure is None) or (failure and failure not in problem):
            sys.exit(f"FAIL: compare() on {what}: {problem or 'accepted'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--ads", type=int, default=200000)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--first", default="gpu", choices=["gpu", "cpu"], help="cpu: try the script without a GPU")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "int8", "int8_group32"])
    ap.add_argument("--port", type=int, default=18181, help="the first server's; the second takes the next")
    ap.add_argument("--via-file", help="the first server saves its pool here, the second loads it")
    args = ap.parse_args()
    check_compare()
    saving = ("--save-ads", args.via_file) if args.via_file else ()
    loading = ("--ads-file", args.via_file) if args.via_file else ()
    gpu_proc, gpu, _ = start(args.binary, args.first, args.port, args.ads, args.seed, args.dtype, saving)
    # The second server starts once the first serves, so the file is whole by then.
    cpu_proc, cpu, line = start(args.binary, "cpu", args.port + 1, 0 if args.via_file else args.ads, args.seed,
                                args.dtype, loading)
    if args.via_file and f"serving {args.ads} ads" not in line:
        gpu_proc.kill()
        cpu_proc.kill()
        sys.exit(f"FAIL: the server loading {args.via_file} did not load {args.ads} ads: {line!r}")
    try:
        rng = random.Random(args.seed)

        def random_request():
            return {"features": [rng.gauss(0, 1) for _ in range(256)],
                    "query": [{"category": c, "values": [rng.randrange(2)]} for c in range(32) if rng.random() < 0.7],
                    "k": rng.choice([1, 10, 100, 1000, 4096]), "routing": rng.choice([1, 2, 8])}

        for i in range(args.requests):
            request = random_request()
            k = request["k"]
            t = time.perf_counter()
            a = post(gpu + "/search", request)["results"]
            gpu_ms = (time.perf_counter() - t) * 1e3
            b = post(cpu + "/search", request)["results"]
            problem = compare(a, b, k)
            print(f"request {i}: k {k}, {len(a)} results, {args.first.upper()} server answered in {gpu_ms:.1f} ms"
                  + (f": {problem}" if problem else ""), flush=True)
            if problem:
                sys.exit("FAIL: GPU and CPU servers disagree")
        batch = [random_request() for _ in range(8)]
        t = time.perf_counter()
        a = post(gpu + "/search_batch", {"requests": batch})["answers"]
        batch_ms = (time.perf_counter() - t) * 1e3
        b = post(cpu + "/search_batch", {"requests": batch})["answers"]
        if len(a) != len(batch) or len(b) != len(batch):
            sys.exit(f"FAIL: /search_batch answered {len(a)} and {len(b)} of {len(batch)} requests")
        for i, (request, x, y) in enumerate(zip(batch, a, b)):
            problem = compare(x["results"], y["results"], request["k"])
            if problem:
                sys.exit(f"FAIL: batch request {i}: GPU and CPU servers disagree: {problem}")
        print(f"batch of {len(batch)}: every answer agrees ({args.first.upper()} server: {batch_ms:.1f} ms)", flush=True)
        burst = [random_request() for _ in range(12)]
        answers = [None] * len(burst)

        def ask(i):
            answers[i] = post(gpu + "/search", burst[i])["results"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(burst))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for i, (request, answer) in enumerate(zip(burst, answers)):
            if answer is None:
                sys.exit(f"FAIL: search {i} of a burst got no answer")
            problem = compare(answer, post(cpu + "/search", request)["results"], request["k"])
            if problem:
                sys.exit(f"FAIL: search {i} of a burst: GPU and CPU servers disagree: {problem}")
        print(f"{len(burst)} searches at once: every answer agrees", flush=True)
        post_bad(gpu + "/search_batch", {"requests": [batch[0], dict(batch[1], k=0)]})
        for bad in [b"{not json", {"features": [1.0], "k": 10}, {"features": [0.0] * 256, "k": 5000},
                    {"features": [0.0] * 256, "query": [{"category": 99, "values": [0]}], "k": 10}]:
            reply = post_bad(gpu + "/search", bad)
            print(f"bad request -> 400: {reply}", flush=True)
        request = {"features": [0.5] * 256, "query": [], "k": 10}
        star = {"id": 4000000000, "embedding": [0.0] * 128, "bias": 1000.0, "clauses": [], "live": True}
        for url in (gpu, cpu):
            post(url + "/ads", {"ads": [star]})
            if post(url + "/search", request)["results"][0]["id"] != star["id"]:
                sys.exit(f"FAIL: {url}: an upserted ad with bias 1000 is not first")
            if post(url + "/expire", {"ids": [star["id"]]}).get("expired") != 1:
                sys.exit(f"FAIL: {url}: expire did not report one ad")
            if any(r["id"] == star["id"] for r in post(url + "/search", request)["results"]):
                sys.exit(f"FAIL: {url}: an expired ad still comes back")
        print("upsert then expire: seen first, then gone, on both servers")
        print("PASS")
    finally:
        gpu_proc.terminate()
        cpu_proc.terminate()


if __name__ == "__main__":
    main()
