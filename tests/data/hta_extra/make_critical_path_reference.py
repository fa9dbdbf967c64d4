"""Reference critical paths of HolisticTraceAnalysis 0.5.0 (``critical_path_analysis`` + ``summary``).

HTA 0.5.0's critical path needs pandas < 3 (with pandas 3.1 it fails: "Cannot specify both 'axis' and
'index'/'columns'"), so it runs in its own virtual environment (numpy 2.4.6 here; numpy 1.26 gives the
same files):

    python -m venv /tmp/hta3 && /tmp/hta3/bin/pip install HolisticTraceAnalysis==0.5.0 pandas==2.2.3
    /tmp/hta3/bin/python tests/data/hta_extra/make_critical_path_reference.py ROOT OUT NAME [NAME ...]

as run for the committed files (the 8-rank set made first by make_sets.py, into /tmp/built):

    make_critical_path_reference.py ../shared/data/traces tests/data/hta_extra hta_sampled_2rank \
        hta_alexnet_single_rank hta_ns_resolution_single_rank hta_nccl_data edge_cases/hta_amd_mi250_rocm \
        edge_cases/kineto_tb_plugin_resnet50 edge_cases/hta_cpu_only_gloo
    make_critical_path_reference.py /tmp/built tests/data/hta_extra/built sampled_8rank_skewed
    make_critical_path_reference.py tests/data/hta_extra/crafted tests/data/hta_extra sync_2stream
    make_critical_path_reference.py tests/data/traces_hta_repo tests/data/hta_extra/hta_repo cuda_event_sync \
        cuda_event_sync_multi_stream triton_example

For each set ROOT/NAME it writes OUT/NAME/critical_path.json: per rank and window (annotation "ProfilerStep",
instances 0 and 1 when there are two; the whole trace when the trace has no ProfilerStep), HTA's
summary (percent of the path per bound), the path's total duration (us) and edge count, or HTA's error.
"""
import json
import os
import sys
import time
import traceback


def one(a, rank, annotation, instance):
    t0 = time.perf_counter()
    try:
        res = a.critical_path_analysis(rank=rank, annotation=annotation, instance_id=instance)
        if res is None:
            raise RuntimeError("HTA returned None")
        g, ok = res
        if not ok:
            raise RuntimeError("HTA: critical path failed")
        edf = g.get_critical_path_breakdown()
        summary = (edf.groupby("bound_by").duration.sum() / edf.duration.sum() * 100).to_dict()
        return {"rank": rank, "annotation": annotation, "instance": instance,
                "summary_pct": {k: float(v) for k, v in summary.items() if k},
                "length_us": float(edf.duration.sum()), "edges": int(len(edf)),
                "wall_s": round(time.perf_counter() - t0, 3), "error": None}
    except Exception as exc:  # HTA's own failure is the reference there
        traceback.print_exc()
        return {"rank": rank, "annotation": annotation, "instance": instance,
                "error": f"{exc.__class__.__name__}: {exc}".splitlines()[0][:300],
                "wall_s": round(time.perf_counter() - t0, 3)}


def main() -> None:
    import hta
    import networkx
    import numpy
    import pandas
    from hta.trace_analysis import TraceAnalysis
    root, out = sys.argv[1], sys.argv[2]
    for name in sys.argv[3:]:
        d = os.path.join(root, name)
        a = TraceAnalysis(trace_dir=d)
        results = []
        for rank in sorted(a.t.traces):
            df = a.t.get_trace(rank)
            sym = a.t.symbol_table.get_sym_id_map()
            ids = [v for k, v in sym.items() if "ProfilerStep" in k]
            n = int(df.name.isin(ids).sum()) if ids else 0
            if n == 0:
                results.append(one(a, rank, "", None))
            for k in range(min(n, 2)):
                results.append(one(a, rank, "ProfilerStep", k))
        dest = os.path.join(out, name)
        os.makedirs(dest, exist_ok=True)
        with open(os.path.join(dest, "critical_path.json"), "w") as fh:
            json.dump({"trace_set": name, "results": results,
                       "versions": {"hta": hta.__version__ if hasattr(hta, "__version__") else "0.5.0",
                                    "pandas": pandas.__version__, "numpy": numpy.__version__,
                                    "networkx": networkx.__version__},
                       "command": "python make_critical_path_reference.py " + " ".join(sys.argv[1:])},
                      fh, indent=1)


if __name__ == "__main__":
    main()
