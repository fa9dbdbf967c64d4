"""The GEMM-alignment and queue-drain findings on real PyTorch profiler traces of a CUDA GPU (marker
``gpu``; skipped without one): a bf16 language-model head over a vocabulary of 50,257 (misaligned) and
50,304 (padded), and a loop that calls ``.item()`` on the loss every step."""
import pytest

torch = pytest.importorskip("torch")

from otel_gpu.trace.analyze import analyze  # noqa: E402
from otel_gpu.trace.model import load_set  # noqa: E402

pytestmark = pytest.mark.gpu


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: these checks need real GPU kernels")


def _profile(out_dir, step, steps: int = 5):
    """Run ``step`` under the profiler (record_shapes) for ``steps`` steps after a warm-up; one trace file."""
    from torch.profiler import ProfilerActivity, profile, schedule
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=steps),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out_dir / "rank0.json"))) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    torch.cuda.synchronize()


def _lm_head_step(vocab: int):
    torch.manual_seed(0)
    head = torch.nn.Linear(768, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        head(x).float().mean().backward()
    return step


@pytest.mark.parametrize("vocab,misaligned", [(50257, True), (50304, False)])
def test_lm_head_alignment(tmp_path, vocab, misaligned):
    _cuda()
    _profile(tmp_path, _lm_head_step(vocab))
    doc = analyze(load_set(str(tmp_path)))
    (check,) = [c for c in doc["checks"] if c["pattern"] == "gemm_misaligned"]
    found = {f["pattern"]: f for f in doc["findings"]}
    if misaligned:
        assert check["value"] > 0, check
        f = found["gemm_misaligned"]
        assert 50257 in f["where"].get("misaligned_dims", []), f["where"]
    else:
        assert "gemm_misaligned" not in found and check["value"] == 0, check


def test_item_every_step_drains_the_queue(tmp_path):
    _cuda()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    host = torch.randn(4096, 4096).to(torch.bfloat16)  # pageable: the copy blocks the host

    def step():
        h = x + host.to("cuda")
        for layer in layers:
            h = layer(h)
        h.float().mean().item()  # the sync at the end of every step
    _profile(tmp_path, step)
    doc = analyze(load_set(str(tmp_path)))
    found = {f["pattern"]: f for f in doc["findings"]}
    assert "queue_drain_sync" in found, [c for c in doc["checks"] if c["pattern"] == "queue_drain_sync"]
    assert found["queue_drain_sync"]["where"]["ops"][0][0] == "aten::_local_scalar_dense"
    assert "many_short_kernels" not in found  # 8 GEMMs of 4096^3 a step: the GPU is busy, not launch-bound
