"""Build derived multi-rank trace sets from the shared ones, deterministically (no randomness).

    python tests/data/hta_extra/make_sets.py ../shared/data/traces OUT

``OUT/sampled_8rank_skewed``: 8 ranks made from the two ranks of hta_sampled_2rank (rank r from
rank r % 2, rank relabelled); on rank r every ``ncclKernel*`` event starts ``SHIFT_US[r]`` later
and lasts ``1 + 0.1 * (r % 3)`` times as long, so collectives start late on some ranks and their
durations differ across ranks, which is what potential-straggler detection looks at.
"""
import gzip
import json
import os
import sys

SHIFT_US = [0, 40, 310, 20, 0, 150, 75, 5]


def skewed(src: str, out: str) -> str:
    d = os.path.join(src, "hta_sampled_2rank")
    files = sorted(os.path.join(d, f) for f in os.listdir(d))
    docs = [json.load(gzip.open(f, "rt")) for f in files]
    os.makedirs(out, exist_ok=True)
    for r, shift in enumerate(SHIFT_US):
        doc = json.loads(json.dumps(docs[r % 2]))
        doc.setdefault("distributedInfo", {})["rank"] = r
        for e in doc["traceEvents"]:
            if isinstance(e, dict) and str(e.get("name", "")).startswith("ncclKernel") and "dur" in e:
                e["ts"] = e["ts"] + shift
                e["dur"] = round(e["dur"] * (1 + 0.1 * (r % 3)))
        with gzip.open(os.path.join(out, f"rank{r}.json.gz"), "wt", compresslevel=1) as fh:
            json.dump(doc, fh)
    return out


if __name__ == "__main__":
    print(skewed(sys.argv[1], os.path.join(sys.argv[2], "sampled_8rank_skewed")))
